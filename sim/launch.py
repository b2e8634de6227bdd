"""Start a board with its firmware and an image, and give back a byte-stream transport to it.

The hosted board runs as a child process speaking the protocol on stdin/stdout. The process is
always cleaned up (also on Ctrl-C and on errors); its stderr is kept for error reports.
"""
from __future__ import annotations

import os
import select
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from host.protocol import LinkError
from sim.boards import Board


class PipeTransport:
    """The protocol's byte stream over a child process's stdin/stdout."""

    def __init__(self, proc: subprocess.Popen, stderr_path: Path):
        self.proc = proc
        self.stderr_path = stderr_path
        self.rfd = proc.stdout.fileno()
        self.buf = bytearray()

    def device_log(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def read(self, n: int, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LinkError(f"timed out after {timeout:.1f}s waiting for the device")
            ready, _, _ = select.select([self.rfd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.rfd, 1 << 16)
            if not chunk:
                code = self.proc.wait(timeout=5)
                raise LinkError(f"device closed the link (exit status {code}); device log:\n{self.device_log()}")
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def write(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise LinkError(f"device closed the link; device log:\n{self.device_log()}") from None


@contextmanager
def start_board(board: Board, firmware: Path, image: Path, extra_args: list[str] | None = None) -> Iterator[PipeTransport]:
    if not firmware.exists():
        raise FileNotFoundError(f"firmware {firmware} not found: build it with `scons board={board.name}`")
    if board.spec["link"] != "stdio":
        raise NotImplementedError(f"board {board.name}: link {board.spec['link']!r} is not supported yet")
    argv = [a.format(firmware=firmware, image=image) for a in board.spec["run"]] + (extra_args or [])
    with tempfile.TemporaryDirectory(prefix="colibri-") as tmp:
        stderr_path = Path(tmp) / "device.stderr"
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, bufsize=0)
        try:
            yield PipeTransport(proc, stderr_path)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
