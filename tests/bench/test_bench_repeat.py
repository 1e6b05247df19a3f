"""`bench --repeat N`: every configuration decoded N times in rounds; medians and min-max in the JSON and the tables;
the plot shows every configuration run (adaptive k included) with the overall line on top."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_fakes import make_run, prompt_run, stats
from click.testing import CliRunner

from specpack.bench.plot import configurations, plot_report
from specpack.bench.report import build_report
from specpack.bench.runner import Decode
from specpack.cli.bench_cmd import bench_command
from specpack.runtime.pack import Pack

MACHINE = {"cpu": "test", "usable_cores": 2, "threads": 1, "onnxruntime": "x"}


def _decode(tokens: list[int], decode_s: float, k: int) -> Decode:
    return Decode(tokens, stats(k, steps=2, accepted=2, new_tokens=len(tokens), decode_s=decode_s))


def test_medians_and_spread_are_over_rounds_paired_within_each() -> None:
    """Rounds of (AR, k 2): AR 4 tokens decoded in 1, 2, 4 s; k 2 in 0.5, 1, 1 s -> per-round speedups 2, 2, 4."""
    t = [5, 6, 7, 8, 9]
    r = prompt_run("a", "x", _decode(t, 1.0, 0), {2: _decode(t, 0.5, 2)})
    r.again = [{0: _decode(t, 2.0, 0), 2: _decode(t, 1.0, 2)}, {0: _decode(t, 4.0, 0), 2: _decode(t, 1.0, 2)}]
    report = build_report(make_run([r], (2,)), MACHINE)
    o = report["overall"]
    assert o["repeats"]["n"] == 3 and o["repeats"]["speedup"] == {"median": 2.0, "min": 2.0, "max": 4.0,
                                                                  "values": [2.0, 2.0, 4.0]}
    assert o["repeats"]["ar_tokens_per_s"]["values"] == [4.0, 2.0, 1.0] and o["ar_tokens_per_s"] == 2.0
    assert o["tokens_per_s"] == 4.0 and o["speedup"] == 2.0 and o["speedup_median"] == 2.0
    assert report["prompts"][0]["repeat_tokens_per_s"]["0"] == [4.0, 2.0, 1.0]


def test_one_round_keeps_the_numbers_it_had() -> None:
    t = [5, 6, 7, 8, 9]
    r = prompt_run("a", "x", _decode(t, 1.0, 0), {2: _decode(t, 0.5, 2)})
    o = build_report(make_run([r], (2,)), MACHINE)["overall"]
    assert (o["tokens_per_s"], o["ar_tokens_per_s"], o["speedup"]) == (8.0, 4.0, 2.0)
    assert o["repeats"]["n"] == 1 and "repeat_tokens_per_s" not in build_report(make_run([r], (2,)), MACHINE)["prompts"][0]


@pytest.mark.parametrize("ks", ["2,4,auto", "auto"])
def test_the_command_repeats_every_configuration_and_plots_them_all(fake_pack: Pack, tmp_path: Path, ks: str) -> None:
    prompts = tmp_path / "mine.txt"
    prompts.write_text("def f(x):\nreturn x\n")
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    result = CliRunner().invoke(bench_command, ["pack", "--prompts", str(prompts), "--max-new-tokens", "12",
                                                "--timing-reps", "1", "--k", ks, "--repeat", "3", "--json", str(out),
                                                "--plot", str(png)], terminal_width=220)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["config"]["repeat"] == 3 and "each decoded 3 times" in " ".join(result.output.split())
    for summary in [*report["by_k"].values(), report["auto"]]:
        rep = summary["repeats"]
        assert rep["n"] == 3 and len(rep["speedup"]["values"]) == 3
        assert rep["speedup"]["min"] <= summary["speedup"] <= rep["speedup"]["max"]
    assert all(len(v) == 3 for row in report["prompts"] for v in row["repeat_tokens_per_s"].values())
    assert list(configurations(report)) == ([*(["2", "4"] if ks != "auto" else []), "auto"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [n for n in report["notes"] if "--repeat" in n]  # the reference backend is deterministic


def test_the_plot_draws_every_configuration_with_the_overall_line_on_top(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    t = [5, 6, 7, 8, 9]
    r = prompt_run("a", "x", _decode(t, 1.0, 0), {2: _decode(t, 0.5, 2), 4: _decode(t, 0.8, 4), "auto": _decode(t, 0.6, 2)})
    run = make_run([r], (2, 4))
    run.auto = True
    report = build_report(run, MACHINE)
    report["auto"]["k_histogram"] = [0, 0, 2]
    drawn: list = []
    real_savefig = plt.Figure.savefig

    def keep(fig: plt.Figure, *args: object, **kwargs: object) -> None:
        drawn.append(fig)
        real_savefig(fig, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt.Figure, "savefig", keep)
        mp.setattr(plt, "close", lambda fig: None)
        plot_report(report, tmp_path / "p.png")
    ax = drawn[0].axes[3]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["k = 2", "k = 4", "adaptive k"]
    overall = [line for line in ax.get_lines() if line.get_gid() == "overall"]
    assert overall and overall[0].get_zorder() == max(line.get_zorder() for line in ax.get_lines())
    assert list(overall[0].get_ydata()) == [report["by_k"]["2"]["speedup"], report["by_k"]["4"]["speedup"],
                                            report["auto"]["speedup"]]


def test_a_round_with_other_tokens_is_named_in_the_notes() -> None:
    from specpack.bench.runner import _repeat_notes

    t = [5, 6, 7, 8, 9]
    r = prompt_run("a", "x", _decode(t, 1.0, 0), {2: _decode(t, 0.5, 2)})
    r.again = [{0: _decode(t, 1.0, 0), 2: _decode([5, 6, 7, 8, 1], 0.5, 2)}]
    assert _repeat_notes([r]) == ["--repeat: 1 decodes gave other tokens than their first run with the same seed "
                                  "(a k=2); alpha, tau and identity are the first run's"]
    r.again[0][2] = _decode(t, 0.5, 2)
    assert _repeat_notes([r]) == []
