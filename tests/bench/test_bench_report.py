"""The report's maths on hand-written runs: pooled speedup, predicted speedup, best k, identical outputs."""

from __future__ import annotations

import json

import pytest
from bench_fakes import costs, make_run, prompt_run, stats

from specpack.bench.report import build_report, per_position
from specpack.bench.runner import Decode, first_divergence

TOKENS = list(range(11))
DIVERGED = [0, 1, 2, 99, 4, 5, 6, 7, 8, 9, 10]


def _runs() -> list:
    """Two prompts of 11 new tokens each; prompt b's k=2 output diverges at new token 3."""
    a = prompt_run("a", "code", Decode(TOKENS, stats(0, steps=0, accepted=0, new_tokens=11, decode_s=1.0)), {
        2: Decode(TOKENS, stats(2, steps=4, accepted=6, new_tokens=11, decode_s=0.5, per_position=[1.0, 0.5])),
        4: Decode(TOKENS, stats(4, steps=3, accepted=7, new_tokens=11, decode_s=0.9))})
    b = prompt_run("b", "chat", Decode(TOKENS, stats(0, steps=0, accepted=0, new_tokens=11, decode_s=2.0)), {
        2: Decode(DIVERGED, stats(2, steps=8, accepted=2, new_tokens=11, decode_s=1.6, per_position=[0.25, 0.0])),
        4: Decode(TOKENS, stats(4, steps=8, accepted=2, new_tokens=11, decode_s=2.5))})
    return [a, b]


def test_overall_numbers_at_best_k() -> None:
    run = make_run(_runs(), (2, 4), costs(c=0.25, v={2: 1.0, 4: 1.2}))
    run.gaps = {("b", 3): {"gap": 4e-4, "top2_tokens": [3, 99]}}
    report = build_report(run, machine={"cpu": "test"})
    o = report["overall"]
    assert report["best_k"] == 2 and o["k"] == 2
    assert o["alpha"] == pytest.approx(8 / 24)
    assert o["tau"] == pytest.approx((8 + 12) / 12)
    assert o["tokens_per_s"] == pytest.approx(20 / 2.1)        # pooled: sum of tokens / sum of seconds
    assert o["ar_tokens_per_s"] == pytest.approx(20 / 3.0)
    assert o["speedup"] == pytest.approx((20 / 2.1) / (20 / 3.0))
    assert o["speedup_median"] == pytest.approx((2.0 + 1.25) / 2)  # per-prompt ratios 2.0 and 1.25
    assert o["predicted_speedup"] == pytest.approx(o["tau"] / (2 * 0.25 + 1.0))
    assert o["efficiency"] == pytest.approx(o["speedup"] / o["predicted_speedup"])
    assert (o["c"], o["v"]) == (pytest.approx(0.25), pytest.approx(1.0))
    assert o["identical_fraction"] == 0.5
    assert o["divergences"] == [{"prompt": "b", "position": 3, "gap": 4e-4, "ar_token": 3, "spec_token": 99,
                                 "top2_tokens": [3, 99]}]
    json.dumps(report)  # the whole report is JSON


def test_by_category_and_by_k() -> None:
    report = build_report(make_run(_runs(), (2, 4), costs(c=0.25, v={2: 1.0, 4: 1.2})), machine={})
    code, chat = report["by_category"]["code"], report["by_category"]["chat"]
    assert code["speedup"] == pytest.approx(2.0) and chat["speedup"] == pytest.approx(1.25)
    assert code["identical_fraction"] == 1.0 and chat["identical_fraction"] == 0.0
    k4 = report["by_k"]["4"]
    assert k4["speedup"] == pytest.approx((20 / 3.4) / (20 / 3.0))
    assert k4["predicted_speedup"] == pytest.approx(k4["tau"] / (4 * 0.25 + 1.2))
    assert k4["identical_fraction"] == 1.0 and k4["divergences"] == []
    assert set(k4["by_category"]) == {"code", "chat"}
    assert "by_category" not in report["overall"]


def test_best_k_prefers_the_smaller_k_on_a_tie() -> None:
    runs = _runs()
    for r in runs:
        r.spec[4] = r.spec[2]
    assert build_report(make_run(runs, (2, 4), costs(v={2: 1.0, 4: 1.0})), machine={})["best_k"] == 2


def test_sampling_reports_no_identity_or_divergences() -> None:
    report = build_report(make_run(_runs(), (2, 4), costs(v={2: 1.0, 4: 1.0}), temperature=0.8), machine={})
    assert report["overall"]["identical_fraction"] is None and report["overall"]["divergences"] == []


def test_per_position_pooled_by_steps_or_exact_counts() -> None:
    spec = [d for r in _runs() for k, d in r.spec.items() if k == 2]
    assert per_position(spec, 2) == pytest.approx([(1.0 * 4 + 0.25 * 8) / 12, (0.5 * 4 + 0.0) / 12])
    exact = [Decode([], {**d.stats, "proposed_at": [4, 3], "accepted_at": [4, 1]}) for d in spec]
    assert per_position(exact, 2) == pytest.approx([1.0, 2 / 6])


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_predicted_speedup_formula() -> None:
    c = costs(c=0.34, v={4: 0.99})
    assert c.c == pytest.approx(0.34) and c.v(4) == pytest.approx(0.99)
    assert c.predicted_speedup(4.15, 4) == pytest.approx(4.15 / (4 * 0.34 + 0.99))


def _peer_record(pid: str, category: str, ar_s: float, assisted_s: float, assisted_tokens: list[int]) -> dict:
    def mode(tokens: list[int], seconds: float) -> dict:
        return {"tokens": tokens, "new_tokens": len(tokens), "decoded_tokens": len(tokens) - 1, "ttft_s": 0.1,
                "decode_s": seconds}

    return {"id": pid, "category": category, "same_input_ids": True, "ar": mode(TOKENS, ar_s),
            "assisted": mode(assisted_tokens, assisted_s)}


def test_peer_summary_beside_ours() -> None:
    run = make_run(_runs(), (2, 4), costs(c=0.25, v={2: 1.0, 4: 1.2}))
    run.peers = {"hf": {"dtype": "fp32", "threads": 2, "transformers": "5", "torch": "2", "assistant": {}, "timing": "",
                        "peak_rss_mb": 10.0, "prompts": [_peer_record("a", "code", 4.0, 2.0, TOKENS),
                                                         _peer_record("b", "chat", 4.0, 4.0, DIVERGED)]}}
    report = build_report(run, machine={})
    hf = report["peers"]["hf"]
    assert hf["ar_tokens_per_s"] == pytest.approx(20 / 8.0) and hf["assisted_tokens_per_s"] == pytest.approx(20 / 6.0)
    assert hf["assisted_speedup"] == pytest.approx(8.0 / 6.0)
    assert hf["identical_fraction"] == 0.5 and hf["ar_equals_ours_fraction"] == 1.0
    assert hf["ours_over_assisted"] == pytest.approx(report["overall"]["tokens_per_s"] / (20 / 6.0))
    assert hf["ours_ar_over_hf_ar"] == pytest.approx((20 / 3.0) / (20 / 8.0))
    assert hf["by_category"]["code"]["ours_over_assisted"] == pytest.approx((10 / 0.5) / (10 / 2.0))
