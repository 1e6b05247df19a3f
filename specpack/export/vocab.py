"""The draft and the target must speak the same ids: compare their vocabularies, pick the logits width."""

from __future__ import annotations

from pathlib import Path

from specpack.errors import SpecpackError
from specpack.export.tokenizer_export import load_hf_tokenizer

SHOWN = 5  # differing ids named in the error


def check_same_vocabulary(draft_dir: Path, target_dir: Path, draft_rows: int, target_rows: int) -> int:
    """The logits width both graphs use: min(draft_rows, target_rows), once the two tokenizers map every token to
    the same id (added and special tokens included). Embedding rows past the vocabulary (padding) may differ."""
    draft, target = load_hf_tokenizer(Path(draft_dir)), load_hf_tokenizer(Path(target_dir))
    draft_vocab: dict[str, int] = draft.get_vocab()
    target_vocab: dict[str, int] = target.get_vocab()
    if draft_vocab != target_vocab:
        raise SpecpackError(
            "the draft and the target have different vocabularies",
            expected="the same token for every id",
            found=f"{'; '.join(_differences(draft_vocab, target_vocab))} "
                  f"(draft has {len(draft_vocab)} tokens, target {len(target_vocab)})",
            hint="the draft and the target must share a tokenizer: pick a draft from the target's model family")
    ids_needed = max(target_vocab.values(), default=-1) + 1
    rows = min(draft_rows, target_rows)
    if rows < ids_needed:
        raise SpecpackError(
            "a model has fewer embedding rows than its tokenizer has ids",
            expected=f"at least {ids_needed} rows in both models (ids 0..{ids_needed - 1})",
            found=f"draft {draft_rows} rows, target {target_rows} rows",
            hint="the model and its tokenizer do not belong together; check the model directories")
    return rows


def _differences(draft: dict[str, int], target: dict[str, int]) -> list[str]:
    """The first ids whose tokens differ, as "id 1234: draft 'foo', target 'bar'"."""
    draft_tokens = {i: t for t, i in draft.items()}
    target_tokens = {i: t for t, i in target.items()}
    out = []
    for i in sorted(draft_tokens.keys() | target_tokens.keys()):
        d, t = draft_tokens.get(i), target_tokens.get(i)
        if d != t:
            out.append(f"id {i}: draft {_show(d)}, target {_show(t)}")
            if len(out) == SHOWN:
                break
    if not out:  # same id -> token maps, yet the dicts differ: one token under two ids somewhere
        out.append("two tokens share an id in one of them")
    return out


def _show(token: str | None) -> str:
    return "(none)" if token is None else repr(token)
