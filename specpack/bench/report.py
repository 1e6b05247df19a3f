"""From measured runs to the bench's numbers (docs/vocabulary.md), its JSON and its tables.

Pooled over a group of prompts (a category, or all):
    alpha            accepted / proposed drafts               tau  (accepted + steps) / steps
    tokens_per_s     sum of decoded tokens / sum of decode seconds, decoded = new tokens after the first
    speedup          tokens_per_s / ar_tokens_per_s: a ratio of pooled throughputs over the same prompts
    speedup_median   the median over prompts of each prompt's own ratio (robust to one slow moment)
    predicted        tau / (k*c + v(k));  efficiency = speedup / predicted
best_k is the fixed k with the highest speedup; `overall` and `by_category` are at best_k, `by_k` holds every fixed
k. Adaptive k (`--k ...,auto`) is `auto`: the same numbers (no predicted speedup: its k changes per step), with
k_histogram (verify steps by k, pooled) and k_asked_histogram; with no fixed k in the sweep, `overall` is it and
best_k is "auto".
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from specpack.bench.runner import BenchRun, Decode, PromptRun, first_divergence
from specpack.bench.timing import StepCosts
from specpack.limits import K_AUTO

if TYPE_CHECKING:
    from rich.console import Console

DEFINITIONS = {
    "alpha": "accepted / proposed draft tokens (proposed: only drafts that were verified), pooled over prompts",
    "tau": "tokens emitted per verify step (accepted + 1), pooled over prompts",
    "tokens_per_s": "decoded tokens (after the first) / decode seconds, pooled: sums over prompts, then the ratio",
    "speedup": "tokens_per_s / ar_tokens_per_s, same pack, backend, prompts and run",
    "speedup_median": "median over prompts of the per-prompt speedup (with --repeat: each prompt's median over rounds)",
    "repeats": "--repeat N: every prompt decoded N times at each k (k = 0 too), in rounds; tokens_per_s, "
               "ar_tokens_per_s and speedup are the median over the rounds of the pooled value of each round "
               "(speedup: paired within a round), with min, max and the values; alpha, tau and identity are the "
               "first round's (the same seed gives the same tokens)",
    "predicted_speedup": "tau / (k*c + v(k)), c and v(k) timed on the engines (costs); none for adaptive k",
    "efficiency": "speedup / predicted_speedup",
    "identical_fraction": "prompts whose greedy output equals the target-alone output, over all prompts",
    "divergences.gap": "top-1 minus top-2 target logit (transformers, the source model) after the common prefix",
    "k_histogram": "adaptive k: verify steps at each k (index = k), pooled over prompts; k_asked_histogram: as the "
                   "policy asked, before the cap at the tokens still allowed",
}
CAPTION = ("tok/s: decoding after the first token; speedup: spec / AR tok/s; pred.: tau / (k c + v(k)); "
           "eff.: speedup / pred.; ident.: greedy output equal to the target alone's; with --repeat: the median "
           "over the rounds (min-max)")


def build_report(run: BenchRun, machine: dict[str, Any]) -> dict[str, Any]:
    """The bench's JSON document."""
    greedy = run.config.greedy
    by_k: dict[str, dict[str, Any]] = {}
    for k in run.ks:
        summary = summarize(run.runs, k, run.costs, greedy, run.gaps)
        summary["by_category"] = {cat: summarize(group, k, run.costs, greedy, run.gaps)
                                  for cat, group in by_category(run.runs).items()}
        by_k[str(k)] = summary
    auto = None
    if run.auto:
        auto = summarize(run.runs, K_AUTO, run.costs, greedy, run.gaps)
        auto["by_category"] = {cat: summarize(group, K_AUTO, run.costs, greedy, run.gaps)
                               for cat, group in by_category(run.runs).items()}
    best: int | str = best_k(by_k) if by_k else K_AUTO
    chosen = by_k[str(best)] if by_k else auto
    assert chosen is not None  # check_ks: a sweep has a fixed k or auto
    overall = {key: value for key, value in chosen.items() if key != "by_category"}
    report = {
        "overall": overall, "by_category": chosen["by_category"], "by_k": by_k, "best_k": best,
        "costs": run.costs.to_dict(), "machine": machine, "peak_memory": run.peak_memory,
        "peers": {name: PEER_SUMMARIES[name](run, raw, chosen) for name, raw in run.peers.items()},
        "config": {"ks": list(run.ks), "max_new_tokens": run.config.max_new_tokens,
                   "temperature": run.config.temperature, "seed": run.config.seed, "threads": run.config.threads,
                   "timing_reps": run.config.timing_reps, "n_prompts": len(run.runs), "repeat": run.config.repeat},
        "pack": run.pack, "prompts": [_prompt_row(r) for r in run.runs], "skipped": run.skipped,
        "notes": run.notes, "definitions": DEFINITIONS,
    }
    if auto is not None:  # only then: a fixed-k report keeps its keys
        report["auto"] = auto
        report["config"]["auto"] = True
    return report


def by_category(runs: Sequence[PromptRun]) -> dict[str, list[PromptRun]]:
    groups: dict[str, list[PromptRun]] = {}
    for r in runs:
        groups.setdefault(r.prompt.category, []).append(r)
    return groups


def best_k(by_k: dict[str, dict[str, Any]]) -> int:
    """The k with the highest measured speedup (the smaller k on a tie)."""
    return max(sorted(int(k) for k in by_k), key=lambda k: (by_k[str(k)]["speedup"] or 0.0, -k))


def summarize(runs: Sequence[PromptRun], k: int | str, costs: StepCosts, greedy: bool,
              gaps: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """The numbers of one k of the sweep over `runs`: a fixed k, or K_AUTO (adaptive k, with its k histograms)."""
    spec = [r.spec[k] for r in runs]  # the first decodes: alpha, tau, identity
    steps, proposed, accepted = (sum(d.stats[key] for d in spec) for key in ("steps", "proposed", "accepted"))
    tau = (accepted + steps) / steps if steps else None
    rounds = min(len(r.decodes(k)) for r in runs)  # --repeat
    tps_r = [pooled_tokens_per_s([r.decodes(k)[i] for r in runs]) for i in range(rounds)]
    ar_tps_r = [pooled_tokens_per_s([r.decodes(0)[i] for r in runs]) for i in range(rounds)]
    speedup_r = [t / a for t, a in zip(tps_r, ar_tps_r, strict=True) if a]  # paired: the same round of both
    speedup = statistics.median(speedup_r) if speedup_r else None
    fixed = isinstance(k, int)
    predicted = costs.predicted_speedup(tau, k) if tau is not None and isinstance(k, int) else None
    depth = k if isinstance(k, int) else max((len(d.stats["per_position"]) for d in spec), default=0)
    ratios = [r for run in runs if (r := _prompt_speedup(run, k)) is not None]
    every_spec = [d for r in runs for d in r.decodes(k)]
    every_ar = [d for r in runs for d in r.decodes(0)]
    return {
        "n_prompts": len(runs), "k": k,
        "alpha": accepted / proposed if proposed else None, "tau": tau, "per_position": per_position(spec, depth),
        "tokens_per_s": statistics.median(tps_r), "ar_tokens_per_s": statistics.median(ar_tps_r), "speedup": speedup,
        "speedup_median": statistics.median(ratios) if ratios else None,
        "repeats": {"n": rounds, "tokens_per_s": spread(tps_r), "ar_tokens_per_s": spread(ar_tps_r),
                    "speedup": spread(speedup_r)},
        "predicted_speedup": predicted,
        "efficiency": speedup / predicted if speedup is not None and predicted else None,
        "c": costs.c, "v": costs.v(k) if isinstance(k, int) else None,
        "ttft_s": _median(d.stats["ttft_s"] for d in every_spec), "ar_ttft_s": _median(d.stats["ttft_s"] for d in every_ar),
        "identical_fraction": sum(r.ar.tokens == r.spec[k].tokens for r in runs) / len(runs) if greedy else None,
        "divergences": divergences(runs, k, gaps) if greedy else [],
        **({} if fixed else {name: pooled_histogram(spec, name) for name in ("k_histogram", "k_asked_histogram")}),
    }


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min and max of one number over the --repeat rounds, and the values themselves (in round order)."""
    return {"median": statistics.median(values) if values else None, "min": min(values, default=None),
            "max": max(values, default=None), "values": list(values)}


def _prompt_speedup(run: PromptRun, k: int | str) -> float | None:
    """One prompt's speedup at k: the median over the rounds of spec / AR tokens/s, each pair from one round."""
    pairs = zip(run.decodes(k), run.decodes(0), strict=True)
    ratios = [s.stats["tokens_per_s"] / a.stats["tokens_per_s"] for s, a in pairs
              if s.stats["tokens_per_s"] > 0 and a.stats["tokens_per_s"] > 0]
    return statistics.median(ratios) if ratios else None


def pooled_histogram(decodes: Sequence[Decode], name: str) -> list[int]:
    """Per-k counts (index = k) summed over decodes."""
    rows = [d.stats.get(name) or [] for d in decodes]
    return [sum(row[i] for row in rows if i < len(row)) for i in range(max(map(len, rows), default=0))]


def pooled_tokens_per_s(decodes: Sequence[Decode]) -> float:
    """Sum of tokens after the first / sum of the seconds after the first token."""
    tokens = sum(max(d.stats["new_tokens"] - 1, 0) for d in decodes)
    seconds = sum(d.stats["decode_s"] for d in decodes)
    return tokens / seconds if seconds > 0 else 0.0


def per_position(spec: Sequence[Decode], k: int) -> list[float | None]:
    """Acceptance at draft position 1..k, pooled: exact counts when the stats carry them, else the
    per-prompt ratios weighted by steps (off only by the few steps capped at the end of a prompt)."""
    if all("proposed_at" in d.stats and "accepted_at" in d.stats for d in spec):
        prop = [sum(d.stats["proposed_at"][i] for d in spec) for i in range(k)]
        acc = [sum(d.stats["accepted_at"][i] for d in spec) for i in range(k)]
        return [a / p if p else None for a, p in zip(acc, prop, strict=True)]
    out: list[float | None] = []
    for i in range(k):
        pairs = [(d.stats["per_position"][i], d.stats["steps"]) for d in spec
                 if i < len(d.stats["per_position"]) and d.stats["per_position"][i] is not None]
        weight = sum(w for _, w in pairs)
        out.append(sum(r * w for r, w in pairs) / weight if weight else None)
    return out


def divergences(runs: Sequence[PromptRun], k: int | str, gaps: dict[tuple[str, int], dict[str, Any]]) -> list[dict[str, Any]]:
    """Where each speculative output first left the target-alone output, with the target's top-2 gap there."""
    found = []
    for r in runs:
        ar, spec = r.ar.tokens, r.spec[k].tokens
        pos = first_divergence(ar, spec)
        if pos is not None:
            gap = gaps.get((r.prompt.id, pos), {})
            found.append({"prompt": r.prompt.id, "position": pos, "gap": gap.get("gap"),
                          "ar_token": ar[pos] if pos < len(ar) else None,
                          "spec_token": spec[pos] if pos < len(spec) else None,
                          "top2_tokens": gap.get("top2_tokens")})
    return found


def peer_summary(run: BenchRun, raw: dict[str, Any], best: dict[str, Any]) -> dict[str, Any]:
    """transformers' numbers beside ours (`best`: our summary at best_k, with its by_category), pooled like ours."""
    ours = {r.prompt.id: r for r in run.runs}

    def rates(records: list[dict[str, Any]], mine: dict[str, Any]) -> dict[str, Any]:
        ar, assisted = _peer_rate(records, "ar"), _peer_rate(records, "assisted")
        same = [rec for rec in records if rec["same_input_ids"]]
        return {"n_prompts": len(records), "ar_tokens_per_s": ar, "assisted_tokens_per_s": assisted,
                "assisted_speedup": assisted / ar if ar else None,
                "ours_over_assisted": mine["tokens_per_s"] / assisted if assisted else None,
                "ours_ar_over_hf_ar": mine["ar_tokens_per_s"] / ar if ar else None,
                "identical_fraction": _fraction(rec["assisted"]["tokens"] == rec["ar"]["tokens"] for rec in records),
                "same_input_ids_fraction": _fraction(rec["same_input_ids"] for rec in records),
                "ar_equals_ours_fraction": _fraction(rec["ar"]["tokens"] == ours[rec["id"]].ar.tokens for rec in same)}

    records = raw["prompts"]
    summary = rates(records, best)
    groups: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault(rec["category"], []).append(rec)
    summary["by_category"] = {cat: rates(recs, best["by_category"][cat]) for cat, recs in groups.items()}
    summary.update({key: raw[key] for key in ("dtype", "threads", "transformers", "torch", "assistant", "timing",
                                              "peak_rss_mb")})
    summary["prompts"] = [{"id": rec["id"], **{mode: {key: rec[mode][key] for key in
                                                      ("new_tokens", "decoded_tokens", "ttft_s", "decode_s")}
                                               for mode in ("ar", "assisted")}} for rec in records]
    return summary


def _llamacpp_summary(run: BenchRun, raw: dict[str, Any], best: dict[str, Any]) -> dict[str, Any]:
    from specpack.bench.peer_llamacpp import llamacpp_summary

    return llamacpp_summary(run, raw, best)


PEER_SUMMARIES = {"hf": peer_summary, "llamacpp": _llamacpp_summary}


def _peer_rate(records: list[dict[str, Any]], mode: str) -> float:
    tokens = sum(rec[mode]["decoded_tokens"] for rec in records)
    seconds = sum(rec[mode]["decode_s"] for rec in records)
    return tokens / seconds if seconds > 0 else 0.0


def _fraction(flags: Any) -> float | None:
    values = list(flags)
    return sum(values) / len(values) if values else None


def _median(values: Any) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def _prompt_row(r: PromptRun) -> dict[str, Any]:
    def row(d: Decode) -> dict[str, Any]:
        keys = ("new_tokens", "tokens_per_s", "ttft_s", "decode_s", "alpha", "tau", "steps", "per_position")
        return {key: d.stats[key] for key in keys if key in d.stats}

    out = {"id": r.prompt.id, "category": r.prompt.category, "chat": r.prompt.chat, "prompt_tokens": len(r.ids),
           "ar": row(r.ar),
           "spec": {str(k): {**row(d), "identical": d.tokens == r.ar.tokens} for k, d in r.spec.items()}}
    if r.again:  # --repeat: every round's tokens/s, by k (0: the target alone)
        out["repeat_tokens_per_s"] = {str(k): [d.stats["tokens_per_s"] for d in r.decodes(k)] for k in (0, *r.spec)}
    return out


def machine_info(threads: int | None) -> dict[str, Any]:
    """Where the numbers were measured."""
    import numpy
    import onnxruntime

    try:
        import psutil

        physical, ram = psutil.cpu_count(logical=False), psutil.virtual_memory().total / 2**30
    except ImportError:
        physical, ram = None, None
    return {"cpu": cpu_model(), "physical_cores": physical, "logical_cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "ram_gb": ram, "os": platform.platform(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__,
            "threads": threads if threads else "onnxruntime default (one per physical core)"}


def cpu_model() -> str:
    """The CPU as /proc/cpuinfo names it, with its family, model and the vector extensions the int4 / int8 kernels
    pick by (a VM's "Intel(R) Xeon(R) Processor" alone does not tell an AMX Sapphire Rapids from an older part)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model", "flags") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip() and fields:  # the first processor's block is enough
                    break
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    simd = [f for f in ("avx2", "avx_vnni", "avx512f", "avx512_vnni", "amx_tile") if f in flags]
    where = f"family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields and "model" in fields else ""
    details = ", ".join(part for part in (where, " ".join(simd)) if part)
    return f"{name} ({details})" if details else name


# --- tables ---------------------------------------------------------------------------------------------------

def print_report(report: dict[str, Any], console: Console) -> None:
    """The tables a person reads after a run: per category, the k sweep, costs, divergences, peers, memory."""
    from rich.table import Table

    o, best, cfg = report["overall"], report["best_k"], report["config"]
    sweep_note = f" (best of {','.join(map(str, cfg['ks']))})" if len(cfg["ks"]) > 1 else ""
    mode = "greedy" if cfg["temperature"] == 0 else f"temperature {cfg['temperature']}"
    rounds = f", each decoded {cfg['repeat']} times at each k" if cfg.get("repeat", 1) > 1 else ""
    console.print(f"\n[bold]specpack bench[/bold] {report['pack']['path']}: {o['n_prompts']} prompts, "
                  f"k={best}{sweep_note}, {mode}, up to {cfg['max_new_tokens']} new tokens{rounds}")
    table = Table("category", "n", "alpha", "tau", "AR tok/s", "spec tok/s", "speedup", "pred.", "eff.", "ident.",
                  title=f"by category, k={best}", caption=CAPTION)
    for name, s in [*report["by_category"].items(), ("overall", o)]:
        table.add_row(name, str(s["n_prompts"]), _f(s["alpha"], ".3f"), _f(s["tau"], ".2f"),
                      *_rates(s), _f(s["predicted_speedup"], ".2f", "x"), _f(s["efficiency"], ".0%"),
                      _f(s["identical_fraction"], ".0%"), style="bold" if name == "overall" else None)
    console.print(_fold(table))
    if len(report["by_k"]) > 1:
        sweep = Table("k", "alpha", "tau", "spec tok/s", "speedup", "pred.", "eff.", "v(k)", "ident.",
                      title="k sweep, all prompts", caption=CAPTION)
        for k, s in report["by_k"].items():
            sweep.add_row(k, _f(s["alpha"], ".3f"), _f(s["tau"], ".2f"), *_rates(s)[1:], _f(s["predicted_speedup"], ".2f", "x"),
                          _f(s["efficiency"], ".0%"), _f(s["v"], ".2f"), _f(s["identical_fraction"], ".0%"),
                          style="bold" if int(k) == best else None)
        console.print(_fold(sweep))
    if "auto" in report:
        _print_auto(report["auto"], console)
    c = report["costs"]
    console.print(f"costs at {c['context_tokens']} tokens of context: target step {c['target_step_ms']:.1f} ms, "
                  f"draft step {c['draft_step_ms']:.1f} ms, c = {c['c']:.3f}, "
                  + ", ".join(f"v({k}) = {v:.2f}" for k, v in c["v"].items())
                  + f"; prefill: target {c['target_prefill_ms']:.1f} ms, draft {c['draft_prefill_ms']:.1f} ms")
    console.print(f"time to first token (median): AR {_f(o['ar_ttft_s'], '.3f')} s, spec {_f(o['ttft_s'], '.3f')} s; "
                  f"median per-prompt speedup {_f(o['speedup_median'], '.2f', 'x')}")
    for d in o["divergences"][:10]:
        console.print(f"  divergence: {d['prompt']} at new token {d['position']}: {d['ar_token']} (target alone) vs "
                      f"{d['spec_token']}, top-2 logit gap {_f(d['gap'], '.2e')}")
    if len(o["divergences"]) > 10:
        console.print(f"  ... {len(o['divergences']) - 10} more divergences in the JSON")
    _print_quantization(report["pack"], console)
    for name, p in report["peers"].items():
        if name == "llamacpp":
            _print_llamacpp(p, console)
            continue
        console.print(f"peer {name} ({p['dtype']}, {p['threads']} threads): AR {_f(p['ar_tokens_per_s'], '.1f')} tok/s, "
                      f"assisted {_f(p['assisted_tokens_per_s'], '.1f')} tok/s ({_f(p['assisted_speedup'], '.2f', 'x')}, "
                      f"identical to its AR {_f(p['identical_fraction'], '.0%')}); ours over assisted "
                      f"{_f(p['ours_over_assisted'], '.2f', 'x')}, our AR over its AR {_f(p['ours_ar_over_hf_ar'], '.2f', 'x')}")
    m = report["peak_memory"]
    console.print("peak RSS: " + ", ".join(f"{phase} {mb / 1024:.2f} GB" for phase, mb in m["peak_rss_mb"].items())
                  + "".join(f"; peer {n} {p['peak_rss_mb'] / 1024:.2f} GB (own process)" for n, p in report["peers"].items()
                            if "peak_rss_mb" in p))
    from rich.markup import escape

    for note in report["notes"]:  # notes may quote paths and file names from the manifest: no markup from them
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    if report["skipped"]:
        console.print(f"[yellow]skipped {len(report['skipped'])} prompts too long for the pack[/yellow]")


def _print_auto(a: dict[str, Any], console: Console) -> None:
    """Adaptive k, by category: the same numbers as for a fixed k, and the ks it chose (verify steps by k)."""
    from rich.table import Table

    table = Table("category", "n", "alpha", "tau", "AR tok/s", "spec tok/s", "speedup", "ident.", "steps by k",
                  title="adaptive k (auto)", caption="steps by k: verify steps at each k the policy chose (k:steps)")
    for name, s in [*a["by_category"].items(), ("overall", a)]:
        table.add_row(name, str(s["n_prompts"]), _f(s["alpha"], ".3f"), _f(s["tau"], ".2f"), *_rates(s),
                      _f(s["identical_fraction"], ".0%"), k_histogram_text(s["k_histogram"]),
                      style="bold" if name == "overall" else None)
    console.print(_fold(table))


def _fold(table: Any) -> Any:
    """Cells too wide for the console go on over more lines, never end in an ellipsis (the --repeat ranges)."""
    for column in table.columns:
        column.overflow = "fold"
    return table


def k_histogram_text(histogram: Sequence[int]) -> str:
    """[3, 0, 5] -> "0:3 2:5" (the ks used, with their step counts)."""
    return " ".join(f"{k}:{n}" for k, n in enumerate(histogram) if n) or "-"


def _print_quantization(pack: dict[str, Any], console: Console) -> None:
    """Each quantized model's method and fidelity, as the manifest records them."""
    for role in ("draft", "target"):
        q = pack.get(f"{role}_quantization")
        if not q:
            continue
        fid = q.get("fidelity") or {}
        line = f"{role} quantization: {q['method']} (" + ", ".join(f"{n} {path}" for path, n in q["summary"].items()) + ")"
        if role == "target" and fid.get("top1_agreement") is not None:
            line += (f"; vs the unquantized target: top-1 agreement {fid['top1_agreement']:.4f}, mean KL "
                     f"{fid['mean_kl']:.2e} (a different model: lossless w.r.t. the quantized target)")
        for k, row in (fid.get("by_k") or {}).items():
            ref, quant = row["reference"]["alpha"], row["quantized"]["alpha"]
            if ref is not None and quant is not None:
                line += f"; k={k}: alpha {quant:.3f} vs {ref:.3f} unquantized (greedy replay)"
        console.print(line)


def _print_llamacpp(p: dict[str, Any], console: Console) -> None:
    o = p["ours"]
    console.print(f"peer llamacpp ({p['threads']} threads, draft up to {p['k']}), decode tok/s medians: "
                  f"autoregressive {_f(p['ar']['tokens_per_s_median'], '.1f')}, speculative-simple "
                  f"{_f(p['speculative_simple']['tokens_per_s_median'], '.1f')}, speculative "
                  f"{_f(p['speculative']['tokens_per_s_median'], '.1f')}; ours: speculative "
                  f"{_f(o['spec_tokens_per_s_median'], '.1f')}, autoregressive {_f(o['ar_tokens_per_s_median'], '.1f')}")
    console.print(f"  ours speculative over llama.cpp: {_f(p['ar']['ours_spec_over_this'], '.2f', 'x')} its autoregressive, "
                  f"{_f(p['speculative_simple']['ours_spec_over_this'], '.2f', 'x')} speculative-simple, "
                  f"{_f(p['speculative']['ours_spec_over_this'], '.2f', 'x')} speculative; its peak RSS "
                  + ", ".join(f"{m} {p[m]['peak_rss_mb'] / 1024:.2f} GB" for m in ("ar", "speculative_simple", "speculative")))


def _rates(s: dict[str, Any]) -> tuple[str, str, str]:
    """AR tok/s, spec tok/s and speedup cells: the value, and with --repeat the median and the range over rounds."""
    rep = s.get("repeats") or {"n": 1}
    cells = []
    for key, fmt, suffix in (("ar_tokens_per_s", ".1f", ""), ("tokens_per_s", ".1f", ""), ("speedup", ".2f", "x")):
        cell = _f(s[key], fmt, suffix)
        if rep["n"] > 1 and rep[key]["min"] is not None:
            cell += f"\n({rep[key]['min']:{fmt}}-{rep[key]['max']:{fmt}})"
        cells.append(cell)
    return cells[0], cells[1], cells[2]


def _f(value: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"
