"""The pack's tokenizer: transformers' encoding, decoding and chat templates, from `tokenizers` and jinja2 alone.

A pack's tokenizer/ folder holds two files, both written by specpack.export.tokenizer_export:
    tokenizer.json         the Rust tokenizer exactly as transformers had built it (`backend_tokenizer.save`)
    tokenizer_config.json  what transformers does around it: see CONFIG_SCHEMA

`encode` gives the ids of transformers' `tokenizer(text)["input_ids"]`, `encode_chat` those of
`apply_chat_template([...], add_generation_prompt=True)`, `decode` the text of `decode(ids)` (skipping special
tokens by default). Which ids end generation is the manifest's business, not the tokenizer's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from specpack.errors import SpecpackError
from specpack.names import TOKENIZER_CONFIG_FILE as CONFIG_FILE
from specpack.names import TOKENIZER_FILE, TOKENIZER_LOADED_FILES
from specpack.runtime.chat_template import render_chat

CONFIG_FORMAT = "specpack-tokenizer/1"
_STR_OR_NULL = (str, type(None))
CONFIG_SCHEMA: dict[str, tuple[type | tuple[type, ...], str]] = {  # key -> (JSON type, what it holds)
    "format": (str, f"always {CONFIG_FORMAT!r}"),
    "source_class": (str, "transformers' tokenizer class at export (informational)"),
    "vocab_size": (int, "len(tokenizer): ids in the vocabulary, added tokens included"),
    "add_special_tokens": (bool, "encode() runs the post-processor (BOS/EOS) as transformers' __call__ does"),
    "split_special_tokens": (bool, "special tokens in the text are split like plain text, not matched"),
    "clean_up_tokenization_spaces": (bool, "decode() removes spaces before punctuation, as transformers does"),
    "bos_token": (_STR_OR_NULL, "string or null"),
    "eos_token": (_STR_OR_NULL, "string or null"),
    "pad_token": (_STR_OR_NULL, "string or null"),
    "unk_token": (_STR_OR_NULL, "string or null"),
    "special_tokens_map": (dict, "the variables transformers passes to chat templates (bos_token, eos_token, ...)"),
    "chat_template": (_STR_OR_NULL, "the template apply_chat_template uses by default, or null"),
    "chat_templates": (dict, "every named template when the source had several, else {}"),
}


class PackTokenizer:
    """Encode, decode, stream and render chat templates as transformers does for the source model."""

    def __init__(self, backend: Tokenizer, config: Mapping[str, Any]) -> None:
        self._backend = backend
        self._add_special_tokens = bool(config["add_special_tokens"])
        self._cleanup = bool(config["clean_up_tokenization_spaces"])
        self.chat_template: str | None = config["chat_template"]
        self.chat_templates: dict[str, str] = dict(config["chat_templates"])
        self.special_tokens_map: dict[str, str] = dict(config["special_tokens_map"])
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = bool(config["split_special_tokens"])

    @classmethod
    def load(cls, tokenizer_dir: Path) -> PackTokenizer:
        """Load tokenizer.json and tokenizer_config.json from a pack's tokenizer/ folder."""
        tokenizer_dir = Path(tokenizer_dir)
        files = {}
        for name in TOKENIZER_LOADED_FILES:
            path = tokenizer_dir / name
            if not path.is_file():
                raise SpecpackError(f"no {name} in {tokenizer_dir}", expected=f"the file {path}",
                                    found="no such file", hint="export the pack again (spec-export)")
            try:
                files[name] = path.read_bytes()
            except OSError as e:
                raise SpecpackError(f"cannot read {path}", expected="a readable file", found=e.strerror or str(e),
                                    hint="export the pack again (spec-export)") from None
        return cls.from_bytes(files[CONFIG_FILE], files[TOKENIZER_FILE], tokenizer_dir)

    @classmethod
    def from_bytes(cls, config_bytes: bytes, tokenizer_bytes: bytes, where: Path) -> PackTokenizer:
        """The tokenizer from its two files' bytes (a pinned load hands over bytes it hashed); `where`: for messages."""
        config = _parse_config(config_bytes, where / CONFIG_FILE)
        path = where / TOKENIZER_FILE
        try:
            backend = Tokenizer.from_str(tokenizer_bytes.decode("utf-8"))
        except Exception as e:  # the Rust side raises a bare Exception for JSON and schema errors
            raise SpecpackError(f"{path} is not a valid tokenizer", expected="a tokenizers JSON file",
                                found=f"{type(e).__name__}: {str(e)[:200]}",
                                hint="export the pack again (spec-export)") from None
        size = backend.get_vocab_size(with_added_tokens=True)
        if size != config["vocab_size"]:
            raise SpecpackError(f"{path} does not match {CONFIG_FILE}",
                                expected=f"vocab_size {config['vocab_size']}", found=f"{size} tokens",
                                hint="the files come from different exports: export the pack again")
        return cls(backend, config)

    @property
    def vocab_size(self) -> int:
        """Ids in the vocabulary, added tokens included (transformers' len(tokenizer))."""
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        """The id of `token` (a vocabulary entry, not text), or None."""
        return self._backend.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """Ids of plain text, with the special tokens transformers adds by default (e.g. Llama's BOS)."""
        return list(self._backend.encode(text, add_special_tokens=self._add_special_tokens).ids)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, *,
                    tools: Sequence[Mapping[str, Any]] | None = None, **template_kwargs: Any) -> str:
        """The chat template's text for `messages`, as transformers' apply_chat_template(..., tokenize=False)."""
        variables = {**self.special_tokens_map, **template_kwargs}  # kwargs win, as in transformers
        return render_chat(self._template(tools), messages, add_generation_prompt=add_generation_prompt,
                           variables=variables, tools=tools)

    def encode_messages(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, *,
                        tools: Sequence[Mapping[str, Any]] | None = None, **template_kwargs: Any) -> list[int]:
        """Ids of the rendered chat; the template writes its own special tokens, so none are added."""
        text = self.render_chat(messages, add_generation_prompt, tools=tools, **template_kwargs)
        return list(self._backend.encode(text, add_special_tokens=False).ids)

    def encode_chat(self, user_message: str) -> list[int]:
        """Ids of one user turn followed by the assistant's generation prompt."""
        return self.encode_messages([{"role": "user", "content": user_message}], add_generation_prompt=True)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`, as transformers' decode (which skips special tokens only when asked)."""
        text = self._backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        return clean_up_tokenization(text) if self._cleanup else text

    def _template(self, tools: object) -> str:
        """transformers' choice: the "tool_use" template when tools are given and there is one, else the default."""
        if tools is not None and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        if self.chat_template is not None:
            return self.chat_template
        found = (f"templates named {sorted(self.chat_templates)}, none of them 'default'" if self.chat_templates
                 else "no chat_template in the pack's tokenizer")
        raise SpecpackError("this model has no chat template", expected="a tokenizer with a default chat template",
                            found=found, hint="drop --chat and pass the prompt as plain text")

    def stream(self, skip_special_tokens: bool = True) -> TextStream:
        """An incremental detokenizer for generated ids."""
        return TextStream(lambda ids: self._backend.decode(ids, skip_special_tokens=skip_special_tokens),
                          clean_up_tokenization if self._cleanup else None)


class TextStream:
    """Incremental detokenizer: push ids one at a time, get the new printable text; the concatenation of every
    push() and the final flush() equals decode() of all ids.

    Text ending in U+FFFD (an incomplete UTF-8 sequence or byte-fallback run) is held back until it completes.
    Each push decodes only a short window of ids: `ids[start:]`, where the text of `ids[start:read]` is known to
    end the text printed so far, so the new text is the window's text past `window_text`. Decoders treat the first
    token of a sequence specially (Llama's leading-space strip), so a window only moves to a start whose text is
    non-empty and matches the end of what was printed; elsewhere it stays put and grows.
    """

    def __init__(self, decode: Callable[[list[int]], str], cleanup: Callable[[str], str] | None) -> None:
        self._decode, self._cleanup = decode, cleanup
        self._reset()

    def _reset(self) -> None:
        self._ids: list[int] = []
        self._start = 0          # window start
        self._read = 0           # ids[:read] are resolved: their text is in self._raw
        self._window_text = ""   # decode(ids[start:read])
        self._raw = ""           # decode(ids[:read]), before clean-up
        self._printed = ""       # everything returned so far

    def push(self, token_id: int) -> str:
        """Add one id; return the text that is now final (possibly "")."""
        self._ids.append(int(token_id))
        text = self._decode(self._ids[self._start:])
        if text.endswith("\ufffd"):
            return ""
        if not text.startswith(self._window_text):  # the window's context changed earlier text: decode it all
            text, self._start, self._window_text = self._decode(self._ids), 0, self._raw
            if text.endswith("\ufffd") or not text.startswith(self._raw):
                return ""
        self._raw += text[len(self._window_text):]
        resolved_from, self._read = self._read, len(self._ids)
        candidate = self._decode(self._ids[resolved_from:])
        if candidate and self._raw.endswith(candidate):
            self._start, self._window_text = resolved_from, candidate
        else:
            self._window_text = text
        return self._emit(final=False)

    def flush(self) -> str:
        """Return everything still held back, and start over for a new sequence."""
        self._raw = self._decode(self._ids)
        rest = self._emit(final=True)
        self._reset()
        return rest

    def _emit(self, final: bool) -> str:
        if self._cleanup is None:
            text = self._raw
        else:  # clean-up rewrites " ." and the like: hold back from the last space until the next word is known
            cut = len(self._raw) if final else _last_safe_space(self._raw)
            text = self._cleanup(self._raw[:cut])
        if not text.startswith(self._printed):
            return text[len(self._printed):] if final else ""
        new = text[len(self._printed):]
        self._printed = text
        return new


def clean_up_tokenization(text: str) -> str:
    """transformers' `clean_up_tokenization`: spaces before punctuation and English contractions removed."""
    return (text.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",")
            .replace(" ' ", "'").replace(" n't", "n't").replace(" 'm", "'m").replace(" 's", "'s")
            .replace(" 've", "'ve").replace(" 're", "'re"))


def _last_safe_space(text: str) -> int:
    """Index of the last space no clean-up pattern can reach across (" ' " spans a space: step over it)."""
    cut = text.rfind(" ")
    while cut > 0 and text[:cut].endswith(" '"):
        cut = text.rfind(" ", 0, cut - 1)
    return max(cut, 0)


def _parse_config(data: bytes, path: Path) -> dict[str, Any]:
    try:
        config = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecpackError(f"{path} is not valid JSON", expected="a JSON object", found=str(e)[:200],
                            hint="export the pack again (spec-export)") from None
    except RecursionError:
        raise SpecpackError(f"{path} is not valid JSON", expected="a JSON object nested a few levels deep",
                            found="JSON nested too deeply to parse", hint="export the pack again (spec-export)"
                            ) from None
    if not isinstance(config, dict) or config.get("format") != CONFIG_FORMAT:
        found = config.get("format") if isinstance(config, dict) else type(config).__name__
        raise SpecpackError(f"{path} is not a specpack tokenizer config", expected=f"format {CONFIG_FORMAT!r}",
                            found=repr(found), hint="export the pack again with this version of specpack")
    missing = sorted(set(CONFIG_SCHEMA) - set(config))
    if missing:
        raise SpecpackError(f"{path} is incomplete", expected=f"keys {sorted(CONFIG_SCHEMA)}",
                            found=f"missing {missing}", hint="export the pack again (spec-export)")
    wrong = [key for key, (kind, _) in CONFIG_SCHEMA.items() if not isinstance(config[key], kind)]
    if wrong:
        raise SpecpackError(f"{path} has values of the wrong type",
                            expected="; ".join(f"{key}: {CONFIG_SCHEMA[key][1]}" for key in wrong),
                            found=", ".join(f"{key}={config[key]!r}" for key in wrong)[:300],
                            hint="export the pack again (spec-export)")
    return config
