"""`--plot OUT.png`: the bench report at a glance, drawn from its JSON (so a saved report can be redrawn).

    +--------------------------------+--------------------------------+
    | speedup per category           | alpha per category             |
    | (measured vs predicted, bars;  | (bars, tau written on top)     |
    |  --repeat: min-max whiskers)   |                                |
    +--------------------------------+--------------------------------+
    | acceptance by draft position   | every configuration run: speedup per fixed k and  |
    | (a line per category, top k)   | adaptive k, the overall line on top (whiskers: |
    |                                | --repeat min-max); one configuration: tok/s bars |
    +--------------------------------+--------------------------------+
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specpack.errors import SpecpackError

MEASURED, PREDICTED, AR = "#2b6cb0", "#a0aec0", "#dd6b20"


def require_matplotlib() -> Any:
    """matplotlib.pyplot on the Agg backend; a SpecpackError when matplotlib is missing (checked before a run)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise SpecpackError("--plot needs matplotlib", expected="matplotlib installed",
                            found="no matplotlib", hint="pip install 'specpack[bench]'") from err
    return plt


def plot_report(report: dict[str, Any], out: Path) -> Path:
    plt = require_matplotlib()
    fig, axes = plt.subplots(2, 2, figsize=(14, 9.5))
    groups = {"overall": report["overall"], **report["by_category"]}
    _speedup_bars(axes[0, 0], groups, report["best_k"])
    _alpha_bars(axes[0, 1], groups)
    configs = configurations(report)
    deepest_k = max(configs, key=lambda k: len(configs[k]["per_position"]))  # the most draft positions
    deepest = configs[deepest_k]
    _acceptance_lines(axes[1, 0], {"overall": deepest, **deepest["by_category"]}, deepest_k)
    if len(configs) > 1:
        _configurations(axes[1, 1], configs)
    else:
        _throughput_bars(axes[1, 1], groups)
    m, o, cfg = report["machine"], report["overall"], report["config"]
    mode = "greedy" if cfg["temperature"] == 0 else f"temperature {cfg['temperature']}"
    rounds = f", median of {cfg['repeat']} runs" if cfg.get("repeat", 1) > 1 else ""
    costs = f"c = {o['c']:.2f}" + (f", v({o['k']}) = {o['v']:.2f}" if o["v"] is not None else "")
    fig.suptitle(f"specpack bench: {Path(report['pack']['path']).name}, {o['n_prompts']} prompts, {mode}, "
                 f"<= {cfg['max_new_tokens']} new tokens{rounds}, best k = {report['best_k']}: "
                 f"{_x(o['speedup'])} measured, {_x(o['predicted_speedup'])} predicted\n"
                 f"{m['cpu']}, {m['usable_cores']} cores, threads {m['threads']}, onnxruntime {m['onnxruntime']}; "
                 f"{costs}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def configurations(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every configuration the run decoded, in order: each fixed k ("1", "2", ...), then adaptive k ("auto")."""
    configs = {k: report["by_k"][k] for k in sorted(report["by_k"], key=int)}
    if "auto" in report:
        configs["auto"] = report["auto"]
    return configs


def _speedup_bars(ax: Any, groups: dict[str, dict[str, Any]], k: int | str) -> None:
    names = list(groups)
    xs = range(len(names))
    measured = [groups[n]["speedup"] or 0.0 for n in names]
    predicted = [groups[n]["predicted_speedup"] or 0.0 for n in names]
    bars = ax.bar([x - 0.2 for x in xs], measured, 0.4, label="measured", color=MEASURED,
                  yerr=_whiskers([groups[n] for n in names]), capsize=3)
    pred = ax.bar([x + 0.2 for x in xs], predicted, 0.4, label="predicted  tau / (k c + v(k))", color=PREDICTED)
    ax.bar_label(bars, labels=[f"{v:.2f}" for v in measured], fontsize=8)
    ax.bar_label(pred, labels=[f"{v:.2f}" for v in predicted], fontsize=7, color="dimgray")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_ylim(0, 1.3 * max([*measured, *predicted, 1.0]))  # headroom for the labels and the legend
    _categories(ax, names)
    ax.set_ylabel("decode speedup over the target alone (x)")
    ax.set_title(f"speedup per category (k = {k})")
    ax.legend(fontsize=8)


def _alpha_bars(ax: Any, groups: dict[str, dict[str, Any]]) -> None:
    names = list(groups)
    alpha = [groups[n]["alpha"] or 0.0 for n in names]
    bars = ax.bar(range(len(names)), alpha, 0.6, color=MEASURED)
    ax.bar_label(bars, labels=[f"tau {groups[n]['tau']:.2f}" if groups[n]["tau"] else "" for n in names], fontsize=7)
    _categories(ax, names)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("alpha (accepted / proposed drafts)")
    ax.set_title("acceptance rate per category (tau above each bar)")


def _acceptance_lines(ax: Any, groups: dict[str, dict[str, Any]], k: int | str) -> None:
    for name, s in groups.items():
        points = [(i + 1, a) for i, a in enumerate(s["per_position"]) if a is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", label=name, linewidth=3 if name == "overall" else 1.2,
                    color="black" if name == "overall" else None, zorder=5 if name == "overall" else 2)
    ax.set_xticks(range(1, 1 + max((len(s["per_position"]) for s in groups.values()), default=1)))
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / proposed at this position")
    ax.set_ylim(0, 1.15)
    ax.set_title(f"acceptance by draft position (k = {k})")
    ax.legend(fontsize=7, ncol=3, loc="upper right")


def _configurations(ax: Any, configs: dict[str, dict[str, Any]]) -> None:
    """Speedup of every configuration run: categories thin, predicted (fixed k only) grey, overall thick on top."""
    names = list(configs)
    xs = list(range(len(names)))
    first = configs[names[0]]
    for cat in first["by_category"]:
        ax.plot(xs, [configs[n]["by_category"][cat]["speedup"] for n in names], linewidth=0.8, alpha=0.6,
                marker=".", label=cat, zorder=2)
    fixed = [(x, configs[n]["predicted_speedup"]) for x, n in zip(xs, names, strict=True)
             if configs[n]["predicted_speedup"] is not None]
    if fixed:
        ax.plot(*zip(*fixed, strict=True), marker="s", color=PREDICTED, linestyle="--", label="predicted", zorder=3)
    overall = [configs[n]["speedup"] for n in names]
    line = ax.errorbar(xs, overall, yerr=_whiskers(list(configs.values())), color="black", linewidth=2.5, marker="o",
                       capsize=4, label="overall (measured)", zorder=5)
    line[0].set_gid("overall")
    for x, y in zip(xs, overall, strict=True):
        if y is not None:
            ax.annotate(f"{y:.2f}x", (x, y), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"k = {n}" if n != "auto" else "adaptive k" for n in names])
    ax.set_ylabel("speedup over the target alone (x)")
    ax.set_title("every configuration run")
    ax.legend(fontsize=7, ncol=2)


def _whiskers(summaries: list[dict[str, Any]]) -> list[list[float]] | None:
    """--repeat: [below, above] the median speedup to the min and max over the rounds; None with one round."""
    reps = [s.get("repeats") for s in summaries]
    if not all(r and r["n"] > 1 and r["speedup"]["median"] is not None for r in reps):
        return None
    below = [r["speedup"]["median"] - r["speedup"]["min"] for r in reps if r]
    above = [r["speedup"]["max"] - r["speedup"]["median"] for r in reps if r]
    return [below, above]


def _throughput_bars(ax: Any, groups: dict[str, dict[str, Any]]) -> None:
    names = list(groups)
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [groups[n]["ar_tokens_per_s"] for n in names], 0.4, label="target alone", color=AR)
    ax.bar([x + 0.2 for x in xs], [groups[n]["tokens_per_s"] for n in names], 0.4, label="speculative", color=MEASURED)
    _categories(ax, names)
    ax.set_ylabel("decode tokens/s (after the first token)")
    ax.set_title("throughput per category")
    ax.legend(fontsize=8)


def _categories(ax: Any, names: list[str]) -> None:
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
