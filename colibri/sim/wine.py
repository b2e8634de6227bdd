"""Running a board's Windows program off Windows: under Wine (board.toml `wrapper = ["wine"]`).

Wine keeps its state in a prefix; Colibri's is build/wine, made once (about 7 s) under a file lock so
that parallel test workers do not each start making it. WINEDEBUG=-all keeps Wine's own diagnostics
out of the board's log; WINEDLLOVERRIDES stops a fresh prefix from offering to install Mono and Gecko.
On Windows the program runs as it is.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from colibri.paths import ROOT

PREFIX = ROOT / "build" / "wine"


def wine_env() -> dict[str, str]:
    return {**os.environ, "WINEPREFIX": str(PREFIX), "WINEDEBUG": "-all", "WINEDLLOVERRIDES": "mscoree,mshtml="}


def ensure_prefix(wine: str) -> None:
    """Make build/wine if it is not there yet; waits while another process makes it."""
    if (PREFIX / "system.reg").exists():
        return
    import fcntl  # POSIX only, as is this function: on Windows nothing runs under Wine

    PREFIX.parent.mkdir(parents=True, exist_ok=True)
    with open(PREFIX.parent / "wine.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (PREFIX / "system.reg").exists():
            subprocess.run([wine, "wineboot", "--init"], env=wine_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=300, check=False)
            server = shutil.which("wineserver") or "wineserver"
            subprocess.run([server, "-w"], env=wine_env(), timeout=300, check=False)  # the prefix is written out


def wrap(argv: list[str], wrapper: list[str], package: str) -> tuple[list[str], dict[str, str] | None]:
    """The command and environment that run a Windows program's argv here."""
    if os.name == "nt" or not wrapper:
        return argv, None
    wine = shutil.which(wrapper[0])
    if wine is None:
        raise FileNotFoundError(f"{wrapper[0]} not found: apt-get install {package} (or run on Windows)")
    ensure_prefix(wine)
    return [wine, *wrapper[1:], *argv], wine_env()
