"""`colibri pack` before it converts anything: a packing that does not fit the board fails at once, naming the
sizes and what does fit (each suggestion packs); the planned image is the written one, byte for byte; a progress
bar on a terminal only; bad input is one line on stderr and exit status 2, never a traceback; Ctrl-C leaves no
partial image."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest

from conftest import ROOT
from test_pack import write_mixtral
from colibri import pack as pack_cli
from colibri.checkpoint import load_checkpoint
from colibri.image import KV_DTYPES, arena_bytes, open_image, write_image
from colibri.lazy import FileTensor
from colibri.pack import convert_tensors
from colibri.quant import DType
from colibri.sim.boards import Board
from colibri.text import checkpoint_meta

DEMO = ROOT / "models" / "demo-adder"  # carries a tokenizer: its image has a metadata section
GGUF = ROOT / "tests" / "fixtures" / "gguf" / "converted-lfm2-q8_0.gguf"


@pytest.mark.parametrize("source,dtype,align,pinned", [
    ("demo", DType.F32, 64, frozenset()),
    ("demo", DType.Q4_0, 4096, frozenset({(0, 1), (1, 3)})),
    ("tied", DType.Q8_0, 64, frozenset()),
    ("tied", DType.F16, 128, frozenset({(2, 4)})),
    ("gguf", DType.Q8_0, 64, frozenset()),
])
def test_the_planned_image_is_the_written_image(checkpoints, tmp_path, source, dtype, align, pinned):
    """The fit check sizes the image from the plan write_image follows: its size and resident part are the
    written file's, for every dtype, expert alignment, pinning, tied embedding and metadata section."""
    from colibri.writer import plan_image
    src = {"demo": DEMO, "tied": checkpoints["top3_gqa4_tied"], "gguf": GGUF}[source]
    ckpt = load_checkpoint(src, 24)
    tensors, meta = convert_tensors(ckpt.tensors, dtype, []), checkpoint_meta(src)
    plan = plan_image(ckpt.dims, tensors, align, pinned, meta)
    written = write_image(tmp_path / "m.img", ckpt.dims, tensors, align, pinned, meta)
    assert plan.image_bytes == written == (tmp_path / "m.img").stat().st_size
    assert plan.resident_bytes == open_image(tmp_path / "m.img", check_crcs=False).resident_bytes


def test_dims_for_another_max_seq_are_the_mapped_ones(checkpoints, tmp_path):
    """The fit advisor sizes arenas for other max_seq values from the config alone: as mapping the checkpoint again
    gives them, a sliding window (dropped once max_seq is within it) and a GGUF file's included."""
    from conftest import CONFIGS, make_checkpoint
    windowed = make_checkpoint(CONFIGS[0], tmp_path / "windowed", sliding_window=20)
    for src in (checkpoints["base"], windowed, GGUF):
        ckpt = load_checkpoint(src, 64)
        for max_seq in (1, 8, 20, 21, 48, 64):
            assert ckpt.dims_at(max_seq) == load_checkpoint(src, max_seq).dims, (src, max_seq)


def board_of(monkeypatch, image: int, arena: int) -> str:
    """cortex_m4, given an image region of `image` bytes and an arena of `arena` for this test."""
    board = Board("cortex_m4", {"memory": {"image": {"origin": 0, "bytes": image},
                                           "arena": {"origin": 0, "bytes": arena}}})
    monkeypatch.setattr(pack_cli, "load_board", lambda name: board)
    return board.name


def nothing_read(monkeypatch) -> None:
    """Reading any checkpoint tensor fails the test: the fit check must not convert anything."""
    def refuse(self):
        raise AssertionError(f"a tensor of {self.file.path} was read before the fit check failed")
    monkeypatch.setattr(FileTensor, "load", refuse)
    monkeypatch.setattr(FileTensor, "expert", lambda self, index: refuse(self))


def packed_size(src: Path, out: Path, *args: str) -> int:
    assert pack_cli.main([str(src), "-o", str(out), "--no-quality", *args]) == 0
    return out.stat().st_size


def advice(err: str) -> tuple[str, list[str]]:
    """(the error's first line, the option sets its second line names)."""
    lines = err.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in err, err
    return lines[0], re.findall(r"`([^`]*)`", lines[1])


def arena_at(src: Path, max_seq: int, kv: str = "f32") -> int:
    return arena_bytes(replace(load_checkpoint(src, max_seq).dims, kv_dtype=KV_DTYPES[kv]))


def test_an_arena_too_small_names_the_largest_max_seq_and_kv_f16(checkpoints, tmp_path, monkeypatch, capsys):
    src, out = checkpoints["base"], tmp_path / "m.img"
    cap = arena_at(src, 40)
    largest = max(s for s in range(1, 129) if arena_at(src, s) <= cap)
    largest_f16 = max(s for s in range(1, 129) if arena_at(src, s, "f16") <= cap)
    board = board_of(monkeypatch, 10 << 20, cap)
    with monkeypatch.context() as m:
        nothing_read(m)
        assert pack_cli.main([str(src), "-o", str(out), "--max-seq", "128", "--board", board]) == 2
    first, suggested = advice(capsys.readouterr().err)
    assert f"{arena_at(src, 128):,}" in first and f"{cap:,}" in first and "arena" in first and "image" in first
    assert suggested == [f"--max-seq {largest}", f"--max-seq {largest_f16} --kv f16"]
    assert not out.exists() and not out.with_name("m.img.part").exists()
    for flags in suggested:  # each suggestion packs for that board
        assert pack_cli.main([str(src), "-o", str(out), "--max-seq", "128", "--board", board, *flags.split()]) == 0
    capsys.readouterr()


def test_kv_f16_alone_when_it_is_enough(checkpoints, tmp_path, monkeypatch, capsys):
    src, out = checkpoints["base"], tmp_path / "m.img"
    board = board_of(monkeypatch, 10 << 20, arena_at(src, 64, "f16"))
    assert pack_cli.main([str(src), "-o", str(out), "--max-seq", "64", "--board", board]) == 2
    _, suggested = advice(capsys.readouterr().err)
    assert suggested == [f"--max-seq {max(s for s in range(1, 65) if arena_at(src, s) <= arena_at(src, 64, 'f16'))}",
                         "--kv f16"]


def test_an_image_too_large_names_the_widest_dtype_that_fits(tmp_path, monkeypatch, capsys):
    src, out = DEMO, tmp_path / "m.img"
    sizes = {d: packed_size(src, tmp_path / f"{d}.img", "--max-seq", "16", "--dtype", d)
             for d in ("f16", "q8_0", "q4_0")}
    board = board_of(monkeypatch, (sizes["q8_0"] + sizes["f16"]) // 2, 1 << 20)
    with monkeypatch.context() as m:
        nothing_read(m)
        assert pack_cli.main([str(src), "-o", str(out), "--max-seq", "16", "--board", board]) == 2
    first, suggested = advice(capsys.readouterr().err)
    assert "image" in first and f"{(sizes['q8_0'] + sizes['f16']) // 2:,}" in first
    assert suggested == ["--dtype q8_0"]
    assert pack_cli.main([str(src), "-o", str(out), "--max-seq", "16", "--board", board, "--dtype", "q8_0"]) == 0


def test_both_too_large_name_one_change_that_fits_both(tmp_path, monkeypatch, capsys):
    src, out = DEMO, tmp_path / "m.img"
    q4 = packed_size(src, tmp_path / "q4.img", "--max-seq", "16", "--dtype", "q4_0")
    board = board_of(monkeypatch, q4 + 64, arena_at(src, 12))
    assert pack_cli.main([str(src), "-o", str(out), "--max-seq", "16", "--board", board]) == 2
    _, suggested = advice(capsys.readouterr().err)
    assert suggested == ["--dtype q4_0 --max-seq 12", "--dtype q4_0 --kv f16"]
    for flags in suggested:
        assert pack_cli.main([str(src), "-o", str(out), "--max-seq", "16", "--board", board, *flags.split()]) == 0


@pytest.mark.parametrize("short", ["image", "arena"])
def test_nothing_fits_says_what_is_too_large_at_the_least(tmp_path, monkeypatch, capsys, short):
    src, out = DEMO, tmp_path / "m.img"
    q4 = packed_size(src, tmp_path / "q4.img", "--max-seq", "16", "--dtype", "q4_0")
    least_arena = arena_at(src, 1, "f16")
    board = board_of(monkeypatch, q4 - 1 if short == "image" else 1 << 30,
                     least_arena - 1 if short == "arena" else 1 << 30)
    assert pack_cli.main([str(src), "-o", str(out), "--max-seq", "16", "--board", board]) == 2
    err = capsys.readouterr().err
    first, named = advice(err)
    assert "nothing" in err.splitlines()[1]
    if short == "image":
        assert named == ["--dtype q4_0"] and f"{q4:,}" in err
    else:
        assert named == ["--max-seq 1 --kv f16"] and f"{least_arena:,}" in err


def test_a_gguf_vocabulary_is_not_converted_to_say_an_image_is_too_large(tmp_path, monkeypatch, capsys):
    """transformers takes seconds to convert a GGUF file's vocabulary into the image's tokenizer: when the rest of
    the image is too large already, the error says so without it, the image's size as a bound."""
    def refuse(src):
        raise AssertionError("the vocabulary was converted")
    board = board_of(monkeypatch, 100_000, 1 << 30)
    monkeypatch.setattr(pack_cli, "checkpoint_meta", refuse)
    assert pack_cli.main([str(GGUF), "-o", str(tmp_path / "m.img"), "--max-seq", "16", "--board", board]) == 2
    first, named = advice(capsys.readouterr().err)
    assert "the image at least " in first and named == ["--dtype q4_0"]


def test_a_fitting_packing_keeps_its_fit_report(checkpoints, tmp_path, capsys):
    assert pack_cli.main([str(checkpoints["base"]), "-o", str(tmp_path / "m.img"), "--board", "cortex_m55"]) == 0
    out = capsys.readouterr().out
    assert "cortex_m55 image [" in out and "cortex_m55 arena [" in out


def colibri_pack(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "colibri.cli", "pack", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, **kwargs)


def demo_copy(tmp: Path) -> Path:
    return Path(shutil.copytree(DEMO, tmp / "ckpt"))


def cut_to(path: Path, keep: int) -> Path:
    path.write_bytes(path.read_bytes()[:keep])
    return path


def replaced(path: Path, text: str | None = None, folder: bool = False) -> Path:
    """`path` rewritten with `text`, or made a folder."""
    path.unlink()
    if folder:
        path.mkdir()
    else:
        path.write_text(text)
    return path


def safetensors_cut_in_half(t: Path) -> tuple[Path, str]:
    shard = demo_copy(t) / "model.safetensors"
    return cut_to(shard, shard.stat().st_size // 2).parent, shard.name


def safetensors_of_20_bytes(t: Path) -> tuple[Path, str]:
    return cut_to(demo_copy(t) / "model.safetensors", 20).parent, "model.safetensors"


def config_not_json(t: Path) -> tuple[Path, str]:
    return replaced(demo_copy(t) / "config.json", "{not json").parent, "config.json"


def config_of_the_wrong_type(t: Path) -> tuple[Path, str]:
    config = (DEMO / "config.json").read_text().replace('"hidden_size": 64', '"hidden_size": null')
    return replaced(demo_copy(t) / "config.json", config).parent, "config.json"


def config_a_folder(t: Path) -> tuple[Path, str]:
    return replaced(demo_copy(t) / "config.json", folder=True).parent, "config.json"


def safetensors_a_folder(t: Path) -> tuple[Path, str]:
    return replaced(demo_copy(t) / "model.safetensors", folder=True).parent, "model.safetensors"


def shard_index(text: str) -> Callable[[Path], tuple[Path, str]]:
    def broken(t: Path) -> tuple[Path, str]:
        ckpt = demo_copy(t)
        (ckpt / "model.safetensors.index.json").write_text(text)
        return ckpt, "model-00002-of-00002.safetensors" if "model-00002" in text else "model.safetensors.index.json"
    return broken


def tokenizer_not_json(t: Path) -> tuple[Path, str]:
    return replaced(demo_copy(t) / "tokenizer.json", "{").parent, "tokenizer.json"


def folder_without_config(t: Path) -> tuple[Path, str]:
    ckpt = demo_copy(t)
    (ckpt / "config.json").unlink()
    return ckpt, "config.json"


def no_such_path(t: Path) -> tuple[Path, str]:
    return t / "nowhere", "nowhere"


def gguf_cut_to(keep: int) -> Callable[[Path], tuple[Path, str]]:
    return lambda t: (cut_to(Path(shutil.copy(GGUF, t / "model.gguf")), keep), "model.gguf")


def not_gguf(t: Path) -> tuple[Path, str]:
    (t / "model.gguf").write_text("hello")
    return t / "model.gguf", "model.gguf"


# a case -> what breaks a checkpoint in a temporary folder, giving (what to pack, what the error must name)
BAD_INPUTS: dict[str, Callable[[Path], tuple[Path, str]]] = {
    "safetensors cut in half": safetensors_cut_in_half,
    "safetensors of 20 bytes": safetensors_of_20_bytes,
    "config.json not JSON": config_not_json,
    "config.json of the wrong type": config_of_the_wrong_type,
    "config.json a folder": config_a_folder,
    "safetensors a folder": safetensors_a_folder,
    "shard index not JSON": shard_index("{"),
    "shard index without a weight map": shard_index("{}"),
    "shard index naming a missing shard":
        shard_index('{"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}'),
    "tokenizer.json not JSON": tokenizer_not_json,
    "folder without config.json": folder_without_config,
    "no such path": no_such_path,
    "GGUF cut in its header": gguf_cut_to(35_207),
    "GGUF cut in its tensors": gguf_cut_to(GGUF.stat().st_size - 100),
    "not GGUF": not_gguf,
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_and_status_2(tmp_path, case):
    src, names = BAD_INPUTS[case](tmp_path)
    out = tmp_path / "m.img"
    run = colibri_pack(str(src), "-o", str(out), "--max-seq", "16")
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("colibri pack: error: ") and run.stderr.count("\n") == 1, run.stderr
    assert "Traceback" not in run.stderr and names in run.stderr, run.stderr
    assert not out.exists() and not out.with_name("m.img.part").exists()


def test_an_unwritable_output_or_unreadable_input_is_one_line(tmp_path):
    run = colibri_pack(str(DEMO), "-o", str(tmp_path / "no" / "such" / "m.img"), "--max-seq", "16")
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "m.img" in run.stderr, run.stderr
    assert "cannot write" in run.stderr and "Traceback" not in run.stderr
    if os.geteuid() == 0:
        pytest.skip("root reads a file whatever its permissions")
    ckpt = demo_copy(tmp_path)
    (ckpt / "model.safetensors").chmod(0)
    run = colibri_pack(str(ckpt), "-o", str(tmp_path / "m.img"), "--max-seq", "16")
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "model.safetensors" in run.stderr, run.stderr


def test_ctrl_c_while_writing_leaves_no_image(tmp_path):
    ckpt = write_mixtral(tmp_path / "ckpt", vocab=512, hidden=512, ffn=512, layers=2, experts=8, shards=1)
    out = tmp_path / "m.img"
    part = out.with_name("m.img.part")
    proc = subprocess.Popen([sys.executable, "-m", "colibri.cli", "pack", str(ckpt), "-o", str(out), "--dtype", "q4_0",
                             "--no-quality"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not part.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert part.exists(), "the image was never being written"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "colibri pack: interrupted", err
    assert not out.exists() and not part.exists()


def on_a_terminal(*args: str) -> str:
    """What `colibri pack ARGS` writes on stderr when stderr is a terminal (of 100 columns: tqdm draws nothing
    in none)."""
    import fcntl
    import pty
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "colibri.cli", "pack", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the terminal's other end closed: the command ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=300) == 0
    return b"".join(chunks).decode(errors="replace")


def test_progress_bars_on_a_terminal_only(tmp_path):
    args = (str(DEMO), "-o", str(tmp_path / "m.img"), "--max-seq", "16", "--dtype", "q8_0")
    shown = on_a_terminal(*args)
    assert "writing" in shown and "quality" in shown and "%|" in shown, shown
    run = colibri_pack(*args)
    assert run.returncode == 0 and run.stderr == ""


def test_help_shows_the_command_and_every_family(capsys):
    with pytest.raises(SystemExit):
        pack_cli.main(["--help"])
    shown = capsys.readouterr().out
    first = pack_cli.__doc__.split("\n\n")[0]  # the first sentence
    for family in ("Mixtral", "Qwen3-MoE", "OLMoE", "DeepSeek-V2/V3", "gpt-oss", "Gemma 4", "Granite MoE",
                   "GLM-4.7-Flash", "Qwen3.5-MoE", "LFM2", "LFM2-MoE", "Llama"):
        assert family in first, family
    assert "  colibri pack " in shown and shown.count("host/pack.py") == 1
