"""Write the pack's tokenizer/ folder from a model directory, and collect the ids that end generation.

    model_dir --AutoTokenizer--+--> backend_tokenizer.save ----------> PACK/tokenizer/tokenizer.json
                               +--> what transformers does around it -> PACK/tokenizer/tokenizer_config.json
    then PackTokenizer.load(PACK/tokenizer) must give transformers' ids on probe texts and a probe chat.

The tokenizer.json is transformers' backend, not a copy of the model's file: transformers rebuilds some pipelines
(Qwen2's pre-tokenizer, Llama's normalizer), so a copied file can give other ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpack.errors import SpecpackError
from specpack.runtime.tokenizer import CONFIG_FILE, CONFIG_FORMAT, TOKENIZER_FILE, PackTokenizer

SUBDIR = "tokenizer"
PROBE_TEXTS = (
    "Hello world! How are you today?",
    "def add(a, b):\n\treturn a + b\n\n",
    "  leading and trailing spaces  ",
    "Ünïcödé, 中文, emoji 🙂🚀",
)
PROBE_CHAT = [{"role": "user", "content": "Write a haiku about tokenizers."}]


@dataclass(frozen=True)
class TokenizerRecord:
    """What the manifest records about the pack's tokenizer."""

    files: list[str]            # written files, relative to the pack root
    eos_token_ids: list[int]    # union of the generation config's, the config's and the tokenizer's, sorted
    has_chat_template: bool
    vocab_size: int             # len(tokenizer), added tokens included


def write_tokenizer(model_dir: Path, pack_dir: Path) -> TokenizerRecord:
    """Write PACK/tokenizer/{tokenizer.json, tokenizer_config.json} for the tokenizer of `model_dir`."""
    model_dir, pack_dir = Path(model_dir), Path(pack_dir)
    tok = load_hf_tokenizer(model_dir)
    out = pack_dir / SUBDIR
    out.mkdir(parents=True, exist_ok=True)
    tok.backend_tokenizer.save(str(out / TOKENIZER_FILE))
    config = tokenizer_config(tok)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    check_parity(tok, PackTokenizer.load(out))
    return TokenizerRecord(files=[f"{SUBDIR}/{TOKENIZER_FILE}", f"{SUBDIR}/{CONFIG_FILE}"],
                           eos_token_ids=eos_token_ids(model_dir, tok.eos_token_id),
                           has_chat_template=config["chat_template"] is not None, vocab_size=len(tok))


def load_hf_tokenizer(model_dir: Path) -> Any:
    """transformers' AutoTokenizer for `model_dir`; it must have a Rust (tokenizers) backend."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecpackError(f"cannot load the tokenizer of {model_dir}",
                            expected="a model directory with tokenizer.json or tokenizer_config.json",
                            found=f"{type(e).__name__}: {e}") from e
    if not hasattr(tok, "backend_tokenizer"):
        raise SpecpackError(f"the tokenizer of {model_dir} has no Rust backend",
                            expected="a tokenizer transformers runs through `tokenizers` (a fast tokenizer)",
                            found=type(tok).__name__,
                            hint="add a tokenizer.json to the model (save_pretrained of its fast tokenizer)")
    return tok


def tokenizer_config(tok: Any) -> dict[str, Any]:
    """The runtime's tokenizer_config.json: what transformers does around the Rust tokenizer."""
    templates = tok.chat_template
    named = dict(templates) if isinstance(templates, dict) else {}
    default = named.get("default") if named else templates
    model_type = type(tok.backend_tokenizer.model).__name__
    cleanup = bool(tok.clean_up_tokenization_spaces) and (
        model_type != "BPE"  # transformers skips the clean-up for BPE models, unless forced
        or bool(getattr(tok, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)))
    return {
        "format": CONFIG_FORMAT,
        "source_class": type(tok).__name__,
        "vocab_size": len(tok),
        "add_special_tokens": True,  # transformers' __call__ default: the post-processor in tokenizer.json runs
        "split_special_tokens": bool(tok.split_special_tokens),
        "clean_up_tokenization_spaces": cleanup,
        "bos_token": _token(tok.bos_token), "eos_token": _token(tok.eos_token),
        "pad_token": _token(tok.pad_token), "unk_token": _token(tok.unk_token),
        "special_tokens_map": {k: str(v) for k, v in tok.special_tokens_map.items()},
        "chat_template": default,
        "chat_templates": named,
    }


def check_parity(tok: Any, pack_tok: PackTokenizer) -> None:
    """The written tokenizer must reproduce transformers on probe texts and, if it has a template, a probe chat."""
    for text in PROBE_TEXTS:
        want = tok(text)["input_ids"]
        _same(f"ids of {text!r}", want, pack_tok.encode(text))
        _same(f"decode of {text!r}", tok.decode(want, skip_special_tokens=True), pack_tok.decode(want))
    if pack_tok.chat_template is None:
        return
    try:
        want = tok.apply_chat_template(PROBE_CHAT, add_generation_prompt=True, tokenize=True, return_dict=True)
    except Exception:  # a template may refuse a lone user turn: that is the template's business, not export's
        return
    _same("ids of a probe chat", list(want["input_ids"]), pack_tok.encode_messages(PROBE_CHAT))


def eos_token_ids(model_dir: Path, tokenizer_eos: int | None) -> list[int]:
    """Sorted union of generation_config.json's, config.json's (or its text_config's) and the tokenizer's eos ids."""
    ids = set(_ids(tokenizer_eos))
    for name in ("config.json", "generation_config.json"):
        data = _read_json(model_dir / name)
        ids.update(_ids(data.get("eos_token_id")))
        if isinstance(data.get("text_config"), dict):  # multimodal configs keep the language model's ids here
            ids.update(_ids(data["text_config"].get("eos_token_id")))
    return sorted(ids)


def _ids(value: object) -> list[int]:
    """An eos_token_id field (int, list of ints or None) as a list."""
    if value is None:
        return []
    ids = []
    for v in value if isinstance(value, list) else [value]:
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise SpecpackError("invalid eos_token_id", expected="an id, a list of ids or null", found=repr(value))
        ids.append(v)
    return ids


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecpackError(f"{path} is not valid JSON", expected="a JSON object", found=str(e)) from e
    return data if isinstance(data, dict) else {}


def _token(value: object) -> str | None:
    return None if value is None else str(value)


def _same(what: str, want: object, got: object) -> None:
    if want != got:
        raise SpecpackError(f"the exported tokenizer disagrees with transformers: {what}",
                            expected=repr(want)[:300], found=repr(got)[:300],
                            hint="this tokenizer does something outside its tokenizer.json; report it to specpack")
