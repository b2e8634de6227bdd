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

SYNC = b"\xA5\x5A"
MAX_PAYLOAD = 4096
PROTOCOL_VERSION = 1

REQ_INFO, REQ_OPEN, REQ_RUN, REQ_STATS, REQ_QUIT = 0x01, 0x02, 0x03, 0x04, 0x05
REQ_UPLOAD_BEGIN, REQ_UPLOAD_CHUNK, REQ_UPLOAD_END = 0x06, 0x07, 0x08
RSP_INFO, RSP_OPENED, RSP_TOKEN, RSP_LOGITS, RSP_DONE, RSP_STATS, RSP_BYE = 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87
RSP_UPLOAD_ACK, RSP_UPLOADED = 0x88, 0x89
RSP_ERROR = 0xEE
RUN_FLAG_LOGITS = 1
RUN_FIXED = struct.Struct("<IIfIfIQI")  # flags, max_new, temperature, top_k, top_p, reserved, seed, n_prompt

# colibri_status names (firmware/include/colibri.h) and link-level codes (boards/common/link.c)
STATUS_NAMES = [
    "OK", "E_NULL", "E_BAD_ARG", "E_ARENA_TOO_SMALL", "E_ARENA_ALIGN", "E_IMAGE_TRUNCATED", "E_IMAGE_MAGIC",
    "E_IMAGE_VERSION", "E_IMAGE_HEADER_CRC", "E_IMAGE_PAYLOAD_CRC", "E_IMAGE_HEADER", "E_IMAGE_DIMS",
    "E_IMAGE_TABLE", "E_IMAGE_BOUNDS", "E_IMAGE_DTYPE", "E_IMAGE_PLAN", "E_UNSUPPORTED", "E_TOKEN_RANGE",
    "E_SEQ_FULL", "E_NO_LOGITS",
]
LINK_ERRORS = {200: "LINK_BAD_CRC", 201: "LINK_BAD_LENGTH", 202: "LINK_UNKNOWN_TYPE", 203: "LINK_BAD_PAYLOAD",
               204: "LINK_NOT_OPEN", 205: "LINK_NO_IMAGE", 206: "LINK_UPLOAD_TOO_BIG", 207: "LINK_UPLOAD_ORDER",
               208: "LINK_UPLOAD_CRC"}


def status_name(code: int) -> str:
    if code < len(STATUS_NAMES):
        return "COLIBRI_" + STATUS_NAMES[code]
    return LINK_ERRORS.get(code, f"status {code}")


class LinkError(RuntimeError):
    """The byte stream broke: timeout, end of stream, or a frame that failed its check."""


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
    """Next (type, seq, payload); skips bytes before a sync pair; raises LinkError on a bad frame."""
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


STATS_FIELDS = ("tokens_fed", "arena_bytes", "cycles_total", "cycles_attention", "cycles_router",
                "cycles_experts", "cycles_lm_head", "cycles_sampling", "expert_calls", "cycle_hz")


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


class Client:
    """Request/response over a Transport. One request at a time; responses carry its seq."""

    def __init__(self, transport: Transport, timeout: float = 30.0):
        self.t = transport
        self.timeout = timeout
        self.seq = 0

    def _request(self, ftype: int, payload: bytes = b"") -> int:
        self.seq = (self.seq + 1) & 0xFF
        self.t.write(encode_frame(ftype, self.seq, payload))
        return self.seq

    def _response(self, seq: int, timeout: float | None = None) -> tuple[int, bytes]:
        ftype, rseq, payload = read_frame(self.t, timeout or self.timeout)
        if ftype == RSP_ERROR:
            code, detail = struct.unpack_from("<IQ", payload)
            raise DeviceError(code, detail, payload[12:].decode("ascii", "replace"))
        if rseq != seq:
            raise LinkError(f"response for request {rseq}, expected {seq}: the link lost or reordered a frame")
        return ftype, payload

    def _expect(self, seq: int, want: int) -> bytes:
        ftype, payload = self._response(seq)
        if ftype != want:
            raise LinkError(f"expected frame type 0x{want:02x}, got 0x{ftype:02x}")
        return payload

    def info(self) -> DeviceInfo:
        p = self._expect(self._request(REQ_INFO), RSP_INFO)
        version, max_payload, image_cap, arena_cap, hz = struct.unpack_from("<IIQQQ", p)
        if version != PROTOCOL_VERSION:
            raise LinkError(f"device speaks protocol {version}, this host speaks {PROTOCOL_VERSION}")
        return DeviceInfo(version, max_payload, image_cap, arena_cap, hz, p[32:64].split(b"\0")[0].decode())

    def upload(self, image: bytes, on_progress: Callable[[int], None] | None = None) -> int:
        """Send `image` in checksummed chunks; returns the CRC-32 the device computed over what it stored."""
        crc = zlib.crc32(image) & 0xFFFFFFFF
        self._expect(self._request(REQ_UPLOAD_BEGIN, struct.pack("<QI", len(image), crc)), RSP_UPLOAD_ACK)
        chunk = MAX_PAYLOAD - 8
        for offset in range(0, len(image), chunk):
            ack = self._expect(self._request(REQ_UPLOAD_CHUNK, struct.pack("<Q", offset) + image[offset:offset + chunk]),
                               RSP_UPLOAD_ACK)
            received = struct.unpack("<Q", ack)[0]
            if received != min(offset + chunk, len(image)):
                raise LinkError(f"device acknowledged {received} bytes after the chunk at {offset}")
            if on_progress:
                on_progress(received)
        size, device_crc = struct.unpack_from("<QI", self._expect(self._request(REQ_UPLOAD_END), RSP_UPLOADED))
        if size != len(image) or device_crc != crc:
            raise LinkError(f"device stored {size} bytes with CRC {device_crc:08x}, sent {len(image)} with {crc:08x}")
        return device_crc

    def open(self) -> OpenInfo:
        p = self._expect(self._request(REQ_OPEN), RSP_OPENED)
        return OpenInfo(*struct.unpack_from("<QQIII", p))

    def run(self, prompt: list[int], max_new: int, sampling: Sampling, logits: bool,
            on_token: Callable[[TokenEvent], None] | None = None) -> tuple[list[TokenEvent], np.ndarray | None]:
        """Reset, feed `prompt`, generate `max_new` tokens. Returns the token events and, if asked,
        the logits rows (prompt tokens first, then one per generated token)."""
        fixed = RUN_FIXED.pack(RUN_FLAG_LOGITS if logits else 0, max_new, sampling.temperature, sampling.top_k,
                               sampling.top_p, 0, sampling.seed & (2**64 - 1), len(prompt))
        payload = fixed + struct.pack(f"<{len(prompt)}I", *prompt)
        seq = self._request(REQ_RUN, payload)
        events: list[TokenEvent] = []
        rows: dict[int, np.ndarray] = {}
        while True:
            ftype, p = self._response(seq)
            if ftype == RSP_TOKEN:
                ev = TokenEvent(*struct.unpack_from("<IIQ", p))
                events.append(ev)
                if on_token:
                    on_token(ev)
            elif ftype == RSP_LOGITS:
                row, first, count = struct.unpack_from("<III", p)
                chunk = np.frombuffer(p, "<f4", count, 12)
                buf = rows.setdefault(row, np.zeros(0, np.float32))
                if first != buf.size:
                    raise LinkError(f"logits row {row}: chunk at {first}, expected {buf.size}")
                rows[row] = np.concatenate([buf, chunk])
            elif ftype == RSP_DONE:
                break
            else:
                raise LinkError(f"unexpected frame type 0x{ftype:02x} during RUN")
        if not logits:
            return events, None
        n_rows = len(prompt) + len(events)
        if sorted(rows) != list(range(n_rows)):
            raise LinkError(f"expected {n_rows} logits rows, got {len(rows)}")
        return events, np.stack([rows[i] for i in range(n_rows)])

    def stats(self) -> dict[str, int]:
        p = self._expect(self._request(REQ_STATS), RSP_STATS)
        return dict(zip(STATS_FIELDS, struct.unpack_from(f"<{len(STATS_FIELDS)}Q", p)))

    def quit(self, code: int = 0) -> None:
        self._expect(self._request(REQ_QUIT, struct.pack("<I", code)), RSP_BYE)
