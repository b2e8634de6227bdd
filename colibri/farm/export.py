"""QEMU boards as farm boards: `colibri farm export --boards cortex_m55,riscv64_virt`.

Each board is one QEMU running the board's Colibri firmware (optionally with an image preloaded by QEMU's loader).
Its UART is a TCP server (`-serial tcp:HOST:PORT,server=on,wait=on`) that labgrid's exporter publishes as a
`NetworkSerialPort` with protocol `raw`: QEMU already is a network serial server, so no ser2net is needed
between them (a real board's USB serial adapter is exported through ser2net by the same exporter: docs/FARM.md).
`wait=on` keeps the guest stopped until a client connects, so an idle farm costs no CPU (the RISC-V board polls
its UART).

The firmware ends its process after a session's QUIT (a real board would wait for a reset), so a supervisor
thread per board starts QEMU again on the same port whenever it ends. Each board also has a power switch, a
`NetworkPowerPort` of labgrid's `rest` model served here over HTTP: off stops QEMU, on starts it, so a client
resets a farm board before a run exactly as it resets a real one behind a network power switch.

Every child process (QEMU, the exporter) is killed with this process, even when it is killed itself (Linux's
parent-death signal), and the places it created are deleted when it stops.
"""
from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from colibri.farm import FarmError
from colibri.farm.coordinator import Coordinator
from colibri.sim.boards import Board
from colibri.sim.launch import qemu_command

LISTEN_TIMEOUT = 15.0  # QEMU opening its serial port
EXPORT_TIMEOUT = 30.0  # the exporter's resources reaching the coordinator
QUICK_EXIT_S = 2.0  # a QEMU that fails this soon after starting, QUICK_EXITS times in a row, is broken
QUICK_EXITS = 5
IDLE_RESTART_S = 10.0  # a guest left running with no client this long is started again, back to waiting
SPEED = 115200  # what the NetworkSerialPort says; QEMU's UARTs take any rate


# Looked up here, not in the child: between fork and exec a child of a threaded process may not load libraries
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that started it ends (prctl PR_SET_PDEATHSIG)."""
    _prctl(1, signal.SIGKILL)


def spawn(argv: list[str], log: Path, **kwargs) -> subprocess.Popen:
    """A child that dies with this process, in a process group of its own (Ctrl-C on the terminal reaches this
    process alone, which stops its children in order)."""
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent if _prctl else None,
                                process_group=0, **kwargs)


def connected(port: int) -> bool | None:
    """Whether a TCP connection to this local port is established (Linux's /proc/net/tcp{,6}); None where that
    cannot be read."""
    found = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        found = bool(found)
        for line in lines:
            fields = line.split()
            if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # ESTABLISHED, our port
                return True
    return found


def clean_exit(board: Board, status: int) -> bool:
    """Whether QEMU's exit status is the guest's own exit with code 0 (the firmware's end after QUIT)."""
    return status == (1 if board.spec.get("exit") == "isa-debug-exit" else 0)  # isa-debug-exit: (code << 1) | 1


class QemuBoard:
    """One board under QEMU whose UART stays at one TCP port: started again whenever it ends while its power is
    on. Only the supervisor thread starts and stops QEMU (the parent-death signal follows the thread that
    started a child, so a short-lived thread must not)."""

    def __init__(self, place: str, board: Board, firmware: Path, image: Path | None, host: str, workdir: Path):
        self.place, self.board, self.firmware, self.image, self.host = place, board, firmware, image, host
        self.workdir = workdir
        self.port: int | None = None  # chosen by QEMU at the first start, kept after
        self.powered = True
        self.broken: str | None = None
        self.starts = 0
        self.proc: subprocess.Popen | None = None
        self._applied = False
        self._stopping = False
        self._quick_exits = 0
        self._started_at = 0.0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._supervise, name=f"qemu-{place}", daemon=True)

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.place}.log"

    def url(self) -> str:
        return f"socket://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = qemu_command(self.board, self.firmware, self.image)
        cmd[cmd.index("-serial") + 1] = f"tcp:{self.host}:{self.port or 0},server=on,wait=on,nodelay=on"
        return cmd

    def start(self) -> None:
        """Start QEMU and return once its serial port listens."""
        self._thread.start()
        self._wait_applied(LISTEN_TIMEOUT)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def set_power(self, on: bool, timeout: float = LISTEN_TIMEOUT) -> None:
        """Power the board off (QEMU stopped) or on (QEMU started, its port listening) and return when it is so."""
        with self._cond:
            self.powered = on
            self._applied = False
            if on:
                self.broken, self._quick_exits = None, 0  # switching it on is the way to try a broken board again
            self._cond.notify_all()
        self._wait_applied(timeout)

    def _wait_applied(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._applied and not self.broken:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FarmError(f"{self.place}: QEMU did not open its serial port in {timeout:.0f} s "
                                    f"(log: {self.log})")
                self._cond.wait(left)
            if self.broken:
                raise FarmError(f"{self.place}: {self.broken}")

    def _supervise(self) -> None:
        with self._cond:
            while not self._stopping:
                if self.proc is not None and self.proc.poll() is not None:  # a QUIT, a crash, or killed
                    failed = not clean_exit(self.board, self.proc.returncode)
                    quick = failed and time.monotonic() - self._started_at < QUICK_EXIT_S
                    self._quick_exits = self._quick_exits + 1 if quick else 0
                    self.proc = None
                    if self._quick_exits >= QUICK_EXITS:
                        self.broken = (f"QEMU ended {QUICK_EXITS} times within {QUICK_EXIT_S:.0f} s of starting; "
                                       f"not started again until powered on (log: {self.log})")
                        print(f"colibri farm export: {self.place}: {self.broken}", file=sys.stderr, flush=True)
                if self.powered and self.proc is None and not self.broken:
                    try:
                        self._spawn()
                    except FarmError as exc:
                        self.broken = str(exc)
                if not self.powered and self.proc is not None:
                    self._kill()
                if self.proc is not None and self._abandoned():
                    self._kill()  # started again by the next round, its guest stopped until a client comes
                self._applied = True
                self._cond.notify_all()
                self._cond.wait(0.05)  # wakes on a power command; else looks for an ended QEMU this often
            if self.proc is not None:
                self._kill()

    def _abandoned(self) -> bool:
        """Whether the guest has kept a core busy with nobody connected for IDLE_RESTART_S: a session that ended
        without QUIT (a client killed, a link cut) leaves a guest polling its UART. Checked once a second from QEMU's
        CPU time (an idle QEMU waiting for its first connection, or a guest asleep in WFI, uses next to none)."""
        now = time.monotonic()
        if now - self._checked < 1.0:
            return False
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        except (OSError, ValueError, IndexError):
            return False
        busy = (cpu - self._cpu) / (now - self._checked) > 0.5 if self._checked else False
        self._checked, self._cpu = now, cpu
        if not busy or connected(self.port) is not False:
            self._busy_since = None
            return False
        self._busy_since = self._busy_since or now
        return now - self._busy_since > IDLE_RESTART_S

    def _spawn(self) -> None:
        self.proc = spawn(self.command(), self.log)
        self._started_at = time.monotonic()
        self._checked, self._cpu, self._busy_since = 0.0, 0.0, None  # for _abandoned
        self.starts += 1
        pattern = re.compile(rb"waiting for connection on: disconnected:tcp:[^:]+:(\d+)")
        deadline = time.monotonic() + LISTEN_TIMEOUT
        while time.monotonic() < deadline:
            m = pattern.search(self.log.read_bytes())
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        self._kill()
        raise FarmError(f"QEMU did not open its serial port: {self.log.read_text(errors='replace').strip()[-500:]}")

    def _kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc = None


class PowerServer:
    """The farm's power switch: labgrid's `rest` power model (GET the state, PUT 0 or 1) at
    http://HOST:PORT/power/<index>, one index per board."""

    def __init__(self, boards: list[QemuBoard], host: str):
        farm = boards

        class Handler(BaseHTTPRequestHandler):
            def _board(self) -> QemuBoard | None:
                m = re.fullmatch(r"/power/(\d+)", self.path)
                return farm[int(m.group(1))] if m and int(m.group(1)) < len(farm) else None

            def _answer(self, code: int, body: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                board = self._board()
                if board is None:
                    return self._answer(404, "no such power port")
                self._answer(200, "1" if board.powered and not board.broken else "0")

            def do_PUT(self) -> None:  # noqa: N802
                board = self._board()
                value = self.rfile.read(int(self.headers.get("Content-Length") or 0)).strip()
                if board is None or value not in (b"0", b"1"):
                    return self._answer(404 if board is None else 400, "PUT 0 or 1 to /power/<index>")
                try:
                    board.set_power(value == b"1")
                except FarmError as exc:
                    return self._answer(500, str(exc))
                self._answer(200, value.decode())

            def log_message(self, format: str, *args) -> None:  # noqa: A002  (quiet: the farm prints its own)
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.host = host
        self._thread = threading.Thread(target=self.server.serve_forever, name="farm-power", daemon=True)
        self._thread.start()

    def url(self) -> str:
        return f"http://{self.host}:{self.server.server_address[1]}/power/{{index}}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def check_names(coordinator: Coordinator, name: str, places: list[str]) -> list[str]:
    """Before anything starts: no exporter of this name connected (the coordinator would refuse ours, and its places
    are someone's), and each place name free or a place made for our exporter's resources (one an earlier export
    kept: used as it is, never retagged nor deleted); those places. FarmError in one line otherwise."""
    if coordinator.exporter_connected(name):
        raise FarmError(f"an exporter named {name} is already connected to the coordinator at {coordinator.address} "
                        "(another farm export?): give this one another --name")
    there = coordinator.places()
    reused = []
    for place in places:
        if place not in there:
            continue
        if f"{name}/{place}/*" not in there[place].matches:
            raise FarmError(f"place {place} already exists at the coordinator at {coordinator.address} for other "
                            f"resources ({', '.join(there[place].matches) or 'none'}): give this export another "
                            f"--name, or delete the place (labgrid-client -p {place} delete)")
        reused.append(place)
    return reused


@dataclass(frozen=True)
class ExportedBoard:
    place: str
    board: str
    serial: str
    power: str


def place_names(prefix: str, boards: list[str]) -> list[str]:
    """`prefix-board`, numbered from the second of a kind (`qemu-riscv64_virt`, `qemu-riscv64_virt-2`)."""
    seen: dict[str, int] = {}
    names = []
    for board in boards:
        seen[board] = seen.get(board, 0) + 1
        names.append(f"{prefix}-{board}" + (f"-{seen[board]}" if seen[board] > 1 else ""))
    return names


class QemuFarm:
    """QEMU boards exported to a labgrid coordinator, with their places; a context manager that stops
    everything (QEMU, the power server, the exporter, the places) on the way out."""

    def __init__(self, coordinator: str, boards: list[Board], firmwares: list[Path], image: Path | None = None,
                 name: str = "qemu", host: str = "127.0.0.1", keep_places: bool = False):
        self.coordinator_address, self.name, self.host, self.keep_places = coordinator, name, host, keep_places
        self.kinds = boards
        self.firmwares = firmwares
        self.image = image
        self.places = place_names(name, [b.name for b in boards])
        self.boards: list[QemuBoard] = []
        self.exporter: subprocess.Popen | None = None
        self.reused: list[str] = []  # places that were at the coordinator already: used as they are, kept on exit
        self._stack = ExitStack()
        self.workdir = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="colibri-farm-")))

    def __enter__(self) -> "QemuFarm":
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _check_names(self, coordinator: Coordinator) -> None:
        self.reused = check_names(coordinator, self.name, self.places)

    def _start(self) -> None:
        coordinator = self._stack.enter_context(Coordinator(self.coordinator_address))
        self._check_names(coordinator)
        image = None
        if self.image is not None:  # QEMU's -initrd splits its file name at ',' and ' '
            image = self.workdir / "image.bin"
            os.symlink(self.image.resolve(), image)
        for place, board, firmware in zip(self.places, self.kinds, self.firmwares):
            qemu = QemuBoard(place, board, firmware, image, self.host, self.workdir)
            self.boards.append(qemu)
            self._stack.callback(qemu.stop)
        for qemu in self.boards:
            qemu.start()
        power = PowerServer(self.boards, self.host)
        self._stack.callback(power.stop)
        config = self.workdir / "exporter.yaml"
        groups = {place: {"location": f"QEMU {qemu.board.name} (colibri farm export)",
                          "console": {"cls": "NetworkSerialPort", "host": self.host, "port": qemu.port,
                                      "speed": SPEED, "protocol": "raw"},
                          "power": {"cls": "NetworkPowerPort", "model": "rest", "host": power.url(), "index": i}}
                  for i, (place, qemu) in enumerate(zip(self.places, self.boards))}
        import yaml
        config.write_text(yaml.safe_dump(groups, sort_keys=False))
        log = self.workdir / "exporter.log"
        self.exporter = spawn([sys.executable, "-m", "labgrid.remote.exporter", "--coordinator",
                               self.coordinator_address, "--name", self.name, "--hostname", self.host, str(config)],
                              log, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self._stack.callback(self._stop_exporter)
        self._wait_published(coordinator)
        for place, qemu in zip(self.places, self.boards):
            if place in self.reused:
                continue
            coordinator.create_place(place)
            if not self.keep_places:  # ours from here on: deleted on the way out, whatever stops the farm
                self._stack.callback(self._delete_place, coordinator, place)
            coordinator.set_up_place(place, {"board": qemu.board.name, "power_delay": "0"},
                                     [f"{self.name}/{place}/*"],
                                     comment=f"QEMU {qemu.board.name} exported by colibri farm export")

    def _wait_published(self, coordinator: Coordinator) -> None:
        """Until our exporter's resources are at the coordinator, available, and ours (each console at our QEMU's
        port: an exporter of the same name elsewhere publishes groups of the same names); FarmError in one line
        when the exporter ends first (the coordinator refused it) or the time runs out."""
        want = {place: qemu.port for place, qemu in zip(self.places, self.boards)}
        deadline = time.monotonic() + EXPORT_TIMEOUT
        while True:
            have = {g: r.args.get("port") for (e, g, n), r in coordinator.resources(self.name).items()
                    if n == "console" and r.avail}
            if all(have.get(place) == port for place, port in want.items()):
                return
            if self.exporter.poll() is not None:
                raise FarmError(f"the labgrid exporter ended at its start ({self._exporter_said()}); its log: "
                                f"{self.keep_log()}")
            if time.monotonic() > deadline:
                missing = ", ".join(p for p, port in want.items() if have.get(p) != port)
                raise FarmError(f"the exporter {self.name} did not publish {missing} to the coordinator at "
                                f"{self.coordinator_address} within {EXPORT_TIMEOUT:.0f} s; its log: {self.keep_log()}")
            time.sleep(0.1)

    def _exporter_said(self) -> str:
        """labgrid's own words for why the exporter ended: the coordinator's answer (gRPC's `details`), else the
        log's last line that is not part of a traceback."""
        log = (self.workdir / "exporter.log").read_text(errors="replace")
        details = re.findall(r'details = "(.*)"', log)
        if details:
            return details[-1][:300]
        lines = [line.strip() for line in log.splitlines()
                 if line.strip() and not line.startswith((" ", "\t", "Traceback", ">"))]
        return lines[-1][:300] if lines else f"status {self.exporter.returncode}, nothing logged"

    def keep_log(self) -> Path:
        """The exporter's log copied out of the working folder (which goes when the farm stops): its path."""
        kept = Path(tempfile.gettempdir()) / f"colibri-farm-{self.name}-{os.getpid()}-exporter.log"
        try:
            kept.write_bytes((self.workdir / "exporter.log").read_bytes())
        except OSError:
            return self.workdir / "exporter.log"
        return kept

    @staticmethod
    def _delete_place(coordinator: Coordinator, place: str) -> None:
        try:
            coordinator.delete_place(place)
        except Exception:  # noqa: BLE001  (stopping: the coordinator may be gone)
            pass

    def _stop_exporter(self) -> None:
        if self.exporter.poll() is None:
            self.exporter.send_signal(signal.SIGTERM)  # it says goodbye to the coordinator
            try:
                self.exporter.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.exporter.kill()
        self.exporter.wait()

    def exported(self) -> list[ExportedBoard]:
        return [ExportedBoard(b.place, b.board.name, b.url(), f"rest /power/{i}") for i, b in enumerate(self.boards)]

    def wait(self) -> None:
        """Until the exporter ends (it does when the coordinator goes away) or Ctrl-C / SIGTERM / SIGHUP; then
        FarmError in one line: the coordinator gone, or the exporter's own last word, and where its log is."""
        while self.exporter.poll() is None:
            time.sleep(0.2)
        if not reachable(self.coordinator_address):
            raise FarmError(f"the coordinator at {self.coordinator_address} went away, and the exporter with it; "
                            f"the boards are stopped (exporter log: {self.keep_log()})")
        raise FarmError(f"the labgrid exporter ended ({self._exporter_said()}); the boards are stopped (its log: "
                        f"{self.keep_log()})")


def reachable(address: str, timeout: float = 2.0) -> bool:
    """Whether something accepts TCP connections at HOST:PORT (the coordinator's default port when none)."""
    import socket
    from urllib.parse import urlsplit
    parts = urlsplit(f"//{address}")
    try:
        with socket.create_connection((parts.hostname, parts.port or 20408), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False
