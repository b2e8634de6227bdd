"""Running a board's Windows program off Windows: under Wine (board.toml `wrapper = ["wine"]`).

Wine keeps its state in a prefix; Colibri's is build/wine, made once (about 7 s) under a file lock so
that parallel test workers do not each start making it. WINEDLLOVERRIDES stops a fresh prefix from
offering to install Mono and Gecko. WINEDEBUG keeps Wine's own chatter out of the board's log but not
its errors: a board that Wine could not start says why there. On Windows the program runs as it is.

Two ways a Wine program can die before it runs, each about once in 1,500 board starts when starts follow
each other closely (as in the test suite), both with status 1:
- "failed to map the shared user data: c0000018": Wine needs the fixed address of Windows' shared user
  page, and with address-space randomization something of the process may already sit there. The
  program runs under `setarch -R` (no randomization for it; util-linux, on every Debian), so nothing does
  (where setarch cannot, as in a container whose seccomp profile refuses it, the program starts without).
- "wine client error:0: recvmsg: Connection reset by peer": a wineserver that a program started ends as
  soon as its last program does, and a program that starts in that instant meets a server going away.
  So before each start a server that waits SERVER_PERSIST seconds after its last program is made sure
  of (`wineserver -p`): no server goes away between the boards of a run, and the one left ends by
  itself once Wine is not used.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from colibri.paths import ROOT

PREFIX = ROOT / "build" / "wine"
SERVER_PERSIST = 120  # seconds a wineserver started here waits for another program before it ends


def wine_env() -> dict[str, str]:
    return {**os.environ, "WINEPREFIX": str(PREFIX), "WINEDEBUG": "-all,err+all", "WINEDLLOVERRIDES": "mscoree,mshtml="}


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


def ensure_server() -> None:
    """A wineserver for the prefix that outlives its programs by SERVER_PERSIST seconds. `wineserver -p N` starts
    one in the background, or returns at once when one is running already (status 2, the expected answer: the
    running one keeps its own persistence, so the race stays possible only until it ends and ours starts).
    No pipe of ours is handed to it: it outlives this process. Without a wineserver command (Wine starts its
    own) or when it does not answer, the program starts anyway: this only makes a rare failure rarer."""
    server = shutil.which("wineserver")
    if server is None:
        return
    try:
        subprocess.run([server, f"-p{SERVER_PERSIST}"], env=wine_env(), stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass


@functools.cache
def no_aslr() -> list[str]:
    """`setarch -R` when it works here: a container's seccomp profile may refuse the personality call it makes,
    and then it fails every start (better the rare failure than that)."""
    if shutil.which("setarch") is None:
        return []
    try:
        ok = subprocess.run(["setarch", "-R", "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return ["setarch", "-R"] if ok else []


def wrap(argv: list[str], wrapper: list[str], package: str) -> tuple[list[str], dict[str, str] | None]:
    """The command and environment that run a Windows program's argv here."""
    if os.name == "nt" or not wrapper:
        return argv, None
    wine = shutil.which(wrapper[0])
    if wine is None:
        raise FileNotFoundError(f"{wrapper[0]} not found: apt-get install {package} (or run on Windows)")
    ensure_prefix(wine)
    ensure_server()
    return [*no_aslr(), wine, *wrapper[1:], *argv], wine_env()
