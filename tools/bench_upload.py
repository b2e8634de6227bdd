#!/usr/bin/env python3
"""Image upload over the serial link (a benchmark, not a test): bytes, seconds and KB/s per board, with the
CPU time the host process and the board's process (QEMU, or the hosted program) spent during the upload, so
a slow upload shows which side it waits on.

Each run boots the board without an image, sends the payload with Client.upload (UPLOAD_BEGIN, the chunks,
UPLOAD_END and its CRC check: what `colibri run --upload` does) and times that call alone. The payload is
a packed image (--image) or seeded random bytes (--mib): the link does not look inside what it carries, and
random bytes fit every board's upload region. KB is 1000 bytes.

  python tools/bench_upload.py --board cortex_m4 --mib 2 --runs 3
  python tools/bench_upload.py --board cortex_m4 --board cortex_m55 --board riscv64_virt \\
      --board x86_64_baremetal --board hosted --json upload.json
  python tools/bench_upload.py --board cortex_m4 --image model.img

To compare with an older commit, run this file from a checkout of it (`git worktree add /tmp/old <commit>`,
copy this file into its tools/): it uses only the protocol's Client and the board launcher.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from colibri.protocol import Client  # noqa: E402
from colibri.sim.boards import load_board  # noqa: E402
from colibri.sim.launch import start_board  # noqa: E402

QEMU_BOARDS = ("cortex_m4", "cortex_m55", "riscv64_virt", "x86_64_baremetal")


@dataclass
class Run:
    seconds: float
    host_cpu_s: float          # this process (the protocol's Python, the transport's threads)
    board_cpu_s: float | None  # the board's process: QEMU (every thread) or the hosted program; None off Linux


@dataclass
class Result:
    board: str
    bytes: int
    runs: list[Run]

    @property
    def kbps(self) -> list[float]:
        return [self.bytes / r.seconds / 1000 for r in self.runs]

    def record(self) -> dict:
        rates = self.kbps
        return {"board": self.board, "bytes": self.bytes, "runs": [asdict(r) for r in self.runs],
                "seconds_median": statistics.median(r.seconds for r in self.runs),
                "kbps_median": statistics.median(rates), "kbps_min": min(rates), "kbps_max": max(rates)}


def process_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of a process, all its threads (Linux /proc), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build(board: str) -> None:
    subprocess.run([sys.executable, "-m", "SCons", "-Q", f"board={board}"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)


def upload_once(board: str, payload: Path, data: bytes, timeout: float) -> Run:
    spec = load_board(board)
    # A QEMU board boots empty (the upload region is its image region); a hosted program needs a file to
    # start with and an upload region of the payload's size.
    stdio = spec.spec["link"] == "stdio"
    image, args = (payload, ["--upload-bytes", str(len(data))]) if stdio else (None, [])
    with start_board(spec, spec.firmware(), image, args) as device:
        client = Client(device.link, timeout=timeout)
        capacity = client.info().image_capacity
        if len(data) > capacity:
            raise SystemExit(f"{board}: {len(data):,} bytes do not fit its upload region of {capacity:,} bytes")
        board_cpu, host_cpu, t0 = process_cpu_s(device.proc.pid), own_cpu_s(), time.perf_counter()
        client.upload(data)
        seconds = time.perf_counter() - t0
        host_cpu = own_cpu_s() - host_cpu
        board_after = process_cpu_s(device.proc.pid)
        client.quit()
    board_cpu = board_after - board_cpu if board_cpu is not None and board_after is not None else None
    return Run(seconds, host_cpu, board_cpu)


TABLE_HEADER = (f"{'board':<18} {'bytes':>11} {'seconds':>8} {'KB/s':>9} {'min-max':>15} {'host CPU s':>10} "
                f"{'board CPU s':>11}")


def table_row(r: Result) -> str:
    rec = r.record()
    board_cpu = [x.board_cpu_s for x in r.runs if x.board_cpu_s is not None]
    return (f"{r.board:<18} {r.bytes:>11,} {rec['seconds_median']:>8.2f} {rec['kbps_median']:>9.1f} "
            f"{rec['kbps_min']:>7.1f}-{rec['kbps_max']:<7.1f} "
            f"{statistics.median(x.host_cpu_s for x in r.runs):>10.2f} "
            f"{statistics.median(board_cpu) if board_cpu else float('nan'):>11.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--board", action="append", help=f"a board (repeatable; default: {', '.join(QEMU_BOARDS)})")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--image", type=Path, help="upload this file (a packed image)")
    what.add_argument("--mib", type=float, default=1.0, help="upload this many MiB of seeded random bytes (default 1)")
    ap.add_argument("--runs", type=int, default=3, help="uploads per board, each on a freshly booted board (default 3)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each answer (default 60)")
    ap.add_argument("--no-build", action="store_true", help="use the firmware already built")
    ap.add_argument("--json", type=Path, help="also write the records here")
    args = ap.parse_args(argv)
    boards = args.board or list(QEMU_BOARDS)
    with tempfile.TemporaryDirectory(prefix="bench-upload-") as tmp:
        if args.image:
            payload = args.image
        else:
            payload = Path(tmp) / "payload.bin"
            payload.write_bytes(random.Random(0).randbytes(int(args.mib * (1 << 20))))
        data = payload.read_bytes()
        load_before = os.getloadavg()[0]
        results = []
        print(TABLE_HEADER, flush=True)
        for board in boards:
            if not args.no_build:
                build(board)
            results.append(Result(board, len(data), [upload_once(board, payload, data, args.timeout)
                                                     for _ in range(args.runs)]))
            print(table_row(results[-1]), flush=True)
    print(f"median of {args.runs} runs; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    if args.json:
        args.json.write_text(json.dumps({"load_before": load_before, "runs": args.runs,
                                         "results": [r.record() for r in results]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
