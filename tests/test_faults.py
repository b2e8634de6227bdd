"""A lossy link between host and device: every run is either identical to a clean one or fails in
bounded time with an error that says what happened. Never a hang, never a wrong token accepted."""
from __future__ import annotations

import time
import zlib

import numpy as np
import pytest

from colibri import flash
from colibri.protocol import Client, LinkClosed, LinkError, Sampling
from colibri.sim.boards import load_board
from colibri.sim.faults import LossyTransport
from colibri.sim.launch import start_board

PROMPT = [1, 5, 9, 3]
TIMEOUT, RETRIES = 0.4, 8
BOUND = (RETRIES + 1) * TIMEOUT * 8 + 30  # per run: requests x attempts x timeout, generously


@pytest.mark.parametrize("board", ["hosted", "hosted_windows", "cortex_m55"])
def test_fault_sweep(board, images, firmwares, capsys):
    """Over the hosted boards' pipes (Linux, and Windows under Wine) and over a QEMU board's TCP serial socket."""
    image = images["base"]
    clean = flash.run_on_board(image, board, PROMPT, 12, Sampling(0.9, 0, 0.95, 5), True, firmware=firmwares[board])
    report = {}
    for rate in (1e-4, 1e-3):
        counts = {"identical": 0, "failed_cleanly": 0, "wrong": 0, "hang": 0, "faults": 0}
        for seed in range(8):
            proxies = []

            def wrap(link, rate=rate, seed=seed):
                proxies.append(LossyTransport(link, rate, seed))
                return proxies[-1]
            t0 = time.monotonic()
            try:
                got = flash.run_on_board(image, board, PROMPT, 12, Sampling(0.9, 0, 0.95, 5), True,
                                         firmware=firmwares[board], timeout=TIMEOUT, retries=RETRIES, wrap=wrap)
                same = got.tokens == clean.tokens and got.logits.tobytes() == clean.logits.tobytes()
                counts["identical" if same else "wrong"] += 1
            except LinkError as exc:
                assert str(exc)  # says what happened
                counts["failed_cleanly"] += 1
            if time.monotonic() - t0 > BOUND:
                counts["hang"] += 1
            c = proxies[0].counts
            counts["faults"] += c.dropped + c.flipped + c.duplicated + c.delayed
        report[rate] = counts
    with capsys.disabled():
        print(f"\nfault sweep ({board}, 8 seeds per rate, timeout {TIMEOUT}s, {RETRIES} retries): {report}")
    for rate, counts in report.items():
        assert counts["wrong"] == 0 and counts["hang"] == 0, (rate, counts)
    assert report[1e-3]["faults"] > 10          # faults really happened
    assert report[1e-4]["identical"] == 8       # and the protocol recovered from them
    assert report[1e-3]["identical"] >= 6


@pytest.mark.parametrize("board", ["hosted", "hosted_windows"])
def test_cut_link_fails_in_bounded_time(board, images, firmwares):
    t0 = time.monotonic()
    with pytest.raises(LinkError, match="failed after 3 attempts"):
        flash.run_on_board(images["base"], board, PROMPT, 12, Sampling(), True, firmware=firmwares[board],
                           timeout=0.3, retries=2, wrap=lambda link: LossyTransport(link, 0.0, cut_after=600))
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("board", ["hosted", "hosted_windows"])
def test_device_reset_mid_generation_is_reported(board, images, firmwares):
    with start_board(load_board(board), firmwares[board], images["base"]) as device:
        client = Client(device.link, timeout=2, retries=2)
        client.open()
        client.start(Sampling())
        client.feed(PROMPT)
        client.step()
        device.proc.kill()  # the board dies mid-generation
        t0 = time.monotonic()
        with pytest.raises(LinkClosed):
            client.step()
        assert time.monotonic() - t0 < 5


def test_upload_resumes_after_a_cut(images, firmwares):
    image = images["top3_gqa4_tied"].read_bytes()
    with start_board(load_board("hosted"), firmwares["hosted"], images["base"],
                     ["--upload-bytes", str(1 << 20), "--arena-bytes", str(1 << 20)]) as device:
        cut = LossyTransport(device.link, 0.0, cut_after=len(image) // 2)
        with pytest.raises(LinkError):
            Client(cut, timeout=0.3, retries=1).upload(image)
        sent = []

        class Counting:
            def read(self, n, timeout):
                return device.link.read(n, timeout)

            def write(self, data):
                sent.append(len(data))
                device.link.write(data)
        resumed = Client(Counting(), timeout=5)
        resumed.seq = 100  # a new host session
        assert resumed.upload(image) == zlib.crc32(image)
        assert sum(sent) < 0.75 * len(image)  # it continued where the cut left it
        opened = resumed.open()
        assert opened.image_bytes == len(image)
        resumed.start(Sampling())
        resumed.feed(PROMPT)
        assert np.isfinite(resumed.logits(opened.vocab_size)).all()
        resumed.quit()
