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
         "16,777,216: repack it with --dtype q8_0 (the image is then "),
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


# ---- issue 30's new-user review: what a new user still tripped over ----

def call(capsys, *args) -> subprocess.CompletedProcess:
    """The colibri command run in this process (no interpreter to start: the cases below are many), as `run` does
    in a subprocess: its exit status and what it wrote."""
    import signal as _signal
    from colibri.cli import main
    handlers = {s: _signal.getsignal(s) for s in (_signal.SIGTERM, _signal.SIGHUP)}
    argv0 = sys.argv[0]
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    finally:
        for s, h in handlers.items():
            _signal.signal(s, h)
        sys.argv[0] = argv0
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def test_pack_never_writes_over_the_checkpoint_it_packs(tmp_path, capsys):
    """-o naming the GGUF file being packed, a checkpoint's own weights file, a symlink to it or a hard link of it:
    refused in one line, the source left as it was."""
    import shutil
    gguf = tmp_path / "mx.gguf"
    shutil.copy(ROOT / "tests" / "fixtures" / "gguf" / "converted-mixtral-q8_0.gguf", gguf)
    ckpt = tmp_path / "dm"
    shutil.copytree(ROOT / "models" / "demo-adder", ckpt)
    weights = ckpt / "model.safetensors"
    os.symlink(weights, tmp_path / "link.img")
    os.link(weights, tmp_path / "hard.img")
    before = {p: p.read_bytes() for p in (gguf, weights, ckpt / "config.json")}
    for src, out in ((gguf, gguf), (ckpt, weights), (ckpt, ckpt / "config.json"), (ckpt, tmp_path / "link.img"),
                     (ckpt, tmp_path / "hard.img"), (ckpt, tmp_path / "dm" / ".." / "dm" / "model.safetensors")):
        assert_one_line_error(call(capsys, "pack", src, "-o", out, "--no-quality"), "the image would replace it")
    assert all(p.read_bytes() == data for p, data in before.items())
    packed = call(capsys, "pack", ckpt, "-o", ckpt / "model.img", "--max-seq", "16", "--no-quality")  # beside: fine
    assert packed.returncode == 0, packed.stderr


def test_gguf_is_told_by_its_magic_not_its_name(tmp_path, capsys):
    """An upper-case .GGUF, an ollama blob without an extension: packed as GGUF files."""
    import shutil
    for name in ("SMOL.GGUF", "sha256-0123abcd"):
        model = tmp_path / name
        shutil.copy(ROOT / "tests" / "fixtures" / "gguf" / "converted-mixtral-q8_0.gguf", model)
        packed = call(capsys, "pack", model, "-o", tmp_path / f"{name}.img", "--no-quality")
        assert packed.returncode == 0 and "MixtralForCausalLM" in packed.stdout, packed.stderr


def test_run_on_a_damaged_gguf_says_what_pack_says(tmp_path, capsys, monkeypatch):
    """autopack reads the file's types before packing: a damaged file is said in pack's words."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cut = tmp_path / "t.gguf"
    cut.write_bytes((ROOT / "tests" / "fixtures" / "gguf" / "converted-mixtral-q8_0.gguf").read_bytes()[:300_000])
    said = call(capsys, "run", cut, "--board", "hosted", "--prompt-tokens", "1")
    assert_one_line_error(said, "is not a readable GGUF file")
    assert "it is cut short or not GGUF at all; download or convert it again" in said.stderr
    assert "larger dtype" not in said.stderr


def test_a_folder_that_is_not_a_checkpoint_is_said_before_packing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    said = call(capsys, "run", tmp_path, "--board", "hosted", "--prompt-tokens", "1")
    assert_one_line_error(said, "is neither a GGUF file nor a directory with config.json")
    assert "packing" not in said.stderr


def test_an_installed_package_uses_its_own_tree_wherever_it_runs(tmp_path):
    """A package imported from outside a checkout (a wheel's) uses the tree it carries, even from inside a folder
    (or below one) that has boards/ and SConstruct: that folder is not its checkout."""
    import shutil
    site = tmp_path / "site"
    shutil.copytree(ROOT / "colibri", site / "colibri", ignore=shutil.ignore_patterns("__pycache__", "tree"))
    tree = site / "colibri" / "tree"
    (tree / "boards" / "hosted").mkdir(parents=True)
    (tree / "boards" / "hosted" / "board.toml").write_text("")
    (tree / "SConstruct").write_text("")
    fake = tmp_path / "fake"
    (fake / "boards").mkdir(parents=True)
    (fake / "SConstruct").write_text("")
    (fake / "below").mkdir()
    from colibri import __version__
    for cwd in (fake, fake / "below"):
        where = subprocess.run([sys.executable, "-c", "from colibri.paths import ROOT; print(ROOT)"], cwd=cwd,
                               env={"PATH": os.environ["PATH"], "PYTHONPATH": str(site),
                                    "XDG_CACHE_HOME": str(tmp_path / "cache")}, capture_output=True, text=True)
        assert where.stdout.strip() == str(tmp_path / "cache" / "colibri" / __version__), where
    checkout = subprocess.run([sys.executable, "-c", "from colibri.paths import ROOT; print(ROOT)"], cwd=fake,
                              env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert checkout.stdout.strip() == str(ROOT), checkout  # the checkout's own package: the checkout


def test_host_side_tracebacks_are_one_line_errors(demo_image, tmp_path, capsys):
    """info on a folder, report's --out where it cannot write: one line, exit 2."""
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"n_layers": 1, "n_experts": 2, "top_k": 1, "trace": [
        {"pos": 0, "token": 1, "layers": [{"layer": 0, "experts": [1], "weights": [1.0], "cycles_attention": 1,
                                           "cycles_router": 1, "cycles_ffn": 1, "cycles_expert": [1]}]}]}))
    cases = [
        (("info", tmp_path), "is a directory, not an image"),
        (("info", ROOT / "models" / "demo-adder"), "is a directory, not an image"),
        (("report", trace, "--out", tmp_path / "nonexist" / "routing"), "does not exist"),
        (("report", trace, "--out", tmp_path), "is a directory"),
    ]
    for args, says in cases:
        assert_one_line_error(call(capsys, *args), says)
    assert not list(tmp_path.parent.glob(f"{tmp_path.name}-*.png"))


def test_footprint_of_an_image_too_large_says_so_in_one_line(dense_images, capsys):
    build("cortex_m4")
    said = call(capsys, "footprint", "--board", "cortex_m4", "--image", dense_images["wide"])
    size = dense_images["wide"].stat().st_size
    assert said.returncode == 1, said.stderr
    assert said.stdout.splitlines()[-1].startswith(
        f"the image does not fit cortex_m4: the image needs {size:,} bytes, {100 * size / 16777216:.0f}% of the "
        "16,777,216 of its region (PSRAM)"), said.stdout


def test_a_port_that_cannot_be_opened_is_said_once(demo_image, capsys):
    said = call(capsys, "run", demo_image, "--port", "/nonexist/ttyUSB9", "--prompt-tokens", "1", "--max-new-tokens",
                "1")
    assert_one_line_error(said, "cannot open /nonexist/ttyUSB9: No such file or directory")
    assert said.stderr.count("/nonexist/ttyUSB9") == 1, said.stderr


def test_bad_option_values_are_argument_errors_naming_the_range(demo_image, capsys):
    """Each number a run takes is checked against its range by argparse (exit 2, one line), before anything is read
    or booted; text that is not UTF-8 (a shell hands its bytes over as surrogates) likewise."""
    demo = (demo_image, "--board", "hosted", "--prompt-tokens", "1")
    cases = [
        (("--top-k", "-2"), "give a whole number from 0 to 4,294,967,295"),
        (("--top-k", "99999999999"), "give a whole number from 0 to 4,294,967,295"),
        (("--fault-rate", "2"), "give a number from 0 to 0.01"),
        (("--fault-rate", "0.5"), "give a number from 0 to 0.01"),
        (("--fault-rate", "-1"), "give a number from 0 to 0.01"),
        (("--timeout", "0"), "give a number above 0"),
        (("--retries", "-1"), "give a whole number from 0 to 1,000"),
        (("--tolerance", "-1"), "give a number of 0 or more"),
        (("--temperature", "nan"), "give a number from 0 to 100"),
        (("--temperature", "-1"), "give a number from 0 to 100"),
        (("--top-p", "5"), "give a number from 0 to 1"),
        (("--baud", "-5"), "give a whole number from 1 to"),
        (("--seed", "-1"), "give a whole number from 0 to 18,446,744,073,709,551,615"),
    ]
    for extra, says in cases:
        said = call(capsys, "run", *demo, *extra)
        assert_one_line_error(said, says)
        assert f"argument {extra[0]}" in said.stderr
    for extra in (("--prompt", "\udcff\udcfe"), ("--chat", "hi\udcff")):
        said = call(capsys, "run", demo_image, "--board", "hosted", *extra)
        assert_one_line_error(said, "holds bytes that are not UTF-8 (ff")


def test_what_the_host_can_check_is_checked_before_the_board_boots(demo_image, tmp_path, capsys, monkeypatch):
    """Output paths that cannot be written, a firmware that is a folder or missing, --upload or --gdb on a process
    board, a QEMU not installed, an expert cache smaller than top_k, a checkpoint to compare with that is not there,
    options that apply to a checkpoint only: one line, exit 2, and nothing printed on stdout (no `[board] prompt ->`
    half-line: no board started)."""
    demo = (demo_image, "--board", "hosted", "--prompt-tokens", DEMO_PROMPT, "--max-new-tokens", "2")
    cases = [
        (("--trace-out", tmp_path), "--trace-out " + str(tmp_path) + " is a directory"),
        (("--trace-out", "/nonexist/t.json"), "the folder /nonexist does not exist"),
        (("--dump-logits", "/nonexist/x.npy"), "the folder /nonexist does not exist"),
        (("--dump-logits", tmp_path), "is a directory"),
        (("--firmware", tmp_path), f"firmware {tmp_path} is a directory"),
        (("--firmware", tmp_path / "nope.elf"), "nope.elf not found"),
        (("--upload",), "leave out --upload"),
        (("--gdb",), "--gdb starts QEMU halted"),
        (("--expert-cache", "1"), "--expert-cache 1 is fewer slots than the 2 experts one layer routes to (top_k)"),
        (("--expert-cache", "0"), "--expert-cache 0 streams nothing"),
        (("--against", tmp_path / "nonexist"), "nonexist does not exist"),
        (("--max-seq", "32"), "--max-seq applies to a checkpoint or a GGUF file"),
        (("--dtype", "q8_0"), "--dtype applies to a checkpoint or a GGUF file"),
        (("--kv", "f16"), "--kv applies to a checkpoint or a GGUF file"),
        (("--port", "socket://127.0.0.1:1"), "--port and --board each name the board"),
    ]
    for extra, says in cases:
        said = call(capsys, "run", *demo, *extra)
        assert_one_line_error(said, says)
        assert said.stdout == "", (extra, said.stdout)
    monkeypatch.setenv("PATH", str(tmp_path))  # no QEMU (and no compiler: the check comes before any build)
    said = call(capsys, "run", demo_image, "--board", "cortex_m4", "--prompt-tokens", "1", "--max-new-tokens", "1")
    assert_one_line_error(said, "qemu-system-arm not found: apt-get install qemu-system-arm")
    assert said.stdout == ""


def test_repack_advice_is_sized_exactly(tmp_path):
    """An image too large for a board's image region is told the widest dtype whose image, sized exactly as pack
    would write it, fits there (never one that does not); when none does, that it does not."""
    from colibri.sim.boards import Board
    from colibri.quant import DType
    image = tmp_path / "demo.img"
    pack(ROOT / "models" / "demo-adder", image, 32, 64, measure_quality=False)
    sizes = {}
    for dtype in (DType.F16, DType.Q8_0, DType.Q4_0):
        sizes[dtype] = pack(ROOT / "models" / "demo-adder", tmp_path / "x.img", 32, 64, dtype=dtype,
                            measure_quality=False)["image_bytes"]
    img = open_image(image, check_crcs=False)

    def tiny(image_bytes: int) -> Board:
        return Board("tiny", {"memory": {"image": {"name": "FLASH", "origin": 0, "bytes": image_bytes},
                                         "arena": {"name": "RAM", "origin": 0, "bytes": 1 << 20}}})
    said = flash.preflight(img, image.stat().st_size, tiny(sizes[DType.Q8_0] + 1), [1], 1, 0)
    assert f"repack it with --dtype q8_0 (the image is then {sizes[DType.Q8_0]:,} bytes)" in said, said
    assert "f16" not in said and "q4_0" not in said
    said = flash.preflight(img, image.stat().st_size, tiny(sizes[DType.Q4_0] - 1), [1], 1, 0)
    assert f"even --dtype q4_0 makes it {sizes[DType.Q4_0]:,} bytes: a smaller model" in said, said
    assert "repack it with" not in said


class FakeClient:
    """A board that answers every step with the end-of-sequence token, for chat_turns."""

    def __init__(self, eos: int):
        self.eos, self.fed = eos, []

    def start(self, sampling) -> None:
        self.fed = []

    def feed_all(self, tokens) -> None:
        self.fed += list(tokens)

    def step(self):
        from types import SimpleNamespace
        return SimpleNamespace(token=self.eos)


def test_a_chat_says_what_passes_max_seq_and_goes_on_after_bytes_that_are_not_utf8(chat_image):
    text = Text(open_image(chat_image, check_crcs=False).meta)
    eos = min(text.eos_ids)
    shown = []

    reads = iter(["hi\udcff", UnicodeDecodeError("utf-8", b"\xfe", 0, 1, "invalid start byte"), "word " * 40, "hello"])

    def read(_prompt: str) -> str:
        got = next(reads, None)
        if got is None:
            raise EOFError
        if isinstance(got, Exception):
            raise got
        return got
    max_seq, max_new = 128, 60
    messages = flash.chat_turns(FakeClient(eos), text, Sampling(), max_new, max_seq, read, shown.append)
    said = "".join(shown)
    assert said.count("bytes that are not UTF-8") == 2, said
    long = len(text.chat_tokens([{"role": "user", "content": ("word " * 40).strip()}]))
    assert f"[{long} prompt + {max_new} new tokens exceed the image's max_seq {max_seq}" in said, said
    assert [m["content"] for m in messages if m["role"] == "user"] == ["hello"]


def test_an_interactive_chat_that_cannot_fit_one_turn_is_refused_before_the_boot(chat_image, capsys):
    text = Text(open_image(chat_image, check_crcs=False).meta)
    least = len(text.chat_tokens([{"role": "user", "content": ""}]))
    said = call(capsys, "run", chat_image, "--board", "hosted", "--chat", "--max-new-tokens", "1000")
    assert_one_line_error(said, f"{least} prompt (the chat template's, for an empty message) + 1000 new tokens exceed "
                                f"the image's max_seq 128: ask for at most {128 - least} new tokens")


def test_interactive_chat_reads_bytes_that_are_not_utf8_and_goes_on(chat_image, hosted_build):
    proc = colibri("run", chat_image, "--board", "hosted", "--firmware", hosted_build / "firmware.elf", "--chat",
                   "--max-new-tokens", "4", stdin=subprocess.PIPE, errors="surrogateescape")
    out, err = proc.communicate("hi\udcff\udcfe\nhello\n", timeout=300)  # the bytes ff fe, not UTF-8
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert "bytes that are not UTF-8 (ff fe" in out and out.count("you> ") == 3, out


def test_a_run_says_what_it_capped_and_writes_the_logits_where_asked(demo_image, hosted_build, tmp_path, capsys):
    import numpy as np
    logits = tmp_path / "logits"  # no .npy: written under this very name
    said = call(capsys, "run", demo_image, "--board", "hosted", "--firmware", hosted_build / "firmware.elf",
                "--prompt-tokens", DEMO_PROMPT, "--max-new-tokens", "1", "--expert-cache", "10GiB",
                "--dump-logits", logits)
    assert said.returncode == 0, said.stderr
    assert "--expert-cache 10GiB holds every one of the image's 8 streamed experts: 8 slots" in said.stderr
    assert np.load(logits).shape == (10, 14) and not (tmp_path / "logits.npy").exists()
    assert "decode 1 token " in said.stdout or "decode 1 token," in said.stdout, said.stdout


def test_timing_words_and_a_line_below_a_half_line():
    assert flash.rate(1, None) == "1 token" and flash.rate(2, None) == "2 tokens"
    assert flash.rate(1, 0.5).startswith("1 token in 500.0 ms")
    from colibri.sim import launch
    launch.line_open(True)
    assert launch.below("hosted: the board's log is kept in x") == "\nhosted: the board's log is kept in x"
    assert launch.below("next") == "next"


def test_gdb_gets_a_free_port(monkeypatch, capsys):
    """--gdb's stub listens on a port nothing holds (never a fixed 1234), and the command to attach names it."""
    from colibri.sim import launch
    from colibri.sim.boards import load_board
    seen = []

    def boot(board, firmware, argv, env, log_path, gdb, protocol):
        seen.append((argv, gdb))
        raise KeyboardInterrupt
    monkeypatch.setattr(launch, "_boot", boot)
    board = load_board("cortex_m4")
    with pytest.raises(KeyboardInterrupt):
        with launch.start_board(board, Path(__file__), None, gdb=True):
            pass
    argv, port = seen[0]
    assert isinstance(port, int) and port > 0 and f"tcp:127.0.0.1:{port}" in argv
