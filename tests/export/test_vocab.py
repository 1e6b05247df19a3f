"""check_same_vocabulary: one id space for the draft and the target, and the logits width both graphs use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specpack.errors import SpecpackError
from specpack.export.vocab import check_same_vocabulary
from tests.tiny import make_model, make_tokenizer


def _rows(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def _tokenizer_dir(tmp_path: Path, name: str, family: str, extra: list[str] | None = None) -> Path:
    tok = make_tokenizer(family)
    if extra:
        tok.add_tokens(extra)
    tok.save_pretrained(tmp_path / name)
    return tmp_path / name


def test_identical_tokenizers_pass(tmp_path: Path) -> None:
    draft, target = _tokenizer_dir(tmp_path, "d", "llama"), _tokenizer_dir(tmp_path, "t", "llama")
    assert check_same_vocabulary(draft, target, 271, 271) == 271


def test_padded_embedding_rows_pass_and_give_the_narrower_width(tmp_path: Path) -> None:
    tok = make_tokenizer("qwen2")
    target = make_model("qwen2", tmp_path / "target", layers=1, heads=1, kv_heads=1, head_dim=8, pad_rows=64,
                        tokenizer=tok)
    draft = make_model("qwen2", tmp_path / "draft", layers=1, heads=1, kv_heads=1, head_dim=8, tokenizer=tok)
    assert _rows(target) == len(tok) + 64
    assert check_same_vocabulary(draft, target, _rows(draft), _rows(target)) == len(tok)
    assert check_same_vocabulary(target, draft, _rows(target), _rows(draft)) == len(tok)
    assert check_same_vocabulary(target, target, _rows(target), _rows(target)) == len(tok) + 64


def test_different_tokenizers_name_the_first_differing_id(tmp_path: Path) -> None:
    draft, target = make_tokenizer("gpt2"), make_tokenizer("qwen2")
    draft.save_pretrained(tmp_path / "d")
    target.save_pretrained(tmp_path / "t")
    draft_tokens = {i: t for t, i in draft.get_vocab().items()}
    target_tokens = {i: t for t, i in target.get_vocab().items()}
    first = next(i for i in range(len(target)) if draft_tokens.get(i) != target_tokens.get(i))
    with pytest.raises(SpecpackError, match="different vocabularies") as err:
        check_same_vocabulary(tmp_path / "d", tmp_path / "t", len(draft), len(target))
    found = str(err.value.found)
    assert found.startswith(f"id {first}: draft {draft_tokens[first]!r}, target {target_tokens[first]!r}")
    assert f"(draft has {len(draft)} tokens, target {len(target)})" in found
    assert err.value.hint is not None and "the draft and the target must share a tokenizer" in err.value.hint


def test_an_extra_added_token_fails(tmp_path: Path) -> None:
    draft = _tokenizer_dir(tmp_path, "d", "llama", extra=["<extra_tok>"])
    target = _tokenizer_dir(tmp_path, "t", "llama")
    with pytest.raises(SpecpackError, match="different vocabularies") as err:
        check_same_vocabulary(draft, target, 300, 300)
    assert err.value.found == "id 271: draft '<extra_tok>', target (none) (draft has 272 tokens, target 271)"


def test_too_few_embedding_rows_fail(tmp_path: Path) -> None:
    draft, target = _tokenizer_dir(tmp_path, "d", "llama"), _tokenizer_dir(tmp_path, "t", "llama")
    with pytest.raises(SpecpackError, match="fewer embedding rows") as err:
        check_same_vocabulary(draft, target, 271, 200)
    assert err.value.expected == "at least 271 rows in both models (ids 0..270)"
    assert err.value.found == "draft 271 rows, target 200 rows"
