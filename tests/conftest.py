"""Shared fixtures: the hosted build, tiny random Mixtral checkpoints made with transformers, images."""
from __future__ import annotations

import fcntl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
GATE_FILE = ROOT / "tools" / "size_gate.json"  # the runtime size limits per board
sys.path.insert(0, str(ROOT))

from colibri.build import BUILD_LOCK, firmware_targets  # noqa: E402
from colibri.pack import pack  # noqa: E402
from colibri.sim.boards import board_names, load_board, rtos_kernel_problem, rtos_names  # noqa: E402


@dataclass(frozen=True)
class TinyConfig:
    """A small random Mixtral; the shapes are chosen odd on purpose."""
    name: str
    vocab: int
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    experts: int
    top_k: int
    head_dim: int | None = None
    tie: bool = False
    seed: int = 0


CONFIGS = [
    # head_dim 6 (not a power of two), GQA 2:1, top-2
    TinyConfig("base", vocab=37, hidden=24, ffn=20, layers=2, heads=4, kv_heads=2, experts=4, top_k=2, seed=1),
    # hidden 30 and vocab 51 not multiples of 8, MHA (GQA ratio 1), top-1
    TinyConfig("top1_mha", vocab=51, hidden=30, ffn=13, layers=1, heads=3, kv_heads=3, experts=3, top_k=1, seed=2),
    # explicit head_dim 8 != hidden/heads, GQA 4:1, top-3, tied embeddings
    TinyConfig("top3_gqa4_tied", vocab=67, hidden=20, ffn=17, layers=3, heads=4, kv_heads=1, experts=5, top_k=3,
               head_dim=8, tie=True, seed=3),
]


# Rows long enough for every kernel's main loop (264 = 8 Q8_0 blocks + 8, and 16 float lanes x 16 + 8),
# with tails everywhere (head_dim 66, expert size 72, vocab 97): the dtype tests run it on every board.
WIDE = TinyConfig("wide", vocab=97, hidden=264, ffn=72, layers=2, heads=4, kv_heads=2, experts=4, top_k=2, seed=4)


def make_checkpoint(cfg: TinyConfig, out: Path, max_shard_size: str | None = None, **overrides) -> Path:
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(cfg.seed)
    kwargs = dict(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.ffn,
                  num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
                  num_local_experts=cfg.experts, num_experts_per_tok=cfg.top_k, max_position_embeddings=128,
                  tie_word_embeddings=cfg.tie, initializer_range=0.25, rms_norm_eps=1e-5)
    if cfg.head_dim:
        kwargs["head_dim"] = cfg.head_dim
    kwargs.update(overrides)
    model = MixtralForCausalLM(MixtralConfig(**kwargs)).eval()
    with torch.no_grad():  # random norm weights too, so a mixed-up norm tensor cannot go unnoticed
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    save_kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **save_kwargs)
    return out


def _every_model_board() -> list[str]:
    """Every board folder (boards/*/board.toml); "board@asan" is a board built by the host's compiler again under
    ASan + UBSan; "board@freertos" the board's firmware as FreeRTOS tasks (its board.toml's [rtos.freertos],
    docs/RTOS.md), whether or not its kernel is here."""
    out = []
    for name in board_names():
        spec = load_board(name).spec
        out += [name, f"{name}@asan"] if spec["toolchain"] == "host" else [name]
        out += [f"{name}@{rtos}" for rtos in rtos_names(spec)]
    return out


def _rtos_problem(run: str) -> str | None:
    """Why an RTOS build ("cortex_m55@freertos") cannot be made here (no kernel), in one line; else None."""
    board, _, how = run.partition("@")
    return rtos_kernel_problem(how) if how in rtos_names(load_board(board).spec) else None


# Every board that runs models, found by its folder, that can be built here (an RTOS build needs its kernel:
# FREERTOS_KERNEL_PATH): the boards a test that runs every board in one go runs.
MODEL_BOARDS = [b for b in _every_model_board() if not _rtos_problem(b)]
# Every RTOS build of a board ("cortex_m55@freertos"), whether or not its kernel is here
RTOS_BOARDS = [f"{name}@{rtos}" for name in board_names() for rtos in rtos_names(load_board(name).spec)]
# The boards that are an operating-system process (the protocol on stdin/stdout, the image a file)
OS_BOARDS = [b for b in MODEL_BOARDS if "@" not in b and load_board(b).spec["link"] == "stdio"]
RELEASE_BOARDS = [b for b in MODEL_BOARDS if "@" not in b]


def run_param(run: str):
    """A MODEL_BOARDS-style entry to parametrize a test with: an RTOS build whose kernel is not here is kept, skipped
    with the one line that says what to set, so it never silently disappears from a test's list."""
    problem = _rtos_problem(run)
    return pytest.param(run, marks=pytest.mark.skip(reason=problem)) if problem else run


def with_rtos(boards: list[str]) -> list:
    """`boards`, each followed by its RTOS builds ("cortex_m55@freertos"): every model test that runs on a bare board
    runs on its RTOS builds too, logits byte-identical (issue 32); skipped with the reason where the kernel is not
    here."""
    out = []
    for board in boards:
        out.append(board)
        if "@" not in board:
            out += [run_param(f"{board}@{rtos}") for rtos in rtos_names(load_board(board).spec)]
    return out


# Each model test parametrized by board runs on each of these (MODEL_BOARDS, and the RTOS builds that cannot be made
# here, skipped saying why).
MODEL_RUNS = [run_param(b) for b in _every_model_board()]
# For a test that runs every board in one go: one entry running MODEL_BOARDS, then each RTOS build it leaves out,
# skipped saying why (the test body ignores the value when it is None).
EVERY_BOARD = [pytest.param(MODEL_BOARDS, id="every-board")] + [
    pytest.param(None, id=b, marks=pytest.mark.skip(reason=_rtos_problem(b)))
    for b in _every_model_board() if _rtos_problem(b)]


def board_name(run: str) -> str:
    """The board of a MODEL_BOARDS entry ("hosted@asan" -> "hosted")."""
    return run.split("@")[0]


def build(board: str, mode: str = "release", kernels: str = "auto", lean: bool = False, rtos: str = "none") -> Path:
    """scons for one target, one build at a time across the test processes (pytest-xdist's workers share build/;
    the second to ask finds it up to date)."""
    (ROOT / "build").mkdir(exist_ok=True)
    with open(ROOT / "build" / BUILD_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run([sys.executable, "-m", "SCons", "-Q", f"board={board}", f"mode={mode}", f"kernels={kernels}",
                        f"lean={'yes' if lean else 'no'}", f"rtos={rtos}"], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        out = ROOT / "build" / board / (mode + ("-scalar" if kernels == "scalar" else "") + ("-lean" if lean else "")
                                        + ("" if rtos == "none" else f"-{rtos}"))
        for target in firmware_targets(load_board(board), out):  # current now, as `colibri run` judges by time
            if target.exists():
                target.touch()
    return out


def build_run(run: str) -> Path:
    """The firmware of a MODEL_BOARDS entry, built: "hosted@asan" in mode asan, "cortex_m55@freertos" with
    rtos=freertos."""
    board, _, how = run.partition("@")
    if how and how in rtos_names(load_board(board).spec):
        return build(board, rtos=how) / ("firmware" + load_board(board).spec.get("program_suffix", ".elf"))
    build(board, how or "release")
    return load_board(board).firmware(how or "release")


def assert_bit_identical(device: np.ndarray, expected: np.ndarray, what: str = "logits") -> None:
    """The device's values against the numpy reference's, bit for bit (the reference computes what the runtime
    computes, in its order: docs/KERNELS.md); on failure, the first row that differs and by how much."""
    device, expected = np.asarray(device, np.float32), np.asarray(expected, np.float32)
    assert device.shape == expected.shape, f"{what}: shape {device.shape}, the reference's {expected.shape}"
    rows = device.reshape(-1, device.shape[-1]).view(np.uint32) != expected.reshape(-1, expected.shape[-1]).view(np.uint32)
    differ = np.flatnonzero(rows.any(axis=1))
    if differ.size:
        with np.errstate(invalid="ignore"):
            worst = float(np.max(np.abs(device - expected)))
        raise AssertionError(f"{what}: {differ.size} of {rows.shape[0]} rows differ from the reference, the first at "
                             f"row {int(differ[0])}; max |device - reference| = {worst:.3g}")


def make_family_checkpoint(arch: str, config: dict, seed: int, out: Path, max_positions: int = 128,
                           randomized: bool = True, portable: bool = False) -> Path:
    """A small random model of any supported family (`arch` is the HF class name), norms randomized too (or, with
    randomized False, as transformers initializes them: every norm weight exactly 1.0; or, `portable`, every value
    from numpy's generator: numpy_values)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model_cls = getattr(transformers, arch)
    text_configs = {"Gemma4ForCausalLM": "Gemma4TextConfig", "Qwen3_5MoeForCausalLM": "Qwen3_5MoeTextConfig"}
    config_cls = getattr(transformers, text_configs.get(arch, arch.replace("ForCausalLM", "Config")))
    model = model_cls(config_cls(initializer_range=0.25, max_position_embeddings=max_positions, **config)).eval()
    if portable:
        numpy_values(model, seed)
    elif randomized:
        randomize(model)
    model.save_pretrained(out)
    return out


def numpy_values(model, seed: int) -> None:
    """Every parameter (and the buffers randomize() sets) drawn from numpy's seeded generator, which gives the same
    values on every machine, as torch's initializers do not promise: the golden tests' checkpoints. Weights
    0.25 N(0, 1); norms and scales 1 + 0.3 N; biases 0.3 N; as randomize() for the buffers."""
    import torch
    rng = np.random.default_rng(seed)

    def draw(shape, scale: float, offset: float = 0.0):
        return torch.from_numpy((offset + scale * rng.standard_normal(tuple(shape))).astype(np.float32))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(("router.scale", "per_expert_scale")):  # around 1; a zero-centred
                p.copy_(draw(p.shape, 0.3, 1.0 if p.any() else 0.0))                     # norm (Qwen3.5) around 0
            elif name.endswith((".bias", "_bias")):
                p.copy_(draw(p.shape, 0.3))
            else:
                p.copy_(draw(p.shape, 0.25))
        for name, b in model.named_buffers():
            if name.endswith(("e_score_correction_bias", "feed_forward.expert_bias")):
                b.copy_(draw(b.shape, 0.5))
            elif name.endswith("layer_scalar"):
                b.copy_(torch.from_numpy((0.5 + rng.random(tuple(b.shape))).astype(np.float32)))


def randomize(model) -> None:
    """Norms, biases and the other scales transformers initializes to constants made random, so a test notices
    one that is dropped or misplaced."""
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # around 1, or a zero-centred norm (Qwen3.5's x · (1 + w)) around 0
                p.copy_((1.0 if p.any() else 0.0) + 0.3 * torch.randn_like(p))
            elif name.endswith((".bias", "_bias")):  # gpt-oss's experts' biases too
                p.copy_(0.3 * torch.randn_like(p))
            elif name.endswith(("router.scale", "per_expert_scale")):  # Gemma 4's router
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
        for name, b in model.named_buffers():  # DeepSeek-V3's and LFM2's router biases choose experts: make them matter
            if name.endswith(("e_score_correction_bias", "feed_forward.expert_bias")):
                b.copy_(0.5 * torch.randn_like(b))
            elif name.endswith("layer_scalar"):  # Gemma 4's scalar per layer
                b.copy_(0.5 + torch.rand_like(b))


@pytest.fixture(scope="session")
def hosted_build() -> Path:
    """Build the hosted board once per test session."""
    return build("hosted")


@pytest.fixture(scope="session")
def firmwares() -> dict[str, Path]:
    """Build every model board once per test session: board name -> firmware ELF."""
    return {run: build_run(run) for run in MODEL_BOARDS}


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("ckpt")
    return {c.name: make_checkpoint(c, base / c.name) for c in CONFIGS}


@pytest.fixture(scope="session")
def images(checkpoints, tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("img")
    out = {}
    for name, ckpt in checkpoints.items():
        out[name] = base / f"{name}.img"
        pack(ckpt, out[name], max_seq=48, expert_align=64)
    return out
