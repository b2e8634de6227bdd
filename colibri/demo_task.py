"""The demo model's task: 3-digit addition with the answer's digits reversed.

`^123+045=` -> `8610$` (123 + 45 = 0168, written least significant digit first). Shared by the
trainer (tools/train_demo.py), the demo run and the tests, so there is one definition.
"""
from __future__ import annotations

import json

VOCAB = list("0123456789+=$^")
PROMPT_LEN = 9    # ^ddd+ddd=
ANSWER_LEN = 5    # four sum digits reversed, then $


def held_out(a: int, b: int) -> bool:
    """Problems never seen in training (about 1 in 97)."""
    return (a * 1000 + b) % 97 == 0


def problem_text(a: int, b: int) -> str:
    return f"^{a:03d}+{b:03d}="


def encode_problem(a: int, b: int, with_answer: bool = False) -> list[int]:
    text = problem_text(a, b)
    if with_answer:
        text += f"{a + b:04d}"[::-1] + "$"
    return [VOCAB.index(c) for c in text]


def answer_from_text(text: str) -> int | None:
    """The sum a model's answer spells, or None if it is not 4 digits and `$`."""
    text = text[:ANSWER_LEN]
    if len(text) != ANSWER_LEN or not text[:4].isdigit() or text[4] != "$":
        return None
    return int(text[:4][::-1])


def decode_answer(tokens: list[int]) -> int | None:
    """answer_from_text of the answer's token ids."""
    return answer_from_text("".join(VOCAB[t] if 0 <= t < len(VOCAB) else "?" for t in tokens[:ANSWER_LEN]))


def held_out_problems(n: int) -> list[tuple[int, int]]:
    out = [(a, b) for a in range(1000) for b in range(1000) if held_out(a, b)]
    step = max(1, len(out) // n)
    return out[::step][:n]


def tokenizer_json() -> str:
    """A character-level tokenizer in the `tokenizers` JSON format (one token per character)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(VOCAB)}, unk_token="$"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return json.dumps(json.loads(tok.to_str()), indent=1) + "\n"
