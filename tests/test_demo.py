"""The shipped demo model: it really adds, in the reference and on every board."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import RELEASE_BOARDS, ROOT, board_name, with_rtos
from colibri.demo_task import ANSWER_LEN, VOCAB, decode_answer, encode_problem, held_out, held_out_problems
from colibri.image import read_image
from colibri.pack import pack
from colibri.reference import Reference
from tools import demo

MODEL = ROOT / "models" / "demo-adder"


@pytest.fixture(scope="module")
def demo_image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("demo") / "demo.img"
    pack(MODEL, path, max_seq=16, expert_align=64)
    return path


def test_task_encoding():
    assert [VOCAB[t] for t in encode_problem(123, 45, with_answer=True)] == list("^123+045=8610$")
    assert decode_answer([VOCAB.index(c) for c in "8610$"]) == 168
    assert decode_answer([VOCAB.index(c) for c in "86+0$"]) is None
    problems = held_out_problems(1000)
    assert len(set(problems)) == 1000 and all(held_out(a, b) for a, b in problems)


def test_held_out_accuracy_at_least_99_percent(demo_image):
    ref = Reference(read_image(demo_image.read_bytes()))
    problems = held_out_problems(1000)
    correct = sum(decode_answer(ref.greedy(encode_problem(a, b), ANSWER_LEN)) == a + b for a, b in problems)
    assert correct / len(problems) >= 0.99, f"{correct}/1000"


def test_tokenizer_matches_task():
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    assert tok.encode("^123+045=").ids == encode_problem(123, 45)


@pytest.mark.parametrize("board", with_rtos(RELEASE_BOARDS))
def test_demo_answers_on_every_board(board, firmwares, capsys):
    assert demo.main(["--board", board_name(board), "--firmware", str(firmwares[board]), "--problems", "4",
                      "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["passed"] and len(report["problems"]) == 4
    assert report["rows_identical"] == report["rows"] > 0  # every logits row bit-identical to the reference
    assert all(p["correct"] and p["reference_agrees"] for p in report["problems"])


def test_training_is_reproducible(tmp_path):
    """The trainer is seeded: two short runs write the same weights, byte for byte."""
    from tools import train_demo
    for run in ("a", "b"):
        assert train_demo.main(["--steps", "12", "--batch", "32", "-o", str(tmp_path / run)]) == 0
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (MODEL / "tokenizer.json").read_text()
