"""The serial protocol: corrupted frames are detected on both sides and never acted on."""
from __future__ import annotations

import struct

import pytest

from conftest import MODEL_RUNS, board_name
from colibri.codes import (LINK_BAD_CRC, LINK_BAD_LENGTH, LINK_BAD_PAYLOAD, LINK_NOT_OPEN, LINK_UNKNOWN_TYPE,
                           LINK_UPLOAD_CRC, LINK_UPLOAD_ORDER, LINK_UPLOAD_TOO_BIG)
from colibri.protocol import (REQ_INFO, REQ_UPLOAD_BEGIN, REQ_UPLOAD_CHUNK, REQ_UPLOAD_END, RSP_ERROR, RSP_INFO,
                           RSP_UPLOAD_ACK, Client, DeviceError, LinkError, encode_frame, read_frame)
from colibri.sim.boards import load_board
from colibri.sim.launch import start_board


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


# How long a test waits for an answer: a bound, not a delay. A board just started on a busy machine (Wine's first
# process under a parallel test run) can take several seconds to read its first frame.
ANSWER_S = 60.0


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


@pytest.mark.parametrize("board", MODEL_RUNS)
def test_device_rejects_corrupt_request_and_keeps_serving(board, images, firmwares):
    with start_board(load_board(board_name(board)), firmwares[board], images["base"]) as device:
        link = device.link
        bad = bytearray(encode_frame(REQ_INFO, 5))
        bad[-1] ^= 0xFF
        link.write(bytes(bad))
        ftype, seq, payload = read_frame(link, ANSWER_S)
        assert (ftype, seq) == (RSP_ERROR, 5)
        assert struct.unpack_from("<I", payload)[0] == LINK_BAD_CRC
        # an absurd length is refused before any payload is awaited
        link.write(b"\xA5\x5A" + struct.pack("<BBH", REQ_INFO, 6, 0xFFFF))
        ftype, seq, payload = read_frame(link, ANSWER_S)
        assert (ftype, seq, struct.unpack_from("<I", payload)[0]) == (RSP_ERROR, 6, LINK_BAD_LENGTH)
        # unknown request type, and RUN before OPEN
        link.write(encode_frame(0x42, 7))
        assert struct.unpack_from("<I", read_frame(link, ANSWER_S)[2])[0] == LINK_UNKNOWN_TYPE
        link.write(encode_frame(0x03, 8, bytes(40)))
        assert struct.unpack_from("<I", read_frame(link, ANSWER_S)[2])[0] == LINK_NOT_OPEN
        client = Client(link, timeout=ANSWER_S)
        assert client.info().board == board_name(board)
        client.open()
        client.quit()
    assert device.guest_code == 0


def _error_code(link, ftype, seq, payload=b""):
    link.write(encode_frame(ftype, seq, payload))
    rtype, rseq, p = read_frame(link, ANSWER_S)
    assert rseq == seq
    return struct.unpack_from("<I", p)[0] if rtype == RSP_ERROR else rtype


def test_upload_errors_are_named(images, firmwares):
    image = images["base"].read_bytes()
    with start_board(load_board("x86_64_baremetal"), firmwares["x86_64_baremetal"], None) as device:
        link = device.link
        client = Client(link, timeout=ANSWER_S)
        with pytest.raises(DeviceError, match="LINK_NO_IMAGE"):  # nothing loaded yet
            client.open()
        assert _error_code(link, REQ_UPLOAD_BEGIN, 1, struct.pack("<QI", 1 << 40, 0)) == LINK_UPLOAD_TOO_BIG
        assert _error_code(link, REQ_UPLOAD_CHUNK, 2, struct.pack("<Q", 0) + b"x") == LINK_BAD_PAYLOAD  # no upload begun
        assert _error_code(link, REQ_UPLOAD_BEGIN, 3, struct.pack("<QI", len(image), 0)) == RSP_UPLOAD_ACK
        assert _error_code(link, REQ_UPLOAD_CHUNK, 4, struct.pack("<Q", 64) + image[64:128]) == LINK_UPLOAD_ORDER  # a gap
        assert _error_code(link, REQ_UPLOAD_CHUNK, 5, struct.pack("<Q", 0) + image[:4000]) == RSP_UPLOAD_ACK
        assert _error_code(link, REQ_UPLOAD_CHUNK, 6, struct.pack("<Q", 0) + image[:4000]) == RSP_UPLOAD_ACK  # resent
        assert _error_code(link, REQ_UPLOAD_END, 7) == LINK_UPLOAD_ORDER  # incomplete
        for off in range(4000, len(image), 4000):
            assert _error_code(link, REQ_UPLOAD_CHUNK, 8, struct.pack("<Q", off) + image[off:off + 4000]) == RSP_UPLOAD_ACK
        assert _error_code(link, REQ_UPLOAD_END, 9) == LINK_UPLOAD_CRC  # the CRC given at BEGIN was wrong
        client.upload(image)  # a proper upload still works afterwards
        assert client.open().image_bytes == len(image)
        client.quit()
    assert device.guest_code == 0
