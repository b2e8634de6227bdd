"""The host side of the serial protocol (docs/PROTOCOL.md): frames, messages and a client.

Frame: 0xA5 0x5A | type u8 | seq u8 | len u16 | payload | crc32(type..payload) u32, little-endian.
A frame that fails its length or CRC check raises LinkError; it is never used.
"""
from __future__ import annotations

import struct
import time
import zlib
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from colibri.codes import (  # noqa: F401  (format/schema.toml is their source)
    LINK_BAD_CRC, LINK_BAD_LENGTH, LINK_ERRORS, MAX_PAYLOAD, PROTOCOL_VERSION, REQ_FEED, REQ_INFO, REQ_LOGITS,
    REQ_OPEN, REQ_QUIT, REQ_START, REQ_STATS, REQ_STEP, REQ_TRACE, REQ_UPLOAD_BEGIN, REQ_UPLOAD_CHUNK, REQ_UPLOAD_END,
    RSP_BYE, RSP_ERROR, RSP_FED, RSP_INFO, RSP_LOGITS, RSP_OPENED, RSP_STARTED, RSP_STATS, RSP_TOKEN, RSP_TRACE,
    RSP_UPLOAD_ACK, RSP_UPLOADED, STATUS_NAMES, SYNC)

START = struct.Struct("<fIfIQ")  # temperature, top_k, top_p, flags, seed
START_TRACE = 1
EXPERT_PREFETCH = 1  # OPEN expert policy bit: COLIBRI_PREFETCH
RESYNC_FILLER = bytes(6 + MAX_PAYLOAD + 4)  # longer than any frame: sent after a timeout (see Client.call)
LOGITS_PER_FRAME = (MAX_PAYLOAD - 12) // 4
FEED_PER_FRAME = (MAX_PAYLOAD - 4) // 4


def status_name(code: int) -> str:
    if code < len(STATUS_NAMES):
        return "COLIBRI_" + STATUS_NAMES[code]
    return LINK_ERRORS.get(code, f"status {code}")


class LinkError(RuntimeError):
    """The byte stream broke: end of stream, a frame that failed its check, or no answer in time."""


class LinkTimeout(LinkError):
    """Nothing (complete) arrived in time; a retransmission may still succeed."""


class LinkClosed(LinkError):
    """The device side of the stream is gone (process exited, socket closed): retrying cannot help."""


class DeviceError(RuntimeError):
    """The device answered with an ERROR frame."""

    def __init__(self, code: int, detail: int, message: str):
        self.code, self.detail, self.message = code, detail, message
        super().__init__(f"device error {status_name(code)} ({message}), detail={detail}")


def encode_frame(ftype: int, seq: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds the protocol's {MAX_PAYLOAD}")
    body = struct.pack("<BBH", ftype, seq & 0xFF, len(payload)) + payload
    return SYNC + body + struct.pack("<I", zlib.crc32(body) & 0xFFFFFFFF)


class Transport(Protocol):
    def read(self, n: int, timeout: float) -> bytes: ...  # exactly n bytes, or raise LinkError
    def write(self, data: bytes) -> None: ...


def read_frame(t: Transport, timeout: float) -> tuple[int, int, bytes]:
    """Next (type, seq, payload); skips bytes before a sync pair; raises LinkError on a bad frame
    and LinkTimeout when the frame does not complete in time."""
    deadline = time.monotonic() + timeout
    left = lambda: max(0.0, deadline - time.monotonic())  # noqa: E731
    prev = b""
    while True:
        b = t.read(1, left())
        if prev == SYNC[:1] and b == SYNC[1:]:
            break
        prev = b
    head = t.read(4, left())
    ftype, seq, length = struct.unpack("<BBH", head)
    if length > MAX_PAYLOAD:
        raise LinkError(f"corrupt frame from device: length {length} > {MAX_PAYLOAD}")
    payload = t.read(length, left()) if length else b""
    (crc,) = struct.unpack("<I", t.read(4, left()))
    if crc != zlib.crc32(head + payload) & 0xFFFFFFFF:
        raise LinkError(f"corrupt frame from device: CRC mismatch (type 0x{ftype:02x}, {length} bytes)")
    return ftype, seq, payload


@dataclass
class DeviceInfo:
    protocol_version: int
    max_payload: int
    image_capacity: int
    arena_capacity: int
    cycle_hz: int
    board: str


@dataclass
class OpenInfo:
    image_bytes: int
    arena_bytes: int
    payload_crc32: int
    vocab_size: int
    max_seq: int
    expert_cache: int = 0         # cache slots of this context (0: experts read in place)
    kernels: str = ""             # the device's kernel set (docs/KERNELS.md)
    resident_bytes: int = 0       # bytes read in place; the expert part follows (docs/FORMAT.md)
    expert_block_bytes: int = 0   # one cache slot
    streamed_experts: int = 0     # routed experts in the expert part
    expert_cache_min: int = 0     # the smallest cache the device accepts
    prefill_batch: int = 0        # prompt tokens computed in one pass (0: one a pass)
    parallel_parts: int = 0       # threads lent to the runtime (0: one)


STATS_FIELDS = ("tokens_fed", "arena_bytes", "cycles_total", "cycles_attention", "cycles_router",
                "cycles_experts", "cycles_lm_head", "cycles_sampling", "expert_calls", "cycle_hz",
                "expert_hits", "expert_misses", "expert_bytes_fetched", "prefetch_issued", "prefetch_used",
                "cycles_fetch_wait")


@dataclass
class Sampling:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class TokenEvent:
    index: int
    token: int
    cycles: int


@dataclass
class Generation:
    """What Client.run got: the generated tokens, the logits rows if asked, and the device cycles the
    prompt took (each TokenEvent has its own step's)."""
    events: list[TokenEvent]
    logits: np.ndarray | None
    prefill_cycles: int


@dataclass
class LayerTrace:
    """What one layer did for one token (the runtime's colibri_layer_trace)."""
    layer: int
    cycles_attention: int
    cycles_router: int
    cycles_ffn: int
    experts: list[int]
    weights: list[float]
    cycles_expert: list[int]
    crc_attention: int = 0  # CRC-32 of the token's residual stream after the attention half (0: not taken)
    crc_output: int = 0     # ... and after the whole layer


def parse_trace(data: bytes) -> list[LayerTrace]:
    out, off = [], 0
    while off < len(data):
        layer, n, att, router, ffn, crc_attention, crc_output = struct.unpack_from("<IIQQQII", data, off)
        off += 40
        experts, weights, cycles = [], [], []
        for _ in range(n):
            e, w, c = struct.unpack_from("<IfQ", data, off)
            experts.append(e)
            weights.append(w)
            cycles.append(c)
            off += 16
        out.append(LayerTrace(layer, att, router, ffn, experts, weights, cycles, crc_attention, crc_output))
    return out


def scripted_session(prompt: list[int], n_steps: int, sampling: Sampling, vocab: int) -> list[tuple[int, bytes]]:
    """The requests of a whole session (INFO, OPEN, START, FEED, STEP/LOGITS..., STATS, QUIT), for
    driving a board without a Client: fuzz seeds, valgrind runs."""
    logits = [(REQ_LOGITS, struct.pack("<II", f, min(LOGITS_PER_FRAME, vocab - f))) for f in range(0, vocab, LOGITS_PER_FRAME)]
    reqs = [(REQ_INFO, b""), (REQ_OPEN, b""),
            (REQ_START, START.pack(sampling.temperature, sampling.top_k, sampling.top_p, 0, sampling.seed)),
            (REQ_FEED, struct.pack(f"<I{len(prompt)}I", len(prompt), *prompt)), *logits]
    for _ in range(n_steps):
        reqs += [(REQ_STEP, b""), *logits]
    return reqs + [(REQ_STATS, b""), (REQ_QUIT, b"")]


class Client:
    """Request/response over a Transport, one request at a time, each answered by one frame.

    A request whose answer does not arrive in `timeout` seconds, arrives corrupted, or that the
    device reports as corrupted is sent again, up to `retries` times; the device answers a
    repeated request from its cache without doing the work twice (docs/PROTOCOL.md). So a lossy
    link either gives the same results as a clean one or fails within (retries + 1) * timeout
    with a LinkError that says what went wrong."""

    def __init__(self, transport: Transport, timeout: float = 30.0, retries: int = 4):
        self.t = transport
        self.timeout = timeout
        self.retries = retries
        self.seq = 0

    def call(self, ftype: int, payload: bytes, want: int) -> bytes:
        self.seq = (self.seq + 1) & 0xFF
        frame = encode_frame(ftype, self.seq, payload)
        problem = ""
        for _ in range(self.retries + 1):
            self.t.write(frame)
            deadline = time.monotonic() + self.timeout
            while True:
                left = deadline - time.monotonic()
                try:
                    if left <= 0:
                        raise LinkTimeout(f"no answer within {self.timeout:g}s")
                    rtype, rseq, p = read_frame(self.t, left)
                except LinkClosed:
                    raise
                except LinkError as exc:  # nothing in time, or a corrupt answer: ask again
                    problem = str(exc)
                    if isinstance(exc, LinkTimeout):
                        # A device left inside a frame (a cut link, a host that died mid-chunk) reads our
                        # frames as that frame's payload and never answers: zeros complete any frame
                        # (it fails its CRC) and are skipped while the device hunts for the sync pair.
                        self.t.write(RESYNC_FILLER)
                    break
                if rtype == RSP_ERROR:
                    code, detail = struct.unpack_from("<IQ", p)
                    if code in (LINK_BAD_CRC, LINK_BAD_LENGTH):  # our request arrived damaged
                        problem = f"device received a damaged request ({status_name(code)})"
                        break
                    if rseq == self.seq:
                        raise DeviceError(code, detail, p[12:].decode("ascii", "replace"))
                    continue
                if rseq != self.seq:
                    continue  # a late answer to an earlier attempt of an earlier request
                if rtype != want:
                    raise LinkError(f"expected frame type 0x{want:02x}, got 0x{rtype:02x}")
                return p
        raise LinkError(f"request 0x{ftype:02x} failed after {self.retries + 1} attempts: {problem}")

    def info(self) -> DeviceInfo:
        p = self.call(REQ_INFO, b"", RSP_INFO)
        version, max_payload, image_cap, arena_cap, hz = struct.unpack_from("<IIQQQ", p)
        if version != PROTOCOL_VERSION:
            raise LinkError(f"device speaks protocol {version}, this host speaks {PROTOCOL_VERSION}")
        return DeviceInfo(version, max_payload, image_cap, arena_cap, hz, p[32:64].split(b"\0")[0].decode())

    def upload(self, image: bytes, on_progress: Callable[[int], None] | None = None) -> int:
        """Send `image` in checksummed chunks, resuming an interrupted upload of the same image;
        returns the CRC-32 the device computed over what it stored."""
        crc = zlib.crc32(image) & 0xFFFFFFFF
        ack = self.call(REQ_UPLOAD_BEGIN, struct.pack("<QI", len(image), crc), RSP_UPLOAD_ACK)
        offset = struct.unpack("<Q", ack)[0]
        chunk = MAX_PAYLOAD - 8
        while offset < len(image):
            ack = self.call(REQ_UPLOAD_CHUNK, struct.pack("<Q", offset) + image[offset:offset + chunk], RSP_UPLOAD_ACK)
            received = struct.unpack("<Q", ack)[0]
            if received <= offset:
                raise LinkError(f"device acknowledged {received} bytes after the chunk at {offset}")
            offset = received
            if on_progress:
                on_progress(received)
        size, device_crc = struct.unpack_from("<QI", self.call(REQ_UPLOAD_END, b"", RSP_UPLOADED))
        if size != len(image) or device_crc != crc:
            raise LinkError(f"device stored {size} bytes with CRC {device_crc:08x}, sent {len(image)} with {crc:08x}")
        return device_crc

    def open(self, expert_cache: int = 0, prefetch: bool = False, experts: int | None = None) -> OpenInfo:
        """OPEN the image; with expert_cache > 0 slots, routed experts stream through the board's fetch
        hook (docs/STREAMING.md), and with `prefetch` the next layer's experts are guessed and fetched early.
        `experts`: each token routed to that many experts instead of the image's top_k (None: top_k; the device
        refuses 0 and more than top_k with COLIBRI_E_BAD_ARG)."""
        policy = EXPERT_PREFETCH if prefetch and expert_cache else 0
        request = struct.pack("<II", expert_cache, policy) if expert_cache else b""
        if experts is not None:
            request = struct.pack("<III", expert_cache, policy, experts)
        p = self.call(REQ_OPEN, request, RSP_OPENED)
        if len(p) < 72:
            raise LinkError(f"OPENED answer of {len(p)} bytes, expected 72")
        kernels = p[32:40].rstrip(b"\0").decode("ascii", "replace")
        image_bytes, arena, crc, vocab, max_seq, slots = struct.unpack_from("<QQIIII", p)
        resident, block, streamed, cache_min, batch, parts = struct.unpack_from("<QQIIII", p, 40)
        return OpenInfo(image_bytes, arena, crc, vocab, max_seq, slots, kernels, resident, block, streamed, cache_min,
                        batch, parts)

    def start(self, sampling: Sampling, trace: bool = False) -> None:
        self.call(REQ_START, START.pack(sampling.temperature, sampling.top_k, sampling.top_p,
                                        START_TRACE if trace else 0, sampling.seed & (2**64 - 1)), RSP_STARTED)

    def trace(self) -> list[LayerTrace]:
        """The layer records of the last fed token (START with trace=True first)."""
        data, total, dropped = b"", None, 0
        while total is None or len(data) < total:
            p = self.call(REQ_TRACE, struct.pack("<I", len(data)), RSP_TRACE)
            _, dropped, total, first = struct.unpack_from("<IIII", p)
            if first != len(data):
                raise LinkError(f"trace bytes from {first}, expected {len(data)}")
            data += p[16:]
            if len(p) == 16 and len(data) < total:
                raise LinkError("device sent an empty trace slice")
        if dropped:
            raise LinkError(f"the device dropped {dropped} layer records (its trace buffer is too small)")
        return parse_trace(data)

    def feed_all(self, tokens: list[int]) -> int:
        """Feed any number of tokens, as many per frame as fit; returns the device cycles it took."""
        return sum(self.feed(tokens[i:i + FEED_PER_FRAME])[1] for i in range(0, len(tokens), FEED_PER_FRAME))

    def feed(self, tokens: list[int]) -> tuple[int, int]:
        """Feed tokens in one frame (one colibri_feed); returns the positions now in the KV cache and the
        device cycles the feed took."""
        pos, _, cycles = struct.unpack_from("<IIQ", self.call(REQ_FEED, struct.pack(f"<I{len(tokens)}I", len(tokens),
                                                                                    *tokens), RSP_FED))
        return pos, cycles

    def step(self) -> TokenEvent:
        pos, token, cycles = struct.unpack_from("<IIQ", self.call(REQ_STEP, b"", RSP_TOKEN))
        return TokenEvent(pos, token, cycles)

    def logits(self, vocab: int) -> np.ndarray:
        """The logits after the last fed token."""
        parts = []
        for first in range(0, vocab, LOGITS_PER_FRAME):
            count = min(LOGITS_PER_FRAME, vocab - first)
            p = self.call(REQ_LOGITS, struct.pack("<II", first, count), RSP_LOGITS)
            _, rfirst, rcount = struct.unpack_from("<III", p)
            if (rfirst, rcount) != (first, count):
                raise LinkError(f"asked for logits {first}+{count}, got {rfirst}+{rcount}")
            parts.append(np.frombuffer(p, "<f4", count, 12))
        return np.concatenate(parts)

    def run(self, prompt: list[int], max_new: int, sampling: Sampling, vocab: int | None = None,
            on_token: Callable[[TokenEvent], None] | None = None,
            traces: list[list[LayerTrace]] | None = None,
            stop: frozenset[int] = frozenset(), on_fed: Callable[[int], None] | None = None) -> Generation:
        """A new sequence: feed `prompt`, generate up to `max_new` tokens, ending early after a token in
        `stop` (end of sequence; it is included). With `vocab`, also return the logits rows (row i =
        after the i-th fed token, prompt first). With a `traces` list, append each fed token's layer
        records to it. `on_fed(n)` hears how many prompt tokens are fed when they go one at a time."""
        self.start(sampling, trace=traces is not None)
        rows = []
        per_token = vocab or traces is not None
        prefill_cycles = 0
        if per_token:
            for tok in prompt:  # one at a time: every prompt position's logits or trace is wanted
                prefill_cycles += self.feed([tok])[1]
                if vocab:
                    rows.append(self.logits(vocab))
                if traces is not None:
                    traces.append(self.trace())
                if on_fed:
                    on_fed(len(rows) if vocab else len(traces))
        else:
            prefill_cycles = self.feed_all(prompt)
        events = []
        for _ in range(max_new):
            ev = self.step()
            events.append(TokenEvent(len(events), ev.token, ev.cycles))
            if on_token:
                on_token(events[-1])
            if vocab:
                rows.append(self.logits(vocab))
            if traces is not None:
                traces.append(self.trace())
            if ev.token in stop:
                break
        return Generation(events, np.stack(rows) if vocab else None, prefill_cycles)

    def stats(self) -> dict[str, int]:
        p = self.call(REQ_STATS, b"", RSP_STATS)
        if len(p) < 8 * len(STATS_FIELDS):
            raise LinkError(f"STATS answer of {len(p)} bytes, expected {8 * len(STATS_FIELDS)}")
        return dict(zip(STATS_FIELDS, struct.unpack_from(f"<{len(STATS_FIELDS)}Q", p)))

    def quit(self, code: int = 0) -> None:
        try:
            self.call(REQ_QUIT, struct.pack("<I", code), RSP_BYE)
        except LinkClosed:
            pass  # it went away as asked; a pty even discards the BYE when the device side closes first
