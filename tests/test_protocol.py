"""The serial protocol: corrupted frames are detected on both sides and never acted on."""
from __future__ import annotations

import struct

import pytest

from host.protocol import (REQ_INFO, RSP_ERROR, RSP_INFO, Client, LinkError, encode_frame, read_frame)
from sim.boards import load_board
from sim.launch import start_board


class BytesTransport:
    def __init__(self, data: bytes):
        self.data = bytearray(data)

    def read(self, n: int, timeout: float) -> bytes:
        if len(self.data) < n:
            raise LinkError("end of test data")
        out = bytes(self.data[:n])
        del self.data[:n]
        return out

    def write(self, data: bytes) -> None:
        pass


def test_frame_round_trip_skips_noise():
    frame = encode_frame(RSP_INFO, 9, b"hello")
    assert read_frame(BytesTransport(b"\x00\xA5junk" + frame), 1.0) == (RSP_INFO, 9, b"hello")


@pytest.mark.parametrize("index", range(2, 15))
def test_any_flipped_byte_is_detected(index):
    frame = bytearray(encode_frame(RSP_INFO, 9, b"payload"))
    frame[index] ^= 0x10
    with pytest.raises(LinkError):
        read_frame(BytesTransport(bytes(frame)), 1.0)


def test_oversized_payload_refused():
    with pytest.raises(ValueError):
        encode_frame(REQ_INFO, 1, bytes(5000))


def test_device_rejects_corrupt_request_and_keeps_serving(images, hosted_build):
    board = load_board("hosted")
    with start_board(board, hosted_build / "firmware.elf", images["base"]) as link:
        bad = bytearray(encode_frame(REQ_INFO, 5))
        bad[-1] ^= 0xFF
        link.write(bytes(bad))
        ftype, seq, payload = read_frame(link, 5.0)
        assert (ftype, seq) == (RSP_ERROR, 5)
        assert struct.unpack_from("<I", payload)[0] == 200  # LINK_BAD_CRC
        # an absurd length is refused before any payload is awaited
        link.write(b"\xA5\x5A" + struct.pack("<BBH", REQ_INFO, 6, 0xFFFF))
        ftype, seq, payload = read_frame(link, 5.0)
        assert (ftype, seq, struct.unpack_from("<I", payload)[0]) == (RSP_ERROR, 6, 201)
        # unknown request type, and RUN before OPEN
        link.write(encode_frame(0x42, 7))
        assert struct.unpack_from("<I", read_frame(link, 5.0)[2])[0] == 202
        link.write(encode_frame(0x03, 8, bytes(40)))
        assert struct.unpack_from("<I", read_frame(link, 5.0)[2])[0] == 204
        client = Client(link, timeout=5.0)
        assert client.info().board == "hosted"
        client.open()
        client.quit()
