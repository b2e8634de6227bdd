"""Images run on a board through flash.py's code path, against the numpy reference."""
from __future__ import annotations

import json
import os
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from capi import Lib
from conftest import CONFIGS, EVERY_BOARD, MODEL_RUNS, OS_BOARDS, assert_bit_identical, board_name, with_rtos
from colibri import flash
from colibri.image import Role, read_image
from colibri.protocol import DeviceError, Sampling
from colibri.quant import DType
from colibri.reference import Reference

PROMPT = [1, 5, 9, 3]


@pytest.fixture(scope="module")
def firmware(hosted_build):
    return hosted_build / "firmware.elf"


@pytest.mark.parametrize("board", MODEL_RUNS)
@pytest.mark.parametrize("name", [c.name for c in CONFIGS])
def test_device_matches_reference(board, name, images, firmwares, hosted_build):
    image = images[name]
    result = flash.run_on_board(image, board_name(board), PROMPT, 16, Sampling(), want_logits=True, firmware=firmwares[board])
    ref = Reference(read_image(image.read_bytes()))
    assert result.tokens == ref.greedy(PROMPT, 16)
    expected = ref.forward(PROMPT + result.tokens)
    assert result.logits.shape == expected.shape == (len(PROMPT) + 16, ref.d.vocab_size)
    assert_bit_identical(result.logits, expected)
    assert result.stats["tokens_fed"] == len(PROMPT) + 16
    # the image's plan, plus on the hosted board its prefill batch region (colibri_prefill_bytes)
    per_token = Lib(hosted_build / "libcolibri.so").verify(image.read_bytes())[1].prefill_token_bytes
    assert result.stats["arena_bytes"] == (read_image(image.read_bytes()).header["arena_bytes"]
                                           + result.prefill_batch * per_token)
    assert result.stats["expert_calls"] == (len(PROMPT) + 16) * ref.d.n_layers * ref.d.top_k


@pytest.mark.parametrize("board", MODEL_RUNS)
def test_sampling_is_seeded(board, images, firmwares):
    def run(seed):
        return flash.run_on_board(images["base"], board_name(board), PROMPT, 20, Sampling(1.2, 0, 0.95, seed), False,
                                  firmware=firmwares[board]).tokens
    a, b, c = run(7), run(7), run(8)
    assert a == b
    assert a != c


@pytest.mark.parametrize("boards", EVERY_BOARD)
def test_boards_agree_bit_for_bit(boards, images, firmwares):
    """Scalar kernels, -ffp-contract=off: the same image, prompt and seed give the same bytes on every board."""
    runs = [flash.run_on_board(images["top3_gqa4_tied"], board_name(board), PROMPT, 12, Sampling(0.8, 0, 0.9, 5), True,
                               firmware=firmwares[board]) for board in boards]
    for other in runs[1:]:
        assert other.tokens == runs[0].tokens
        assert other.logits.tobytes() == runs[0].logits.tobytes()


@pytest.mark.parametrize("board", with_rtos(["x86_64_baremetal", "cortex_m4", "riscv64_virt"]))
def test_serial_upload_path(board, images, firmwares):
    """The image sent over the link in checksummed chunks, as to a real board without a loader (on a FreeRTOS build
    the link task reads them on the UART's receive interrupt and the inference task writes them)."""
    image = images["top3_gqa4_tied"]
    result = flash.run_on_board(image, board_name(board), PROMPT, 8, Sampling(), True, firmware=firmwares[board],
                                upload=True)
    assert result.upload_crc32 == zlib.crc32(image.read_bytes())
    ref = Reference(read_image(image.read_bytes()))
    assert result.tokens == ref.greedy(PROMPT, 8)
    assert_bit_identical(result.logits, ref.forward(PROMPT + result.tokens))


def test_flash_cli_verify_json_and_dump(images, firmware, tmp_path, capsys):
    dump = tmp_path / "logits.npy"
    code = flash.main([str(images["base"]), "--board", "hosted", "--firmware", str(firmware), "--prompt-tokens",
                       "1,5,9,3", "--max-new-tokens", "6", "--verify", "--dump-logits", str(dump), "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    report = json.loads(out[-1])
    assert code == 0
    assert report["verify"]["passed"] and report["verify"]["tokens_agree"] == 6
    assert len(report["tokens"]) == 6 and report["stats"]["tokens_fed"] == 10
    logits = np.load(dump)
    ref = Reference(read_image(images["base"].read_bytes())).forward(PROMPT + report["tokens"])
    assert_bit_identical(logits, ref)
    assert report["verify"]["rows_identical"] == report["verify"]["rows"] == 10 and report["verify"]["tolerance"] is None


def test_flash_cli_threads_and_timing(images, firmware, capsys):
    """--threads N on the hosted board: the same tokens as one thread, and --json reports the threads, the
    prefill batch and the timing (device-clock seconds for the prompt and the decode, host seconds to open).
    A board with one core refuses --threads with one line and exit status 2."""
    reports = []
    for threads in ("1", "2"):
        code = flash.main([str(images["top3_gqa4_tied"]), "--board", "hosted", "--firmware", str(firmware),
                           "--prompt-tokens", "1,5,9,3,7,2,8", "--max-new-tokens", "5", "--threads", threads, "--json"])
        assert code == 0
        reports.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    one, two = reports
    assert one["tokens"] == two["tokens"] and (one["threads"], two["threads"]) == (1, 2)
    assert two["prefill_batch"] > 1  # the 7-token prompt went through in one pass
    t = two["timing"]
    assert (t["prompt_tokens"], t["decode_tokens"]) == (7, 5)
    assert 0 < t["prompt_s"] < 60 and 0 < t["decode_s"] < 60 and 0 < t["open_s"] < 60
    assert t["decode_tok_s"] == pytest.approx(5 / t["decode_s"])
    with pytest.raises(SystemExit) as err:
        flash.main([str(images["base"]), "--board", "cortex_m4", "--prompt-tokens", "1", "--threads", "2"])
    assert err.value.code == 2
    assert "board cortex_m4 computes on one core; --threads needs a board with threads (hosted, hosted_windows)" in capsys.readouterr().err


def test_flash_cli_default_board_streams_and_verifies(images, firmwares, capsys):
    """No --board: the default x86_64 bare-metal board under QEMU, firmware from build/."""
    code = flash.main([str(images["base"]), "--prompt-tokens", "2,3", "--max-new-tokens", "4", "--verify"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("[x86_64_baremetal]")
    assert "greedy tokens agree 4/4: PASS" in out


@pytest.mark.parametrize("board", OS_BOARDS)
def test_errors_are_named(board, images, firmwares, tmp_path, capsys):
    """The same named errors from the Linux and the Windows program."""
    firmware = firmwares[board]
    vocab = read_image(images["base"].read_bytes()).dims.vocab_size
    with pytest.raises(DeviceError) as err:
        flash.run_on_board(images["base"], board, [1, vocab], 2, Sampling(), False, firmware=firmware)
    assert err.value.message == "token id out of range" and err.value.detail == 1
    with pytest.raises(ValueError, match="max_seq"):
        flash.run_on_board(images["base"], board, [1] * 40, 9, Sampling(), False, firmware=firmware)
    plan = read_image(images["base"].read_bytes()).header["arena_bytes"]
    with pytest.raises(DeviceError) as err:
        flash.run_on_board(images["base"], board, [1], 1, Sampling(), False, firmware=firmware,
                           board_args=["--arena-bytes", str(plan - 64)])
    assert err.value.message == "arena too small" and err.value.detail == plan
    clean = images["base"].read_bytes()
    resident = read_image(clean).resident_bytes
    for at, status, host_says in ((resident - 3, "COLIBRI_E_IMAGE_PAYLOAD_CRC", "payload CRC mismatch"),
                                  (len(clean) - 3, "COLIBRI_E_EXPERT_CRC", "block CRC mismatch")):
        corrupt = bytearray(clean)
        corrupt[at] ^= 1  # the last bytes of the resident part, then of the expert part
        (tmp_path / "corrupt.img").write_bytes(corrupt)
        with pytest.raises(DeviceError) as err:  # the device names it
            flash.run_on_board(tmp_path / "corrupt.img", board, [1], 1, Sampling(), False, firmware=firmware)
        assert status in str(err.value)
        code = flash.main([str(tmp_path / "corrupt.img"), "--board", board, "--firmware", str(firmware),
                           "--prompt-tokens", "1"])
        assert code == 2  # and flash.py refuses it before booting anything
        assert host_says in capsys.readouterr().err


def test_flash_over_a_serial_port(images, firmwares, capsys):
    """--port: the real-board path (pyserial, image uploaded over the link) against a board on a pty."""
    image = images["base"]
    master, slave = os.openpty()
    port = os.ttyname(slave)
    proc = subprocess.Popen([str(firmwares["hosted"]), "--upload-bytes", "1000000"], stdin=master, stdout=master)
    os.close(master)
    try:
        code = flash.main([str(image), "--port", port, "--baud", "115200", "--prompt-tokens", "1,5,9,3",
                           "--max-new-tokens", "5", "--verify", "--json"])
    finally:
        os.close(slave)
        proc.wait(timeout=10)
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and report["verify"]["passed"]
    assert report["upload_crc32"] == zlib.crc32(image.read_bytes())
    assert proc.returncode == 0


def test_missing_qemu_names_the_package(images, firmwares, monkeypatch):
    """A user without QEMU is told which Debian package to install."""
    from colibri.sim import boards
    real = boards.load_board("x86_64_baremetal")
    fake = boards.Board(real.name, {**real.spec, "qemu": "qemu-system-nonexistent"})
    monkeypatch.setattr(flash, "load_board", lambda name: fake)
    with pytest.raises(FileNotFoundError, match="apt-get install qemu-system-x86"):
        flash.run_on_board(images["base"], "x86_64_baremetal", PROMPT, 1, Sampling(), False,
                           firmware=firmwares["x86_64_baremetal"])


@pytest.mark.parametrize("board", with_rtos(["hosted", "cortex_m4"]))
def test_nonfinite_values_are_a_named_error_on_the_device(board, images, firmwares, tmp_path):
    """A NaN in the weights surfaces as COLIBRI_E_NONFINITE over the link (detail: the token's index in
    the FEED request), never as tokens computed from a silently absorbed NaN."""
    import struct

    from colibri.image import Role
    from test_verifier import reseal
    data = bytearray(images["base"].read_bytes())
    img = read_image(bytes(data))
    embd = img.entry(Role.TOKEN_EMBD)
    struct.pack_into("<f", data, embd.offset + 9 * img.dims.hidden_size * 4, float("inf"))  # token 9
    (tmp_path / "inf.img").write_bytes(reseal(data))
    with pytest.raises(DeviceError) as err:
        flash.run_on_board(tmp_path / "inf.img", board_name(board), PROMPT, 4, Sampling(), False,
                           firmware=firmwares[board])
    assert err.value.message == "NaN or infinity in the router or the logits"
    assert err.value.detail == PROMPT.index(9)


def test_against_transformers_catches_what_verify_cannot(checkpoints, firmware, tmp_path, capsys):
    """--against runs transformers on the source checkpoint (a directory or a GGUF file): the image packed
    from it passes; an image packed from another checkpoint of the same shape passes --verify (its own
    reference) but fails --against."""
    from dataclasses import replace

    from conftest import make_checkpoint
    from gguf_writer import hf_to_gguf
    from colibri.pack import pack
    src = checkpoints["base"]
    image = tmp_path / "base.img"
    pack(src, image, 32, 64)
    gguf_src = hf_to_gguf(src, tmp_path / "base.gguf")
    for source in (src, gguf_src):
        code = flash.main([str(image), "--board", "hosted", "--firmware", str(firmware), "--prompt-tokens", "1,5,9,3",
                           "--max-new-tokens", "6", "--against", str(source), "--json"])
        report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert code == 0 and report["against"]["passed"] and report["against"]["tokens_agree"] == 6, source
        scale = report["against"]["tolerance"] / 1e-3  # max(1, max |logit|)
        assert report["against"]["max_abs_error"] <= 1e-4 * scale  # an f32 image: float summation order only
    other = make_checkpoint(replace(CONFIGS[0], seed=99), tmp_path / "other")  # same shapes, other weights
    code = flash.main([str(image), "--board", "hosted", "--firmware", str(firmware), "--prompt-tokens", "1,5,9,3",
                       "--max-new-tokens", "6", "--verify", "--against", str(other), "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["verify"]["passed"] and not report["against"]["passed"] and code == 1


@pytest.mark.parametrize("dtype,kv", [("q8_0", "f32"), ("q4_0", "f16")])
def test_verify_is_bit_for_bit_on_an_untouched_quantized_checkpoint(dtype, kv, firmware, tmp_path, capsys):
    """A checkpoint as transformers makes it (every norm weight exactly 1.0), quantized: activations land on
    rounding ties that go one way or the other with the last bit of the normed input, so a reference that differs
    from the device anywhere in the last bit parts from it after a few layers. --verify holds bit for bit and
    says so (issue 27: the reference summed in another order and failed at q4_0 with 0.0035)."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    from colibri.pack import pack
    torch.manual_seed(3)
    MixtralForCausalLM(MixtralConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=64)).save_pretrained(tmp_path / "ckpt")
    image = tmp_path / "model.img"
    pack(tmp_path / "ckpt", image, 32, 64, dtype=DType.parse(dtype), kv=kv, measure_quality=False)
    assert read_image(image.read_bytes()).tensor(Role.ATTN_NORM, 0).tolist() == [1.0] * 64  # untouched
    code = flash.main([str(image), "--board", "hosted", "--firmware", str(firmware), "--prompt-tokens",
                       "1,5,9,3,7,11,13,2", "--max-new-tokens", "12", "--verify"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "verify: bit-identical to the reference over 20 logits rows; greedy tokens agree 12/12: PASS" in out


@pytest.fixture(scope="module")
def dense_image(tmp_path_factory) -> Path:
    """A small Llama: no routed layer, so only the residual stream's CRCs can say where a run parts."""
    from conftest import make_family_checkpoint
    from colibri.pack import pack
    base = tmp_path_factory.mktemp("dense")
    ckpt = make_family_checkpoint("LlamaForCausalLM", dict(vocab_size=40, num_hidden_layers=2, hidden_size=24,
                                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=20), 3, base / "ckpt")
    pack(ckpt, base / "dense.img", 48, 64)
    return base / "dense.img"


@pytest.mark.parametrize("which,changed,says", [
    ("base", [(Role.ROUTER, 1, -1)], "token 0 (id 1), layer 1: the router's"),
    ("base", [(Role.WO, 1, -1)], "token 0 (id 1), layer 1: the residual stream after the attention half differs"),
    ("base", [(Role.EXPERT_DOWN, 1, e) for e in range(4)],
     "token 0 (id 1), layer 1: the residual stream after the FFN half differs"),
    ("base", [(Role.OUTPUT_NORM, -1, -1)], "every layer of every token agrees: they part after the last layer"),
    ("dense", [(Role.DENSE_DOWN, 0, -1)], "token 0 (id 1), layer 0: the residual stream after the FFN half differs"),
], ids=["router", "attention", "experts", "output", "dense_mlp"])
def test_verify_names_where_device_and_reference_part(which, changed, says, images, dense_image, firmware, capsys,
                                                      monkeypatch):
    """When the device's logits part from the reference's, --verify says at which position, and one traced run
    more names the first token, layer and step where they part: the residual stream's CRC after the attention
    half, the router's choice, the CRC after the FFN half (dense layers too). Here the reference is given an
    image in which one tensor differs from the one the device runs (scaled by 1.5; everything else equal)."""
    from test_verifier import reseal
    from colibri.image import NO_INDEX
    image = images["base"] if which == "base" else dense_image
    data = bytearray(image.read_bytes())
    before = read_image(bytes(data))
    for role, layer, expert in changed:
        e = before.entry(role, NO_INDEX if layer < 0 else layer, NO_INDEX if expert < 0 else expert)
        assert e.dtype == DType.F32
        values = np.frombuffer(bytes(data[e.offset:e.offset + e.nbytes]), np.float32)
        data[e.offset:e.offset + e.nbytes] = (values * np.float32(1.5)).tobytes()
    other = read_image(reseal(data), check_crcs=False)  # (the routed experts' block CRCs are not resealed)
    real = flash.Reference
    monkeypatch.setattr(flash, "Reference", lambda img, *a, **k: real(other, *a, **k))
    code = flash.main([str(image), "--board", "hosted", "--firmware", str(firmware), "--prompt-tokens", "1,5,9,3",
                       "--max-new-tokens", "4", "--verify"])
    out = capsys.readouterr().out
    assert code == 1
    assert "verify: device and reference part at position 0:" in out and "FAIL" in out
    assert f"verify: {says}" in out, out


@pytest.mark.parametrize("settings", [("0.8", "0", "0.9"), ("1.5", "0", "1"), ("0.7", "3", "1"), ("1.2", "4", "0.6")],
                         ids=["top_p", "no_cut", "top_k", "top_k_top_p"])
def test_verify_checks_sampled_tokens_against_the_runtimes_sampler(settings, images, firmware, capsys):
    """With a temperature, --verify draws each token as the runtime's sampler does (colibri/sampling.py: its
    generator, seeded the same, its cuts and ties) from the reference's logits: every sampled token agrees.
    Another seed's draws do not, so the check can fail."""
    temperature, top_k, top_p = settings
    code = flash.main([str(images["base"]), "--board", "hosted", "--firmware", str(firmware), "--prompt-tokens", "1,5,9,3",
                       "--max-new-tokens", "24", "--temperature", temperature, "--top-k", top_k, "--top-p", top_p,
                       "--seed", "11", "--verify", "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    v = report["verify"]
    assert code == 0 and v["passed"] and v["sampled"] and v["tokens_agree"] == v["tokens_checked"] == 24
    from colibri.sampling import Sampler
    logits = Reference(read_image(images["base"].read_bytes())).forward(PROMPT + report["tokens"])
    other = flash.compare(logits, logits, PROMPT, report["tokens"], False, None,
                          sampler=Sampler(float(temperature), int(top_k), float(top_p), 12))
    assert other.tokens_agree < other.tokens_checked == 24


def test_the_traced_run_says_why_it_cannot_name_the_parting(images):
    """The traced run that names where device and reference part can fail, give other tokens, or not be possible
    (over --port): it says so instead of naming nothing (or a wrong layer)."""
    from colibri.protocol import LinkError
    run = flash.RunResult(tokens=[3, 4], stats={}, logits=None, board="hosted")
    reference = Reference(read_image(images["base"].read_bytes()))

    def failing():
        raise LinkError("timed out after 60.0s waiting for the device")
    assert "(--port)" in flash.traced_parting(reference, "hosted", "/dev/ttyUSB0", run, PROMPT, failing)
    assert "failed (timed out" in flash.traced_parting(reference, "hosted", None, run, PROMPT, failing)
    other = flash.RunResult(tokens=[3, 5], stats={}, logits=None, board="hosted", traces=[])
    assert "does not repeat itself" in flash.traced_parting(reference, "hosted", None, run, PROMPT, lambda: other)
