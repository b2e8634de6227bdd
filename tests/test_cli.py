"""The `colibri` command as a new user meets it: every user error is one line on stderr with exit status 2 and
no traceback, found on the host before a board boots where the host can see it; Ctrl-C is one line and exit
status 130 with the board stopped, and in an interactive chat it ends the answer and keeps the conversation."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, build, make_family_checkpoint
from colibri.pack import pack
from colibri.protocol import Sampling
from colibri.text import Text
from colibri import flash
from colibri.image import open_image
from test_text import make_text_checkpoint

DEMO_PROMPT = "13,1,2,3,10,0,4,5,11"  # 123+045= in the demo model's vocabulary of 14 (it answers 168 reversed)


def colibri(*args, env: dict | None = None, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kwargs}
    return subprocess.Popen([sys.executable, "-m", "colibri.cli", *map(str, args)], cwd=ROOT, env=env, text=True,
                            **kwargs)


def run(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = colibri(*args, env=env)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_one_line_error(result: subprocess.CompletedProcess, says: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr
    assert says in result.stderr, result.stderr


@pytest.fixture(scope="module")
def demo_image(tmp_path_factory) -> Path:
    image = tmp_path_factory.mktemp("cli") / "demo.img"
    pack(ROOT / "models" / "demo-adder", image, 16, 64, measure_quality=False)
    return image


@pytest.fixture(scope="module")
def dense_images(tmp_path_factory) -> dict[str, Path]:
    """A dense Llama with a long max_seq (its arena, 4.3 MB, is more than the Cortex-M4's 3.75 MiB), and one with
    a vocabulary of 70,000 (its image, 36 MB, is more than the Cortex-M4's 16 MiB image region)."""
    out = tmp_path_factory.mktemp("dense")
    small = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=300, tie_word_embeddings=False)
    long_ctx = make_family_checkpoint("LlamaForCausalLM", small, 1, out / "long", max_positions=4096)
    wide = make_family_checkpoint("LlamaForCausalLM", dict(small, vocab_size=70000), 2, out / "wide")
    images = {"long": out / "long.img", "wide": out / "wide.img"}
    pack(long_ctx, images["long"], 4096, 64, measure_quality=False)
    pack(wide, images["wide"], 16, 64, measure_quality=False)
    return images


def test_user_errors_are_one_line_before_any_board_boots(demo_image, dense_images, tmp_path):
    """Each bad run is refused by the host with the numbers and what to do: no board is booted for it (the Cortex-M4
    and Cortex-M55 ones are refused whether or not their firmware is built)."""
    garbage = tmp_path / "garbage.img"
    garbage.write_bytes(os.urandom(4096))
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    (not_a_model / "config.json").write_text(json.dumps({"model_type": "no-such-model", "architectures": ["Nope"]}))
    demo = ["--board", "hosted"]
    cases = [
        ((tmp_path / "missing.img", "--prompt-tokens", "1"), "missing.img not found"),
        ((garbage, "--prompt-tokens", "1"), "is not a valid image"),
        ((demo_image, *demo), "one of the arguments --prompt --chat --prompt-tokens is required"),
        ((demo_image, *demo, "--prompt-tokens", "1,x"), "expected comma-separated token ids"),
        ((demo_image, *demo, "--prompt-tokens", DEMO_PROMPT, "--max-new-tokens", "8"),
         "9 prompt + 8 new tokens exceed the image's max_seq 16: ask for at most 7 new tokens"),
        ((demo_image, *demo, "--prompt-tokens", "1,2,300"), "token id 300 is outside the image's vocabulary of 14 ids"),
        ((demo_image, *demo, "--prompt-tokens", "1", "--expert-cache", "9"),
         "--expert-cache 9 is more slots than the image's 8 streamed experts"),
        ((demo_image, *demo, "--prompt-tokens", "1", "--expert-cache", "lots"), "give a slot count, 'all', or bytes"),
        ((dense_images["long"], *demo, "--prompt-tokens", "1", "--expert-cache", "2"),
         "this image has none in its expert part"),
        ((dense_images["wide"], "--board", "cortex_m4", "--prompt-tokens", "1", "--max-new-tokens", "4"),
         f"the image is {dense_images['wide'].stat().st_size:,} bytes and cortex_m4's image region (PSRAM) holds "
         "16,777,216: pack it with --dtype q8_0 or q4_0"),
        ((dense_images["long"], "--board", "cortex_m4", "--prompt-tokens", "1"),
         "arena and cortex_m4's arena region (SSRAM2/3) holds 3,932,160: repack with a smaller --max-seq or --kv f16"),
        ((demo_image, "--board", "cortex_m55", "--prompt-tokens", "1", "--expert-cache", "8", "--threads", "2"),
         "board cortex_m55 computes on one core"),
        ((demo_image, "--board", "nope", "--prompt-tokens", "1"), "unknown board 'nope'"),
        ((demo_image, *demo, "--prompt-tokens", DEMO_PROMPT, "--max-new-tokens", "2", "--against", not_a_model),
         "cannot run this checkpoint"),
    ]
    logs_before = set((ROOT / "build" / "logs").glob("*.log"))
    for args, says in cases:
        assert_one_line_error(run("run", *args), says)
    assert set((ROOT / "build" / "logs").glob("*.log")) <= logs_before  # nothing booted to leave a log
    # the arena check names the bytes: the image's plan, which the device itself would ask for
    long_arena = open_image(dense_images["long"], check_crcs=False)
    from colibri.image import arena_bytes
    assert f"needs a {arena_bytes(long_arena.dims):,}-byte arena" in run(
        "run", dense_images["long"], "--board", "cortex_m4", "--prompt-tokens", "1").stderr


def test_version_and_a_closed_pipe(tmp_path):
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("colibri ") and version.stdout.split()[1][0].isdigit()
    # `colibri pack ... | head -0`: the reader is gone before the report is written; the command ends quietly
    proc = colibri("pack", ROOT / "models" / "demo-adder", "-o", tmp_path / "x.img", "--max-seq", "16", "--no-quality")
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in err and "Exception" not in err, err


def read_until(proc: subprocess.Popen, seen: str, done) -> str:
    """`seen` and what `proc` prints next, until done(all of it)."""
    while not done(seen):
        c = proc.stdout.read(1)
        assert c, f"ended early: {seen!r} {proc.stderr.read()}"
        seen += c
    return seen


def board_processes(image: Path) -> list[str]:
    found = subprocess.run(["pgrep", "-af", str(image)], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if "qemu" in line]


@pytest.fixture(scope="module")
def chat_image(tmp_path_factory) -> Path:
    """A Mixtral large enough that the Cortex-M4 under QEMU takes seconds for an answer (about 30 tokens/s), with
    a tokenizer and a chat template."""
    out = tmp_path_factory.mktemp("chat")
    ckpt = make_text_checkpoint(out / "ckpt", hidden_size=256, intermediate_size=512, num_hidden_layers=4)
    from colibri.quant import DType
    pack(ckpt, out / "chat.img", 128, 64, dtype=DType.Q8_0, measure_quality=False)
    return out / "chat.img"


def test_ctrl_c_stops_a_run_on_a_qemu_board_in_one_line(chat_image):
    build("cortex_m4")
    proc = colibri("run", chat_image, "--board", "cortex_m4", "--prompt-tokens", "1,5,9", "--max-new-tokens", "100")
    read_until(proc, "", lambda seen: "-> " in seen and " " in seen.split("-> ")[1])  # a token has come
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "colibri run: interrupted", err
    time.sleep(0.5)
    assert board_processes(chat_image) == []


def test_ctrl_c_in_a_chat_ends_the_answer_and_keeps_the_conversation(chat_image, hosted_build):
    """The first answer is cut after its first characters; the chat goes on, and the second answer is the one a
    fresh context gives for the whole conversation, the cut answer in it as far as it was shown."""
    build("cortex_m4")
    max_new = 60
    proc = colibri("run", chat_image, "--board", "cortex_m4", "--chat", "--max-new-tokens", max_new,
                   stdin=subprocess.PIPE)
    proc.stdin.write("hello there\n")
    proc.stdin.flush()
    seen = read_until(proc, "", lambda seen: len(seen.split("you> ")) > 1 and len(seen.split("you> ")[1]) >= 2)
    proc.send_signal(signal.SIGINT)  # the answer has begun
    seen = read_until(proc, seen, lambda seen: seen.count("you> ") == 2)  # back at the prompt
    out, err = proc.communicate("and the experts?\n", timeout=120)
    assert proc.returncode == 0 and "Traceback" not in err, err
    turns = (seen + out).split("you> ")
    cut, second = turns[1], turns[2]
    assert cut.endswith(" [interrupted]\n"), cut
    cut = cut[:-len(" [interrupted]\n")]
    assert 0 < len(cut) and second.endswith("\n")
    text = Text(open_image(chat_image, check_crcs=False).meta)
    conversation = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": cut},
                    {"role": "user", "content": "and the experts?"}]
    fresh = flash.run_on_board(chat_image, "hosted", text.chat_tokens(conversation), max_new, Sampling(), False,
                               firmware=hosted_build / "firmware.elf", stop=text.eos_ids)
    assert second[:-1] == text.decode(fresh.tokens)
    assert board_processes(chat_image) == []


def test_a_board_behind_a_tcp_serial_server(demo_image, hosted_build):
    """--port takes pyserial's URLs: a board whose serial line a TCP server shares (as ser2net shares a UART; here
    the hosted board's stdin and stdout, bridged) is reached at socket://HOST:PORT, the image uploaded over it."""
    import socket
    import threading
    board = subprocess.Popen([hosted_build / "firmware.elf", "--upload-bytes", "4000000"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, bufsize=0)
    server = socket.create_server(("127.0.0.1", 0))

    def bridge() -> None:
        conn, _ = server.accept()

        def to_board() -> None:
            while data := conn.recv(65536):
                board.stdin.write(data)
        threading.Thread(target=to_board, daemon=True).start()
        while data := board.stdout.read(65536):  # unbuffered: what the board has written so far
            conn.sendall(data)
    threading.Thread(target=bridge, daemon=True).start()
    try:
        ran = run("run", demo_image, "--port", f"socket://127.0.0.1:{server.getsockname()[1]}", "--prompt-tokens",
                  DEMO_PROMPT, "--max-new-tokens", "5", "--verify")
    finally:
        board.kill()
        server.close()
    assert ran.returncode == 0 and "greedy tokens agree 5/5: PASS" in ran.stdout, ran.stderr
    assert "image uploaded, device CRC-32" in ran.stdout
    refused = run("run", demo_image, "--port", "nosuch://x", "--prompt-tokens", "1", "--max-new-tokens", "2")
    assert_one_line_error(refused, "cannot open nosuch://x")


def test_run_a_model_file_or_checkpoint_packs_it_once(tmp_path, hosted_build):
    """`colibri run model.gguf` (or a checkpoint directory) packs it into the cache first, said in one line, and
    the next run with the same options uses that image; other options make another. The file's own types are kept
    (a Q8_0 file packs to q8_0 blocks, unchanged: --dtype stored)."""
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    gguf = ROOT / "tests" / "fixtures" / "gguf" / "converted-mixtral-q8_0.gguf"
    args = ("--board", "hosted", "--firmware", hosted_build / "firmware.elf", "--prompt", "hello there",
            "--max-new-tokens", "3", "--verify")
    first, second = run("run", gguf, *args, env=env), run("run", gguf, *args, env=env)
    for ran in (first, second):
        assert ran.returncode == 0 and "greedy tokens agree 3/3: PASS" in ran.stdout, ran.stderr
    images = list((tmp_path / "colibri" / "images").glob("*.img"))
    assert len(images) == 1 and first.stderr.strip() == (f"packing {gguf} (stored, the default max_seq, f32 KV cache) "
                                                          f"into {images[0]}; `colibri pack` packs with every option")
    assert second.stderr == "" and first.stdout.splitlines()[0] == second.stdout.splitlines()[0]
    assert set(open_image(images[0], check_crcs=False).bytes_by_dtype()) == {"f32", "q8_0"}
    demo = run("run", ROOT / "models" / "demo-adder", "--max-seq", "16", "--board", "hosted", "--firmware",
               hosted_build / "firmware.elf", "--prompt-tokens", DEMO_PROMPT, "--max-new-tokens", "5", env=env)
    assert demo.returncode == 0 and "-> 8 6 1 0 12" in demo.stdout and "(f32, max_seq 16" in demo.stderr, demo
    assert len(list((tmp_path / "colibri" / "images").glob("*.img"))) == 2
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(20))
    assert_one_line_error(run("run", broken, *args, env=env), f"cannot pack {broken}")


def test_every_subcommands_user_errors_are_one_line(tmp_path):
    """The other subcommands, given what a user gets wrong: one line, exit 2, no traceback."""
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(200, 256)) * 2)  # neither UTF-8 nor an image
    empty_trace = tmp_path / "trace.json"
    empty_trace.write_text("{}")
    cases = [
        (("report", tmp_path / "missing.json"), "cannot read"),
        (("report", junk), "cannot read"),
        (("report", empty_trace), "is not a trace"),
        (("footprint", "--board", "nope"), "invalid choice: 'nope'"),
        (("footprint", "--board", "cortex_m4", "--image", junk), "is not a valid image"),
        (("footprint", "--board", "cortex_m4", "--image", tmp_path / "missing.img"), "not found"),
        (("footprint", junk), "is not a readable ELF"),
        (("info", junk), "is not a valid image"),
        (("info", tmp_path / "missing.img"), "not found"),
        (("build",), "the following arguments are required: --board"),
        (("build", "--board", "nope"), "unknown board 'nope'"),
        (("build", "--board", "hosted", "--mode", "fast"), "invalid choice: 'fast'"),
        (("boards", "--bogus"), "unrecognized arguments: --bogus"),
        (("pack", ROOT / "models" / "demo-adder"), "the following arguments are required: -o/--output"),
        (("nope",), "unknown subcommand 'nope'"),
    ]
    for args, says in cases:
        assert_one_line_error(run(*args), says)


def test_progress_bars_show_on_a_terminal_only(demo_image):
    """An upload and a prompt fed a token at a time (--verify) show tqdm bars on stderr when it is a terminal, and
    nothing when it is not (a pipe, a log file)."""
    import fcntl
    import pty
    import struct
    import termios
    build("x86_64_baremetal")
    args = ("run", demo_image, "--board", "x86_64_baremetal", "--upload", "--prompt-tokens", DEMO_PROMPT,
            "--max-new-tokens", "2", "--verify")
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a terminal's size: tqdm draws
    proc = colibri(*args, stderr=follower)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal's other side closed
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert proc.wait(timeout=300) == 0, proc.stdout.read()
    assert b"upload:" in shown and b"prompt:" in shown, shown[-2000:]
    piped = run(*args)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr


def test_pinning_more_experts_than_the_trace_routed_says_so(tmp_path, hosted_build):
    trace = tmp_path / "calib.json"
    traced = run("run", ROOT / "models" / "demo-adder", "--max-seq", "16", "--board", "hosted", "--firmware",
                 hosted_build / "firmware.elf", "--prompt-tokens", DEMO_PROMPT, "--max-new-tokens", "2", "--trace-out",
                 trace, env={"XDG_CACHE_HOME": str(tmp_path)})
    assert traced.returncode == 0, traced.stderr
    packed = run("pack", ROOT / "models" / "demo-adder", "-o", tmp_path / "p.img", "--max-seq", "16", "--no-quality",
                 "--pin-from", trace, "--pin", "100")
    assert packed.returncode == 0 and "8 hot experts pinned resident (--pin 100: the trace routed to only 8 experts)" \
        in packed.stdout, packed.stdout
