"""The transformers side on a tiny pair: logit gaps (through the child process) and the peer's records."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from specpack.bench import peer_hf

pytest.importorskip("transformers")


def test_logit_gaps_in_a_child_process(tiny_pairs: Callable[..., tuple[Path, Path]]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, target = tiny_pairs("qwen2")
    ids = AutoTokenizer.from_pretrained(target)("def add(a, b):")["input_ids"]
    gaps, note = peer_hf.logit_gaps(str(target), [{"prompt": "p", "position": 0, "prefix": ids}], threads=1, dtype="fp32")
    assert note is None
    with torch.inference_mode():
        logits = AutoModelForCausalLM.from_pretrained(target).eval()(torch.tensor([ids])).logits[0, -1]
    top = torch.topk(logits, 2)
    [gap] = gaps
    assert (gap["prompt"], gap["position"]) == ("p", 0)
    assert gap["gap"] == pytest.approx(float(top.values[0] - top.values[1]), abs=1e-5)
    assert gap["top2_tokens"] == top.indices.tolist()


def test_missing_model_dir_is_a_note(tmp_path: Path) -> None:
    gaps, note = peer_hf.logit_gaps(str(tmp_path / "gone"), [{"prompt": "p", "position": 0, "prefix": [1]}],
                                    threads=1, dtype="fp32")
    assert gaps == [] and note is not None and "is not here" in note
    assert "no resolved source" in (peer_hf.logit_gaps(None, [], threads=1, dtype="fp32")[1] or "")


def test_peer_records_ar_and_assisted(tiny_pairs: Callable[..., tuple[Path, Path]]) -> None:
    from transformers import AutoTokenizer

    draft, target = tiny_pairs("qwen2")
    tok = AutoTokenizer.from_pretrained(target)
    plain = tok("def add(a, b):")["input_ids"]
    chat = tok.apply_chat_template([{"role": "user", "content": "Hello world!"}], add_generation_prompt=True,
                                   tokenize=True, return_dict=False)
    out = peer_hf.peer_main({
        "draft": str(draft), "target": str(target), "threads": 1, "dtype": "fp32", "max_new_tokens": 12,
        "eos_token_ids": [tok.eos_token_id], "prompts": [
            {"id": "p", "category": "code", "text": "def add(a, b):", "chat": False, "ids": plain},
            {"id": "q", "category": "chat", "text": "Hello world!", "chat": True, "ids": list(chat)}]})
    assert [r["id"] for r in out["prompts"]] == ["p", "q"]
    for rec in out["prompts"]:
        assert rec["same_input_ids"]
        for mode in ("ar", "assisted"):
            r = rec[mode]
            assert 1 <= r["new_tokens"] <= 12 and r["decode_s"] >= 0 and r["ttft_s"] > 0
            assert 0 <= r["decoded_tokens"] < r["new_tokens"]
        assert rec["assisted"]["tokens"] == rec["ar"]["tokens"]  # greedy assisted generation is lossless
    assert out["peak_rss_mb"] > 0 and out["dtype"] == "fp32"


def test_a_source_dir_holding_another_model_is_not_run(tiny_pairs: Callable[..., tuple[Path, Path]],
                                                       tmp_path: Path) -> None:
    """The issue's finding: a pack pointing at other models reported a 68x "speedup" over them."""
    import shutil

    from specpack.export.sources import source_record

    _, target = tiny_pairs("qwen2")
    copy = Path(shutil.copytree(target, tmp_path / "target"))
    record = source_record(str(copy), copy)
    assert peer_hf.source_mismatch(record) is None
    weights = next(p for p in copy.iterdir() if p.suffix == ".safetensors")
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert f"{weights.name} is not the file the pack was exported from" in (peer_hf.source_mismatch(record) or "")
    assert "records no sha256" in (peer_hf.source_mismatch({**record, "files": {}}) or "")
