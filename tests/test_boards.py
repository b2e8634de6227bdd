"""Boards as data: each board's memory map is written once, in its board.toml's [memory]; the linker regions
(build/<board>/<mode>/memory.ld), the board code's IMAGE_BASE/IMAGE_CAPACITY/ARENA_BASE/ARENA_CAPACITY, QEMU's
loader address and pack.py's fit check all come from it."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from conftest import ROOT, build
from colibri.protocol import Client
from colibri.sim.boards import board_names, load_board, memory_ld, memory_region
from colibri.sim.launch import start_board

MAPPED = [b for b in board_names() if "memory" in load_board(b).spec]


def addresses(spec: dict) -> set[int]:
    """Every nonzero origin and end of the board's memory map."""
    mem = spec["memory"]
    regions = [mem["image"], mem["arena"], *mem.get("regions", [])]
    return {a for r in regions for a in (r["origin"], r["origin"] + r["bytes"]) if a}


def test_the_map_is_written_once():
    """No address of a board's map appears in its hand-written files (linker scripts, sources, compile flags):
    they take it from the build."""
    assert set(MAPPED) >= {"cortex_m4", "cortex_m55", "riscv64_virt", "x86_64_baremetal"}
    for board in MAPPED:
        spec = load_board(board).spec
        files = [p for p in (ROOT / "boards" / board).iterdir() if p.suffix in (".ld", ".c", ".S", ".h")]
        files += [ROOT / "boards" / "common" / "cortex_m.ld"] if board.startswith("cortex") else []
        texts = {p.name: p.read_text() for p in files}
        texts["cflags"] = " ".join(spec.get("cflags", []) + spec.get("ldflags", []))
        for addr in addresses(spec):
            pattern = re.compile(rf"0x0*{addr:x}\b", re.IGNORECASE)
            found = [name for name, text in texts.items() if pattern.search(text)]
            assert not found, f"{board}: 0x{addr:08X} is written again in {found}: take it from board.toml's [memory]"


@pytest.mark.parametrize("board", MAPPED)
def test_the_linker_regions_and_the_device_take_the_map(board):
    """The built memory.ld is the map's, and the running board reports the map's image and arena capacities
    (INFO: the upload region and the arena its code was given)."""
    out = build(board)
    spec = load_board(board).spec
    assert (out / "memory.ld").read_text() == memory_ld(spec, board)
    with start_board(load_board(board), out / "firmware.elf", None) as device:
        client = Client(device.link, timeout=60)
        info = client.info()
        client.quit()
    image, arena = memory_region(spec, "image"), memory_region(spec, "arena")
    assert (info.image_capacity, info.arena_capacity) == (image.bytes, arena.bytes)


@pytest.mark.parametrize("board", ["cortex_m4", "cortex_m55"])
def test_a_board_just_started_answers_at_once(board):
    """The Cortex-M boards' first request after boot waits about a second for QEMU's main loop (docs/BOARDS.md):
    start_board takes that wait, so the first request its caller sends is answered well within a lossy-link
    test's short timeout (a fault sweep with 0.4 s timeouts failed in CI without it)."""
    out = build(board)
    with start_board(load_board(board), out / "firmware.elf", None) as device:
        client = Client(device.link, timeout=0.6, retries=0)
        assert client.info().board == board
        client.quit()


def test_a_board_silent_at_boot_is_started_once_more(monkeypatch, capfd, tmp_path):
    """A QEMU board that sends nothing while booting (QEMU halted with -S here) is started once more, said on
    stderr with its log kept; one silent every time fails, naming what it had sent. Only the halted attempts
    get the short boot timeout, and their logs go to a temporary build/logs."""
    from colibri.protocol import LinkTimeout
    from colibri.sim import launch
    assert launch.LOG_DIR == ROOT / "build" / "logs"
    monkeypatch.setattr(launch, "LOG_DIR", tmp_path / "logs")
    out = build("cortex_m4")
    board = load_board("cortex_m4")
    real_boot, real_timeout, argvs = launch._boot, launch.BOOT_TIMEOUT, []

    def halted_first(board, firmware, argv, *rest):
        argvs.append(argv)
        monkeypatch.setattr(launch, "BOOT_TIMEOUT", 3.0 if len(argvs) == 1 else real_timeout)
        return real_boot(board, firmware, argv + ["-S"] if len(argvs) == 1 else argv, *rest)

    monkeypatch.setattr(launch, "_boot", halted_first)
    with start_board(board, out / "firmware.elf", None) as device:
        client = Client(device.link, timeout=5, retries=0)
        assert client.info().board == "cortex_m4"
        client.quit()
    assert len(argvs) == 2
    err = capfd.readouterr().err
    assert "cortex_m4: silent while booting (timed out after 3.0s waiting for the device (it had sent b''))" in err
    kept = re.search(r"its log is kept in (\S+);", err)
    assert kept and Path(kept.group(1)).parent == tmp_path / "logs"

    monkeypatch.setattr(launch, "_boot", real_boot)
    monkeypatch.setattr(launch, "BOOT_TIMEOUT", 3.0)
    with pytest.raises(LinkTimeout, match=r"it had sent b''"):
        with start_board(board, out / "firmware.elf", None, ["-S"]):
            pass
    err = capfd.readouterr().err
    assert err.count("silent while booting") == 1 and "the board's log is kept in" in err
    assert len(list((tmp_path / "logs").iterdir())) == 3  # one a failed attempt, none overwritten


def test_a_host_slow_after_connecting_loses_nothing(monkeypatch):
    """QEMU starts the guest as soon as it accepts the connection: a host descheduled right after connecting
    (a loaded CI machine) still gets the ready banner, on the first start (pyserial's socket:// open discarded
    whatever had arrived by then, and a Cortex-M4 looked silent for the whole boot timeout)."""
    import socket
    from colibri.sim import launch
    out = build("cortex_m4")
    monkeypatch.setattr(launch, "BOOT_ATTEMPTS", 1)
    real_connect = socket.create_connection

    def slow_connect(*args, **kwargs):
        sock = real_connect(*args, **kwargs)
        time.sleep(0.3)
        return sock

    monkeypatch.setattr(socket, "create_connection", slow_connect)
    with start_board(load_board("cortex_m4"), out / "firmware.elf", None) as device:
        assert device.notes == ["colibri cortex_m4 ready"]
        client = Client(device.link, timeout=5, retries=0)
        assert client.info().board == "cortex_m4"
        client.quit()


def test_a_board_that_printed_something_is_not_started_again(monkeypatch, capfd, tmp_path):
    """Only a board that sent nothing at all is started once more: one that printed something and then no
    banner (here its banner is not the one expected) fails at once, naming what it sent, with its log kept."""
    from colibri.protocol import LinkTimeout
    from colibri.sim import launch
    monkeypatch.setattr(launch, "LOG_DIR", tmp_path / "logs")
    monkeypatch.setattr(launch, "BOOT_TIMEOUT", 3.0)
    out = build("cortex_m4")
    real = load_board("cortex_m4")
    board = type(real)(real.name, {**real.spec, "ready": "colibri cortex_m4 never"})
    real_boot, boots = launch._boot, []

    def counted(*args):
        boots.append(args)
        return real_boot(*args)

    monkeypatch.setattr(launch, "_boot", counted)
    with pytest.raises(LinkTimeout, match=r"it had sent b'colibri cortex_m4 ready"):
        with start_board(board, out / "firmware.elf", None):
            pass
    assert len(boots) == 1
    err = capfd.readouterr().err
    assert "silent" not in err and "cortex_m4: the board's log is kept in" in err


def test_failed_sessions_keep_a_log_each(monkeypatch, tmp_path):
    """Two failures in the same second of one process keep two logs (they were named by the second and the pid)."""
    from colibri.sim import launch
    monkeypatch.setattr(launch, "LOG_DIR", tmp_path / "logs")
    board = load_board("cortex_m4")
    kept = []
    for text in ("first", "second", "third"):
        (tmp_path / "board.log").write_text(text)
        kept.append(launch.keep_log(board, tmp_path / "board.log", None))
    assert [p.read_text() for p in kept] == ["first", "second", "third"]
    assert all(p.parent == tmp_path / "logs" and p.name.startswith("cortex_m4-") for p in kept)


def test_a_log_that_cannot_be_kept_is_said_so(monkeypatch, capfd, tmp_path):
    """When build/logs cannot be written, the retry and the failure say the log could not be kept, and why
    (not "kept in None")."""
    from colibri.protocol import LinkTimeout
    from colibri.sim import launch
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(launch, "LOG_DIR", tmp_path / "file" / "logs")
    out = build("cortex_m4")

    def silent(board, firmware, argv, env, log_path, *rest):
        log_path.write_text("qemu said something\n")
        raise launch.BootSilent("timed out after 3.0s waiting for the device (it had sent b'')")

    monkeypatch.setattr(launch, "_boot", silent)
    with pytest.raises(LinkTimeout):
        with start_board(load_board("cortex_m4"), out / "firmware.elf", None):
            pass
    err = capfd.readouterr().err
    assert "None" not in err
    assert err.count("log could not be kept in") == 2 and "Not a directory" in err
    assert "starting it once more" in err
