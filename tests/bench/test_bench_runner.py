"""The runner and the command on a Pack over the numpy reference engines (no graphs): what is run, timed, reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_fakes import make_fake_pack
from click.testing import CliRunner

from specpack.bench.runner import BenchConfig, check_ks, run_bench
from specpack.bench.timing import measure_step_costs
from specpack.cli.bench_cmd import bench_command
from specpack.errors import SpecpackError
from specpack.prompts import BenchPrompt
from specpack.runtime.pack import Pack

PROMPTS = [BenchPrompt("t/0", "code", "def f(x):", chat=False), BenchPrompt("t/1", "code", "return x", chat=False),
           BenchPrompt("c/0", "chat", "hello there", chat=True)]


def test_run_decodes_every_prompt_at_k0_and_each_k(fake_pack: Pack) -> None:
    run = run_bench(Path("any"), PROMPTS, BenchConfig(ks=(1, 3), max_new_tokens=20, timing_reps=2))
    assert run.ks == (1, 3) and len(run.runs) == 3
    for r in run.runs:
        assert r.ids == fake_pack.encode(r.prompt.text, chat=r.prompt.chat)
        assert r.ar.stats["k"] == 0 and sorted(r.spec) == [1, 3]
        assert all(d.tokens == r.ar.tokens for d in r.spec.values())  # greedy: lossless
        assert len(r.ar.tokens) == 20
    assert run.costs.c > 0 and set(run.costs.verify_s) == {1, 3}
    assert {"load", "timing", "autoregressive", "speculative"} <= set(run.peak_memory["peak_rss_mb"])


def test_ngram_drafter_is_benched_without_a_draft_step(fake_pack: Pack) -> None:
    """--drafter ngram: every decode drafts by prompt lookup, no draft step is timed (c = 0), still lossless."""
    run = run_bench(Path("any"), PROMPTS, BenchConfig(ks=(2,), max_new_tokens=20, timing_reps=2, drafter="ngram"))
    assert run.pack["drafter"] == "ngram" and run.costs.c == 0.0 and set(run.costs.verify_s) == {2}
    for r in run.runs:
        assert r.spec[2].stats["drafter"] == "ngram" and r.spec[2].tokens == r.ar.tokens


def test_prompts_too_long_are_skipped_not_truncated(fake_pack: Pack) -> None:
    long = BenchPrompt("long/0", "x", "y" * 190, chat=False)
    run = run_bench(Path("any"), [*PROMPTS[:1], long], BenchConfig(ks=(2,), max_new_tokens=20, timing_reps=1))
    assert [r.prompt.id for r in run.runs] == ["t/0"]
    assert run.skipped == [{"prompt": "long/0", "reason": "190 prompt tokens + 20 > max_len 200"}]
    with pytest.raises(SpecpackError, match="no prompt fits the pack"):
        run_bench(Path("any"), [long], BenchConfig(ks=(2,), max_new_tokens=20))


def test_check_ks() -> None:
    assert check_ks(None, 4) == ((4,), True)  # no --k: the pack's k_max and adaptive k
    assert check_ks([4, 1, 2, 2], 4) == ((1, 2, 4), False)
    assert check_ks([2, None], 4) == ((2,), True) and check_ks([None], 4) == ((), True)
    with pytest.raises(SpecpackError, match=r"an integer in 1\.\.4 \(this pack's k_max\)"):
        check_ks([1, 8], 4)
    with pytest.raises(SpecpackError, match="invalid --k"):
        check_ks([0, 2], 4)  # k = 0 is the baseline every sweep runs: not a sweep value


def test_timing_restores_state() -> None:
    pack = make_fake_pack(k_max=4)
    costs = measure_step_costs(pack, (1, 4), context=30, filler=[3, 4, 5], reps=3, warmup=1)
    assert costs.context_tokens == 30 and costs.target_step_s > 0 and costs.v(4) > 0
    backend = pack.backend
    assert backend.target().engine.cache(0).length == 0 and backend.draft().engine.cache(0).length == 0  # type: ignore[attr-defined]
    out = pack.generate([3, 4, 5], 10, k=4)
    assert out.tokens == pack.generate([3, 4, 5], 10, k=0).tokens


def test_command_writes_json_table_and_plot(fake_pack: Pack, tmp_path: Path) -> None:
    prompts = tmp_path / "mine.txt"
    prompts.write_text("def f(x):\nreturn x\nwhile True:\n")
    spec = tmp_path / "spec.jsonl"
    spec.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["Write."]}) + "\n")
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    result = CliRunner().invoke(bench_command, [
        "pack", "--prompts", str(prompts), "--prompts", str(spec), "--k", "1,2,4", "--max-new-tokens", "16",
        "--limit", "2", "--timing-reps", "2", "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert set(report) >= {"overall", "by_category", "by_k", "best_k", "machine", "peak_memory", "peers"}
    assert set(report["overall"]) >= {"alpha", "tau", "speedup", "predicted_speedup", "tokens_per_s",
                                      "ar_tokens_per_s", "identical_fraction", "c", "v", "k", "divergences"}
    assert set(report["by_category"]) == {"mine", "writing"} and report["by_category"]["mine"]["n_prompts"] == 2
    assert set(report["by_k"]) == {"1", "2", "4"} and report["overall"]["k"] == report["best_k"]
    assert report["overall"]["identical_fraction"] == 1.0
    assert "by category" in result.output and "k sweep" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_adaptive_k_is_its_own_row_with_its_k_histogram(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--k 2,4,auto: the fixed ks as before (by_k, best_k, overall), adaptive k beside them in `auto`, with the
    ks it chose; the table shows it in its own rows."""
    monkeypatch.setattr("specpack.runtime.pack.load", lambda path, device="cpu", threads=None: make_fake_pack())
    prompts = tmp_path / "mine.txt"
    prompts.write_text("def f(x):\nreturn x\n")
    out = tmp_path / "r.json"
    args = ["pack", "--prompts", str(prompts), "--max-new-tokens", "16", "--timing-reps", "1", "--json", str(out),
            "--overwrite"]  # each run below replaces the report
    result = CliRunner().invoke(bench_command, [*args, "--k", "2,4,auto"], terminal_width=200)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert set(report["by_k"]) == {"2", "4"} and report["best_k"] in (2, 4) and report["overall"]["k"] == report["best_k"]
    assert report["config"]["ks"] == [2, 4] and report["config"]["auto"] is True
    auto = report["auto"]
    assert auto["k"] == "auto" and auto["predicted_speedup"] is None and auto["identical_fraction"] == 1.0
    assert sum(auto["k_histogram"]) == sum(r["spec"]["auto"]["steps"] for r in report["prompts"]) > 0
    assert len(auto["k_histogram"]) <= 5 and set(auto["by_category"]) == {"mine"}
    assert "k_histogram" in auto["by_category"]["mine"] and "k_asked_histogram" in auto
    assert "adaptive k (auto)" in result.output and "steps by k" in result.output and "k sweep" in result.output
    # a fixed-k sweep keeps its report as it was: no auto keys
    result = CliRunner().invoke(bench_command, [*args, "--k", "2,4"])
    assert result.exit_code == 0, result.output
    fixed = json.loads(out.read_text())
    assert "auto" not in fixed and "auto" not in fixed["config"] and "adaptive k" not in result.output
    assert set(fixed["prompts"][0]["spec"]) == {"2", "4"}
    # auto alone: overall is adaptive k
    result = CliRunner().invoke(bench_command, [*args, "--k", "auto"])
    assert result.exit_code == 0, result.output
    alone = json.loads(out.read_text())
    assert alone["by_k"] == {} and alone["best_k"] == "auto" and alone["overall"]["k"] == "auto"
    assert alone["overall"]["k_histogram"] == alone["auto"]["k_histogram"]


def test_default_sweep_is_k_max_and_auto(fake_pack: Pack) -> None:
    run = run_bench(Path("any"), PROMPTS[:1], BenchConfig(max_new_tokens=12, timing_reps=1))
    assert run.ks == (fake_pack.manifest.k_max,) and run.auto
    assert set(run.runs[0].spec) == {fake_pack.manifest.k_max, "auto"}
    assert run.runs[0].spec["auto"].stats["k_policy"] == "auto"
    assert run.runs[0].spec["auto"].tokens == run.runs[0].ar.tokens


def test_command_errors_are_clean(fake_pack: Pack, tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    result = CliRunner().invoke(bench_command, ["pack", "--prompts", str(prompts), "--k", "2,x"])
    assert result.exit_code == 2 and "invalid --k" in result.output
    result = CliRunner().invoke(bench_command, ["pack", "--prompts", str(prompts), "--k", "9"])
    assert result.exit_code == 2 and "1..4 (this pack's k_max)" in result.output
    result = CliRunner().invoke(bench_command, ["pack", "--prompts", str(prompts), "--k", "2,often"])
    assert result.exit_code == 2 and "comma-separated integers and 'auto'" in result.output
    result = CliRunner().invoke(bench_command, ["pack", "--prompts", str(prompts), "--repeat", "0"])
    assert result.exit_code == 2 and "invalid --repeat" in result.output and "an integer >= 1" in result.output


def test_divergences_ask_for_gaps_at_the_common_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench_fakes import make_run, prompt_run, stats

    from specpack.bench import peer_hf
    from specpack.bench.runner import Decode, add_hf_extras

    asked = []

    def fake_gaps(target_dir: str | None, requests: list, *, threads: int, dtype: str) -> tuple[list, None]:
        asked.extend(requests)
        return [{"prompt": r["prompt"], "position": r["position"], "gap": 1e-4} for r in requests], None

    monkeypatch.setattr(peer_hf, "logit_gaps", fake_gaps)
    s = stats(2, steps=2, accepted=2, new_tokens=5, decode_s=1.0)
    run = make_run([prompt_run("a", "x", Decode([5, 6, 7, 8, 9], s), {1: Decode([5, 6, 0, 8, 9], s),
                                                                      2: Decode([5, 6, 0, 1, 2], s)})], (1, 2))
    run.pack.update(target_source={"resolved": "t"}, draft_source={"resolved": "d"})
    add_hf_extras(run)
    assert asked == [{"prompt": "a", "position": 2, "prefix": [1, 2, 3, 5, 6]}]  # once for both k: same prefix
    assert run.gaps == {("a", 2): {"prompt": "a", "position": 2, "gap": 1e-4}}
