"""Start a board with its firmware (and optionally an image) and hand back a byte-stream link.

- `hosted`: the firmware is a Linux process speaking the protocol on stdin/stdout; `hosted_windows`
  is the same program built for Windows, run under Wine off Windows (colibri/sim/wine.py).
- QEMU boards: QEMU runs the firmware with the board's arguments (boards/<name>/board.toml); its
  UART is a TCP server on a free loopback port (`-serial tcp:127.0.0.1:0,server=on,wait=on,nodelay=on`,
  the port read back from QEMU's output, no race) reached through pyserial's `socket://` (`_connect`). QEMU
  waits for the connection and the connection keeps what arrives while it is set up, so no early output is
  lost; nodelay because the guest writes its answers a byte
  at a time, and Nagle's algorithm held each answer's tail for the host's delayed ACK (about 40 ms a
  request). The image is placed in RAM by QEMU's loader
  unless the caller uploads it over the link.
- a real board: `open_port()` wraps a serial port in the same transport.

The child process is always cleaned up (also on Ctrl-C and on errors). Its output (QEMU's
messages, what the board printed before serving the protocol) is shown in errors and, when a
session fails, kept in build/logs/.
"""
from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import serial

from colibri.protocol import Client, DeviceError, LinkClosed, LinkError, LinkTimeout
from colibri.paths import ROOT
from colibri.sim.boards import Board, memory_region
from colibri.sim.wine import wrap

CONNECT_TIMEOUT = 15.0
BOOT_TIMEOUT = 30.0
BOOT_ATTEMPTS = 2


class _Line:
    """Whether stdout holds a line not yet ended (colibri run's `[board] prompt -> ` and the tokens after it)."""
    open = False


def line_open(is_open: bool) -> None:
    """Say that stdout's line is (or is no longer) waiting for its end."""
    _Line.open = is_open


def below(line: str) -> str:
    """`line` for stderr, put below a line stdout has not ended (on a terminal they share the screen)."""
    start = "\n" if _Line.open else ""
    _Line.open = False
    return start + line


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_problem(board: Board, upload: bool = False, gdb: bool = False) -> str | None:
    """Why `board` cannot be started as asked, found before anything is started or printed: --upload or --gdb on a
    board that is a process, a QEMU that is not installed; None when it can be."""
    spec = board.spec
    if spec["link"] == "stdio":
        if upload:
            return (f"--upload sends the image over a QEMU board's serial link; board {board.name} is a process that "
                    "reads the image file itself: leave out --upload")
        if gdb:
            return (f"--gdb starts QEMU halted with a GDB stub; board {board.name} is a process: run it under a "
                    f"debugger yourself (gdb --args {board.firmware()} IMAGE)")
        if spec.get("wrapper") and os.name != "nt" and shutil.which(spec["wrapper"][0]) is None:
            return (f"{spec['wrapper'][0]} not found: apt-get install {spec.get('wrapper_package', '')} (or run on "
                    "Windows)")
        return None
    if shutil.which(spec["qemu"]) is None:
        return f"{spec['qemu']} not found: apt-get install {spec['qemu_package']}"
    return None


def firmware_problem(board: Board, firmware: Path) -> str | None:
    """Why `firmware` cannot be booted on `board` (missing, a directory, not executable for a process board)."""
    if firmware.is_dir():
        return f"firmware {firmware} is a directory: give the firmware file, such as {board.firmware()}"
    if not firmware.is_file():
        return f"firmware {firmware} not found: build it with `colibri build --board {board.name}`"
    if board.spec["link"] == "stdio" and os.name != "nt" and not board.spec.get("wrapper") \
            and not os.access(firmware, os.X_OK):
        return f"firmware {firmware} is not executable: give the board's firmware program, such as {board.firmware()}"
    if not os.access(firmware, os.R_OK):
        return f"firmware {firmware}: you may not read it"
    return None


class BootSilent(LinkTimeout):
    """A board sent nothing at all before the boot timeout (not even part of its banner)."""


class SerialTransport:
    """The protocol's byte stream over a pyserial port (`socket://` for QEMU, or a real UART)."""

    def __init__(self, port: serial.SerialBase, describe: Callable[[], str] = lambda: ""):
        self.port = port
        self.port.timeout = 0.05  # set once: changing it reconfigures the port, which fails once the peer is gone
        self.describe = describe

    def read(self, n: int, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LinkTimeout(f"timed out after {timeout:.1f}s waiting for the device")
            try:
                buf += self.port.read(n - len(buf))
            except serial.SerialException as exc:
                raise LinkClosed(f"serial link failed: {exc}{self.describe()}") from None
        return bytes(buf)

    def write(self, data: bytes) -> None:
        try:
            self.port.write(data)
        except serial.SerialException as exc:
            raise LinkClosed(f"serial link failed: {exc}{self.describe()}") from None

    def read_until_text(self, marker: bytes, timeout: float) -> bytes:
        """Bytes up to and including `marker` (a board's ready banner). BootSilent when nothing came at all."""
        seen = bytearray()
        while marker not in seen:
            try:
                seen += self.read(1, timeout)
            except LinkTimeout as exc:
                raise (LinkTimeout if seen else BootSilent)(f"{exc} (it had sent {bytes(seen)!r})") from None
        return bytes(seen)


class PipeTransport:
    """The protocol's byte stream over a child process's stdin/stdout (the hosted boards). A thread reads
    the pipe as bytes arrive, so a read with a timeout works the same on Windows, where select() does
    not take pipes."""

    def __init__(self, proc: subprocess.Popen, describe: Callable[[], str]):
        self.proc = proc
        self.describe = describe
        self.buf = bytearray()
        self.chunks: queue.Queue[bytes] = queue.Queue()
        self.ended = False
        threading.Thread(target=self._pump, args=(proc.stdout.fileno(),), daemon=True).start()

    def _pump(self, fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                chunk = b""
            self.chunks.put(chunk)
            if not chunk:  # end of stream: the board closed its stdout
                return

    def read(self, n: int, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self.buf) < n:
            if self.ended:
                raise LinkClosed(f"device closed the link{self.describe()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise LinkTimeout(f"timed out after {timeout:.1f}s waiting for the device")
            try:
                chunk = self.chunks.get(timeout=left)
            except queue.Empty:
                continue
            if not chunk:
                self.ended = True
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                continue
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def write(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise LinkClosed(f"device closed the link{self.describe()}") from None


def exit_meaning(board: Board, status: int | None) -> str:
    """What a board process's exit status says about the guest."""
    if status is None:
        return "still running"
    if board.spec.get("exit") == "isa-debug-exit":
        if status == 0:
            return "status 0: triple fault or reset (the guest cannot exit with 0)"
        code = status >> 1
        if 64 <= code < 96:
            return f"guest code {code}: CPU exception vector {code - 64}"
        return f"guest code {code}"
    if board.spec.get("exit") == "semihosting":
        return {127: "guest code 127: HardFault", 126: "guest code 126: unexpected exception",
                134: "QEMU aborted (lockup; is semihosting enabled?)"}.get(status, f"guest code {status}")
    if board.spec.get("exit") == "sifive-test":
        return {127: "guest code 127: trap"}.get(status, f"guest code {status}")
    return f"exit status {status}"


@dataclass
class Device:
    """A running board: its link, and after the session its exit status and log."""
    board: Board
    link: SerialTransport | PipeTransport
    log_path: Path
    proc: subprocess.Popen | None = None
    exit_status: int | None = None
    notes: list[str] = field(default_factory=list)

    def log(self, tail: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def describe(self) -> str:
        status = self.proc.poll() if self.proc else None
        state = f"; board process: {exit_meaning(self.board, status)}" if status is not None else ""
        log = self.log().strip()
        return f"{state}\n--- {self.board.name} log ---\n{log}" if log else state

    @property
    def guest_code(self) -> int | None:
        """The code the guest asked to exit with, if it exited cleanly through the board's exit path."""
        if self.exit_status is None:
            return None
        if self.board.spec.get("exit") == "isa-debug-exit":
            return self.exit_status >> 1 if self.exit_status & 1 else None
        return self.exit_status


def _kernel(board: Board, firmware: Path) -> Path:
    return firmware.with_suffix(".kernel") if "kernel_objcopy" in board.spec else firmware


def qemu_command(board: Board, firmware: Path, image: Path | None, gdb: int = 0) -> list[str]:
    """QEMU's command line; `gdb`: the port of a GDB stub to start it halted with (0: none)."""
    spec = board.spec
    cmd = [spec["qemu"], *spec["qemu_args"], "-kernel", str(_kernel(board, firmware)),
           "-serial", "tcp:127.0.0.1:0,server=on,wait=on,nodelay=on"]
    if image is not None:
        if spec["image_loader"] == "multiboot":
            cmd += ["-initrd", str(image)]
        elif spec["image_loader"] == "device-loader":
            cmd += ["-device", f"loader,file={image},addr={memory_region(spec, 'image').origin:#x},force-raw=on"]
        else:
            raise ValueError(f"board {board.name}: unknown image_loader {spec['image_loader']!r}")
    if gdb:
        cmd += ["-S", "-gdb", f"tcp:127.0.0.1:{gdb}"]
    return cmd


def _wait_for_port(proc: subprocess.Popen, log_path: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    pattern = re.compile(rb"waiting for connection on: disconnected:tcp:127\.0\.0\.1:(\d+)")
    while time.monotonic() < deadline:
        m = pattern.search(log_path.read_bytes())
        if m:
            return int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    raise LinkError(f"QEMU did not open its serial port (status {proc.poll()}):\n{log_path.read_text(errors='replace')}")


def _connect(port: int) -> serial.SerialBase:
    """pyserial's `socket://` link to QEMU's UART on `port`, keeping what arrived while it was set up: pyserial's
    open() ends with reset_input_buffer(), which reads and drops whatever has already arrived, and QEMU (wait=on)
    starts the guest as soon as it accepts the connection, so a host descheduled for ~20 ms there lost the ready
    banner (a Cortex-M4 then looked silent for the whole boot timeout)."""
    conn = serial.serial_for_url(f"socket://127.0.0.1:{port}", do_not_open=True)
    conn.reset_input_buffer = lambda: None  # type: ignore[method-assign]  # for open() only
    try:
        conn.open()
    finally:
        del conn.reset_input_buffer
    return conn


LOG_DIR = ROOT / "build" / "logs"


def keep_log(board: Board, log_path: Path, device: Device | None) -> Path:
    """Copy a failed session's board log (QEMU's messages, what the board printed) to a file of its own in
    build/logs/ (board, time and pid, numbered when two failures share a second). OSError when it cannot."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    notes = "\n".join(device.notes) if device else ""
    text += ("\n--- board output before the protocol ---\n" + notes) if notes else ""
    stem = f"{board.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for n in range(1, 10_000):
        kept = LOG_DIR / (f"{stem}.log" if n == 1 else f"{stem}-{n}.log")
        try:
            with open(kept, "x") as f:  # never another failure's file
                f.write(text)
            return kept
        except FileExistsError:
            continue
    raise FileExistsError(f"{LOG_DIR / stem}-*.log: all taken")


def _keep(board: Board, log_path: Path, device: Device | None, whose: str = "the board's") -> str:
    """keep_log, said: "<whose> log is kept in <file>" or why it could not be."""
    try:
        return f"{whose} log is kept in {keep_log(board, log_path, device)}"
    except OSError as exc:
        return f"{whose} log could not be kept in {LOG_DIR} ({exc})"


def _boot(board: Board, firmware: Path, argv: list[str], env: dict[str, str] | None, log_path: Path, gdb: int,
          protocol: bool) -> Device:
    """Start the board's process and, on a QEMU board, wait for its ready banner (and answer to INFO). `gdb`: the
    port of the GDB stub QEMU was started halted with (0: none)."""
    stdio = board.spec["link"] == "stdio"
    # In a process group of its own: Ctrl-C in the terminal reaches the host alone, which stops the board (an
    # interactive chat goes on with it after ending an answer)
    group = {"process_group": 0} if os.name == "posix" else {}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdio else subprocess.DEVNULL,
                                stdout=subprocess.PIPE if stdio else log, stderr=log, bufsize=0, env=env, **group)
    device = Device(board, None, log_path, proc)  # type: ignore[arg-type]
    try:
        if stdio:
            device.link = PipeTransport(proc, device.describe)
            return device
        port = _wait_for_port(proc, log_path, CONNECT_TIMEOUT)
        device.link = SerialTransport(_connect(port), device.describe)
        if gdb:
            # Debian's plain gdb knows only the host's architecture; gdb-multiarch debugs Arm and RISC-V too
            debugger = "gdb" if board.spec["toolchain"] == "host" or board.spec["cc"] == "gcc" else "gdb-multiarch"
            print(below(f"QEMU is halted with a GDB stub on 127.0.0.1:{gdb}. Attach with (apt-get install "
                        f"{debugger}):\n  {debugger} {firmware} -ex 'target remote 127.0.0.1:{gdb}' -ex continue"),
                  flush=True)
        banner = device.link.read_until_text(board.spec["ready"].encode(), 3600.0 if gdb else BOOT_TIMEOUT)
        device.notes.append(banner.decode(errors="replace").strip())
        # The first request after boot waits for QEMU's main loop on the Cortex-M boards' UART model (about
        # a second: docs/BOARDS.md). One INFO with the boot timeout absorbs that wait, so the caller's own
        # timeouts measure the link; INFO changes nothing on the device, and its protocol version is checked.
        if protocol:
            Client(device.link, timeout=3600.0 if gdb else BOOT_TIMEOUT, retries=0).info()
        return device
    except BaseException:
        _stop(device)
        raise


def _stop(device: Device) -> None:
    try:
        if device.proc.poll() is None:
            device.proc.kill()
        device.exit_status = device.proc.wait()
    finally:  # also on Ctrl-C while waiting
        if isinstance(device.link, SerialTransport):
            device.link.port.close()


@contextmanager
def start_board(board: Board, firmware: Path, image: Path | None, extra_args: list[str] | None = None,
                gdb: bool = False, protocol: bool = True) -> Iterator[Device]:
    """Run `firmware` on `board`. With image=None a QEMU board boots without one (upload it). `protocol`: the
    firmware serves the protocol (not a program such as kernel_check, which prints its own report).

    A QEMU board that sends nothing at all for BOOT_TIMEOUT while booting (BootSilent) is started once more, said
    on stderr with its log kept. A safety net: the one such boot seen (a CI run of over a thousand) was most
    likely its banner dropped while connecting, which _connect no longer does; nothing the firmware does before
    its banner takes that long, so a second silence, or a board that printed something else, is an error."""
    if not firmware.exists():
        raise FileNotFoundError(f"firmware {firmware} not found: build it with `scons board={board.name}`")
    with tempfile.TemporaryDirectory(prefix="colibri-") as tmp:
        if image is not None and board.spec["link"] == "qemu" and re.search(r"[, ]", str(image)):
            # QEMU's -initrd splits on ',' and ' '
            safe = Path(tmp) / "image.bin"
            os.symlink(image.resolve(), safe)
            image = safe
        if board.spec["link"] == "stdio":
            if image is None:
                raise ValueError(f"board {board.name} needs an image file")
            argv = [a.format(firmware=firmware, image=image) for a in board.spec["run"]] + (extra_args or [])
            argv, env = wrap(argv, board.spec.get("wrapper", []), board.spec.get("wrapper_package", ""))
        else:
            if shutil.which(board.spec["qemu"]) is None:
                raise FileNotFoundError(f"{board.spec['qemu']} not found: apt-get install {board.spec['qemu_package']}")
            gdb = free_port() if gdb else 0  # never a fixed port another session (or a debugger left open) holds
            argv, env = qemu_command(board, firmware, image, gdb) + (extra_args or []), None
        attempts = BOOT_ATTEMPTS if board.spec["link"] == "qemu" and not gdb else 1
        for attempt in range(1, attempts + 1):
            log_path = Path(tmp) / f"board-{attempt}.log"
            try:
                device = _boot(board, firmware, argv, env, log_path, gdb, protocol)
                break
            except BootSilent as exc:
                if attempt == attempts:
                    print(below(f"{board.name}: {_keep(board, log_path, None)}"), file=sys.stderr)
                    raise
                print(below(f"{board.name}: silent while booting ({exc}); {_keep(board, log_path, None, 'its')}; "
                            "starting it once more"), file=sys.stderr)
            except (DeviceError, FileNotFoundError, KeyboardInterrupt):
                raise
            except BaseException:
                print(below(f"{board.name}: {_keep(board, log_path, None)}"), file=sys.stderr)
                raise
        try:
            yield device
            try:  # a clean QUIT ends the process by itself
                device.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        except (DeviceError, KeyboardInterrupt):
            raise  # the board answered properly, or the user stopped it: nothing to debug on its side
        except BaseException:
            print(below(f"{board.name}: {_keep(board, log_path, device)}"), file=sys.stderr)
            raise
        finally:
            _stop(device)


def port_error(port: str, exc: Exception) -> str:
    """What pyserial says of a port it could not open, without what the caller says already: its "[Errno 2] could
    not open port X: [Errno 2] No such file or directory: 'X'" is "No such file or directory"."""
    text = str(exc)
    text = re.sub(r"^(\[Errno \d+\] )?could not open port " + re.escape(port) + r": ", "", text, flags=re.I)
    text = re.sub(r"^\[Errno \d+\] ", "", text)
    return re.sub(r": '" + re.escape(port) + r"'$", "", text)


@contextmanager
def open_port(port: str, baud: int) -> Iterator[SerialTransport]:
    """A real board on a serial port: same protocol, image uploaded over the link. `port` is a device path
    (/dev/ttyUSB0, COM3) or one of pyserial's URLs: socket://HOST:PORT (a raw TCP serial server such as ser2net's),
    rfc2217://HOST:PORT (a serial port shared with RFC 2217)."""
    try:
        conn = serial.serial_for_url(port, baud)
    except (serial.SerialException, ValueError) as exc:
        raise LinkError(f"cannot open {port}: {port_error(port, exc)}") from None
    try:
        yield SerialTransport(conn, lambda: f" on {port}")
    finally:
        conn.close()
