"""Text in, text out: the tokenizer and chat template an image carries in its metadata section
(docs/FORMAT.md), taken from the checkpoint by pack.py and used by flash.py --prompt / --chat.

The tokenizer is the checkpoint's own `tokenizer.json`, run by the `tokenizers` library (as
transformers' fast tokenizers run it); the chat template is rendered with jinja2 the way
transformers' `apply_chat_template` renders it, so a prompt becomes the same token ids as it would in
transformers.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path


class NoTokenizer(ValueError):
    """The image carries no tokenizer (or no chat template, for --chat)."""


def gguf_meta(src: Path) -> dict | None:
    """The metadata section for a GGUF file: its vocabulary (the tokenizer.ggml.* keys) as transformers
    turns it into a tokenizers object, the chat template and the special tokens. None when the file has
    no vocabulary, or transformers (which does the conversion) is not installed."""
    from colibri.gguf_input import open_gguf
    fields = open_gguf(src).fields

    def value(key: str):
        return fields[key].contents() if key in fields else None
    if value("tokenizer.ggml.tokens") is None:
        return None
    try:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast
        from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
    except ImportError:
        return None
    try:
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    except Exception:  # noqa: BLE001  transformers cannot build this architecture's config from the file (deepseek2
        # and gpt-oss as llama.cpp writes them: ValueError, TypeError; gemma4's per-layer KV heads: its strict
        # dataclass's own error): the vocabulary alone
        architecture, tokenizer, special = get_gguf_tokenizer(str(src))
        tok = PreTrainedTokenizerFast(tokenizer_object=convert_gguf_tokenizer(architecture, tokenizer)[0],
                                      **{k: v for k, v in special.items() if v is not None})
        tok.backend_tokenizer.post_processor = _special_tokens(value, tok.backend_tokenizer)
    meta: dict = {"tokenizer": json.loads(tok.backend_tokenizer.to_str())}
    if isinstance(value("tokenizer.chat_template"), str):
        meta["chat_template"] = value("tokenizer.chat_template")
    for key in ("bos_token", "eos_token"):
        if isinstance(getattr(tok, key), str):
            meta[key] = getattr(tok, key)
    eos = value("tokenizer.ggml.eos_token_id")
    meta["eos_token_ids"] = [int(eos)] if eos is not None else []
    return meta


def _special_tokens(value, backend):
    """The BOS and EOS llama.cpp puts around a prompt (tokenizer.ggml.add_bos_token, add_eos_token) as a tokenizers
    post-processor, for a vocabulary converted alone (transformers' conversion of the file's own config adds them)."""
    from tokenizers import processors
    ends = {}
    for end in ("bos", "eos"):
        token_id = value(f"tokenizer.ggml.{end}_token_id")
        if value(f"tokenizer.ggml.add_{end}_token") is True and token_id is not None and \
                backend.id_to_token(int(token_id)) is not None:
            ends[end] = (backend.id_to_token(int(token_id)), int(token_id))
    single = " ".join(([ends["bos"][0]] if "bos" in ends else []) + ["$A"] + ([ends["eos"][0]] if "eos" in ends else []))
    pair = single + " " + single.replace("$A", "$B")
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=list(ends.values()))


def checkpoint_meta(src: Path) -> dict | None:
    """The metadata section for a checkpoint: a directory's tokenizer, chat template and end-of-sequence
    tokens (None when it has no tokenizer.json), or a GGUF file's (gguf_meta)."""
    src = Path(src)
    from colibri.inputs import is_gguf
    if src.is_file() and is_gguf(src):
        return gguf_meta(src)
    if not src.is_dir() or not (src / "tokenizer.json").exists():
        return None
    meta: dict = {"tokenizer": json.loads((src / "tokenizer.json").read_text())}
    config = src / "tokenizer_config.json"
    cfg = json.loads(config.read_text()) if config.exists() else {}
    template = cfg.get("chat_template")
    if template is None and (src / "chat_template.jinja").exists():
        template = (src / "chat_template.jinja").read_text()
    if isinstance(template, str):
        meta["chat_template"] = template
    for key in ("bos_token", "eos_token"):
        token = cfg.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str):
            meta[key] = token
    gen = src / "generation_config.json"
    eos = json.loads(gen.read_text()).get("eos_token_id") if gen.exists() else None
    if eos is None and (src / "config.json").exists():
        cfg = json.loads((src / "config.json").read_text())
        eos = cfg.get("eos_token_id", (cfg.get("text_config") or {}).get("eos_token_id"))  # multimodal: its text model's
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    meta["eos_token_ids"] = [int(i) for i in ids]
    return meta


class Text:
    """An image's tokenizer and chat template."""

    def __init__(self, meta: dict | None):
        if not meta or "tokenizer" not in meta:
            raise NoTokenizer("this image carries no tokenizer: pack it from a checkpoint directory with a "
                              "tokenizer.json, or give token ids with --prompt-tokens")
        from tokenizers import Tokenizer
        self.tokenizer = Tokenizer.from_str(json.dumps(meta["tokenizer"]))
        self.meta = meta
        eos = set(meta.get("eos_token_ids", []))
        if "eos_token" in meta and self.tokenizer.token_to_id(meta["eos_token"]) is not None:
            eos.add(self.tokenizer.token_to_id(meta["eos_token"]))
        self.eos_ids = frozenset(eos)

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """The chat template rendered for `messages`, ready for the assistant's answer (transformers'
        apply_chat_template(..., add_generation_prompt=True, tokenize=False))."""
        template = self.meta.get("chat_template")
        if not template:
            raise NoTokenizer("this image's checkpoint has no chat template: use --prompt")
        from jinja2.exceptions import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent,
                                                                                   ensure_ascii=ensure_ascii)
        env.globals.update(raise_exception=raise_exception,
                           strftime_now=lambda fmt: datetime.now().strftime(fmt))
        return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                                bos_token=self.meta.get("bos_token", ""),
                                                eos_token=self.meta.get("eos_token", ""))

    def chat_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        """The rendered template as token ids: the template writes its special tokens itself, so none are
        added (as apply_chat_template tokenizes)."""
        return self.encode(self.chat_prompt(messages), special_tokens=False)


class TextStream:
    """The text of tokens as they arrive: each push returns what is new, holding back a character whose
    bytes have not all arrived (decoded alone they would show as U+FFFD and change later)."""

    def __init__(self, text: Text):
        self.text = text
        self.ids: list[int] = []
        self.shown = ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        return self._advance(self.text.decode(self.ids).rstrip("\ufffd"))

    def finish(self) -> str:
        """The rest, unfinished characters included."""
        return self._advance(self.text.decode(self.ids))

    def _advance(self, now: str) -> str:
        if not now.startswith(self.shown):  # a decoder that rewrote the past: keep what was shown
            return ""
        piece, self.shown = now[len(self.shown):], now
        return piece
