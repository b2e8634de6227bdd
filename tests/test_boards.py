"""Boards as data: each board's memory map is written once, in its board.toml's [memory]; the linker regions
(build/<board>/<mode>/memory.ld), the board code's IMAGE_BASE/IMAGE_CAPACITY/ARENA_BASE/ARENA_CAPACITY, QEMU's
loader address and pack.py's fit check all come from it."""
from __future__ import annotations

import re
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


def test_a_board_silent_at_boot_is_started_once_more(monkeypatch, capfd):
    """A QEMU board that sends nothing while booting (QEMU halted with -S here; a loaded CI host once left a
    Cortex-M4 silent for 30 s) is started once more, said on stderr with its log kept; one silent every time
    fails, naming what it had sent."""
    from colibri.protocol import LinkTimeout
    from colibri.sim import launch
    out = build("cortex_m4")
    board = load_board("cortex_m4")
    monkeypatch.setattr(launch, "BOOT_TIMEOUT", 3.0)
    real_boot, argvs = launch._boot, []

    def halted_first(board, firmware, argv, *rest):
        argvs.append(argv)
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
    assert kept and (ROOT / "build" / "logs").resolve() in Path(kept.group(1)).resolve().parents

    monkeypatch.setattr(launch, "_boot", real_boot)
    with pytest.raises(LinkTimeout, match=r"it had sent b''"):
        with start_board(board, out / "firmware.elf", None, ["-S"]):
            pass
    err = capfd.readouterr().err
    assert err.count("silent while booting") == 1 and "the board's log is kept in" in err
