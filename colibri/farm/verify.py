"""One image and prompt on many farm places at once, each run checked against the numpy reference bit for bit.

Each place runs in a thread of its own: it is held (reserved, acquired, reset), the image reaches the board
(uploaded over the place's serial port, unless the board already holds it: a board whose OPEN reports the same
size and payload CRC, such as a QEMU board exported with the image preloaded), the prompt runs with every
position's logits, and the place is released. The threads spend their time waiting on serial links, so a farm
run takes about as long as its slowest board, not the sum of them.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from colibri.farm import FarmError
from colibri.farm.coordinator import Coordinator
from colibri.farm.place import HeldPlace, Holdings, hold_place
from colibri.flash import RunResult, Verification, run_session, verify
from colibri.image import ImageError, open_image, read_image
from colibri.protocol import Client, DeviceError, LinkError, Sampling, status_name
from colibri.reference import Reference
from colibri.sim.launch import open_port


@dataclass
class PlaceRun:
    """One place's part of a farm run: what ran, how fast, and whether it agreed with the reference."""
    place: str
    board: str = ""
    reset: str = ""
    uploaded: bool | None = None  # None: the run did not get that far
    seconds: float = 0.0  # wall time from asking for the place to releasing it
    result: RunResult | None = None
    verification: Verification | None = None
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and self.verification is not None and self.verification.passed

    @property
    def decode_tok_s(self) -> float | None:
        return (self.result.timing or {}).get("decode_tok_s") if self.result else None

    @property
    def prompt_tok_s(self) -> float | None:
        return (self.result.timing or {}).get("prompt_tok_s") if self.result else None

    def as_json(self) -> dict:
        v = self.verification
        return {"place": self.place, "board": self.board, "reset": self.reset, "uploaded": self.uploaded,
                "seconds": round(self.seconds, 3), "passed": self.passed, "error": self.error,
                "tokens": self.result.tokens if self.result else None,
                "kernels": self.result.kernels if self.result else None,
                "prompt_tok_s": self.prompt_tok_s, "decode_tok_s": self.decode_tok_s,
                "bit_identical": v.bit_identical if v else None,
                "rows": v.rows if v else None, "rows_identical": v.rows_identical if v else None,
                "first_difference": v.first_difference if v else None,
                "tokens_agree": v.tokens_agree if v else None, "tokens_checked": v.tokens_checked if v else None}


def board_holds(client: Client, image: Path) -> bool:
    """Whether the board already holds this image (its OPEN succeeds with the image's size and payload CRC); the
    device verifies every byte when it opens, so a stale or corrupt copy answers with an error, not a match."""
    try:
        opened = client.open()
    except DeviceError:  # no image, or one that does not verify
        return False
    img = open_image(image, check_crcs=False)
    return opened.image_bytes == image.stat().st_size and opened.payload_crc32 == img.header["payload_crc32"]


def run_place(coordinator: Coordinator, query: str, image: Path, prompt: list[int], max_new: int,
              reference: Reference, *, wait: float, timeout: float, retries: int, upload: str,
              kinds: dict[str, str | None], reset: bool = True, holdings: Holdings | None = None,
              board: str | None = None) -> PlaceRun:
    """Hold one place, run the prompt on its board and verify it; every failure is kept in the PlaceRun's error
    (one line naming what failed), the place released whatever happened. `board`: the kind the place is known to
    be before it is held (its tag), which the image was checked against."""
    run = PlaceRun(query, board=board or "")
    started = time.perf_counter()
    try:
        with hold_place(coordinator, query, wait, reset=reset, kinds=kinds, holdings=holdings) as held:
            run.place, run.board, run.reset = held.name, held.board or run.board, held.reset
            run_on_held(run, held, image, prompt, max_new, reference, timeout, retries, upload, checked=board)
    except FarmError as exc:
        run.error = str(exc)
    except DeviceError as exc:
        run.error = f"the board answered with an error: {status_name(exc.code)} ({exc.message}), detail {exc.detail}"
    except (LinkError, ValueError, OSError) as exc:
        run.error = f"{exc}".splitlines()[0]
    run.seconds = time.perf_counter() - started
    return run


def run_on_held(run: PlaceRun, held: HeldPlace, image: Path, prompt: list[int], max_new: int, reference: Reference,
                timeout: float, retries: int, upload: str, checked: str | None = None) -> None:
    """The run on a held place's board; the image checked against the board's memory first when the board is of
    another kind than `checked` (the one it was checked against before)."""
    from colibri.farm.run import check_board
    with open_port(held.url, held.baud) as link:
        client = Client(link, timeout=timeout, retries=retries)
        info = client.info()
        run.board = info.board or run.board
        if run.board != checked:
            problem = check_board(open_image(image, check_crcs=False), image.stat().st_size, run.board, prompt,
                                  max_new, 0)
            if problem:
                raise FarmError(problem)
        run.uploaded = upload == "always" or not board_holds(client, image)
        run.result = run_session(client, image, prompt, max_new, Sampling(), want_logits=True, upload=run.uploaded)
    run.verification = verify(reference, prompt, run.result, Sampling())


def farm_verify(coordinator: Coordinator, queries: list[str], image: Path, prompt: list[int], max_new: int, *,
                wait: float, timeout: float, retries: int, upload: str = "auto", jobs: int = 0,
                kinds: dict[str, str | None] | None = None, reset: bool = True,
                boards: dict[str, str | None] | None = None) -> list[PlaceRun]:
    """Run on every place of `queries` (place names, each held by name), `jobs` at a time (0: all at once).
    `boards`: each place's kind as known before it is held (the image was checked against it)."""
    try:
        reference = Reference(read_image(image.read_bytes()))
    except ImageError as exc:
        raise FarmError(f"{image} is not a valid image ({exc}); make one with colibri pack") from None
    runs: list[PlaceRun | None] = [None] * len(queries)
    gate = threading.Semaphore(jobs if jobs > 0 else len(queries))
    holdings = Holdings()

    def work(i: int) -> None:
        with gate:
            runs[i] = run_place(coordinator, queries[i], image, prompt, max_new, reference, wait=wait,
                                timeout=timeout, retries=retries, upload=upload, kinds=kinds or {}, reset=reset,
                                holdings=holdings, board=(boards or {}).get(queries[i]))
    threads = [threading.Thread(target=work, args=(i,), name=f"farm-{q}", daemon=True) for i, q in enumerate(queries)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():  # joined in slices, so Ctrl-C reaches this thread
                t.join(0.2)
    except BaseException:  # Ctrl-C, SIGTERM: the threads wait on their boards, the places go back now
        holdings.release_all(coordinator)
        raise
    return [r for r in runs if r is not None]


def rate(value: float | None) -> str:
    return f"{value:,.1f}" if value else "-"


def table(runs: list[PlaceRun]) -> list[str]:
    """The farm run as a table: one row per place."""
    head = ("place", "board", "image", "prompt tok/s", "decode tok/s", "logits", "verdict")
    rows = []
    for r in runs:
        v = r.verification
        if v is None:
            logits = "-"
        elif v.bit_identical:
            logits = f"bit-identical ({v.rows} rows)"
        else:
            logits = f"differ from row {v.first_difference} ({v.rows - v.rows_identical}/{v.rows})"
        image = "-" if r.uploaded is None else "uploaded" if r.uploaded else "on board"
        verdict = "PASS" if r.passed else "FAIL" if r.error is None else "ERROR"
        rows.append((r.place, r.board or "?", image, rate(r.prompt_tok_s), rate(r.decode_tok_s), logits, verdict))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in (head, *rows)]
    for r in runs:
        if r.error:
            lines.append(f"{r.place}: {r.error}")
    return lines
