"""`specpack bench`: speculative vs autoregressive decoding of a pack on prompt sets, measured in one run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from specpack.bench.runner import BenchConfig, check_ks
from specpack.cli.errors import user_errors
from specpack.cli.options import drafter_option, tree_option
from specpack.cli.output_paths import OutputPath, check_output_file
from specpack.errors import SpecpackError
from specpack.limits import K_AUTO, K_MAX, check_tree, parse_k, parse_tree
from specpack.prompts import FORMATS_HELP

DEFAULTS = BenchConfig()
PLOT_SUFFIXES = (".png", ".svg", ".pdf")  # what the plot is saved as (matplotlib picks the format by the suffix)


def parse_ks(text: str | None) -> tuple[int | None, ...] | None:
    """--k "1,2,4,auto" -> (1, 2, 4, None): each part as `generate --k` reads it (parse_k; None: adaptive k).
    No --k: None, the pack's k_max and adaptive k (BenchConfig)."""
    if text is None:
        return None
    try:
        return tuple(parse_k(part) for part in text.split(",") if part.strip())
    except SpecpackError:
        raise SpecpackError("invalid --k", expected=f"comma-separated integers and {K_AUTO!r}, e.g. 1,2,4,{K_AUTO}",
                            found=text) from None


@click.command("bench", epilog=FORMATS_HELP)
@click.argument("pack", type=click.Path(path_type=Path))
@click.option("--prompts", "prompt_files", multiple=True, required=True, type=click.Path(path_type=Path),
              metavar="FILE|SET",
              help="Prompt file: JSON Lines (.gz too) of {question_id, category, turns} (Spec-Bench, MT-bench), "
                   "{task_id, prompt} (HumanEval) or {question, answer} (GSM8K), or text, one prompt a line; or the "
                   "name of a standard set fetched with `specpack fetch --prompts SET` (humaneval, mt-bench, gsm8k, "
                   "spec-bench); repeat for several. Formats, shipped files and the standard sets: docs/prompts.md.")
@click.option("--k", "ks", default=None,
              help="Drafts per step, one or a sweep: 4, 1,2,4,8 or 2,4,auto (auto: adaptive k, reported in its own row "
                   "with the ks it chose). Default: the pack's k_max and auto.")
@click.option("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens, show_default=True)
@click.option("--limit", type=int, default=None, help="Take the first N prompts of each category of each file.")
@click.option("--temperature", type=float, default=DEFAULTS.temperature, show_default=True, help="0 is greedy.")
@click.option("--seed", type=int, default=DEFAULTS.seed, show_default=True, help="Seed of the uniforms when sampling.")
@click.option("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (and torch's for --peer).")
@click.option("--device", default=DEFAULTS.device, show_default=True, help="Backend: cpu, cuda or reference.")
@click.option("--timing-reps", type=int, default=DEFAULTS.timing_reps, show_default=True,
              help="Repetitions of each timed step for c and v(k).")
@click.option("--repeat", type=int, default=DEFAULTS.repeat, show_default=True,
              help="Decode every prompt N times at each k (k = 0 too), in rounds; tok/s and speedups are the median "
                   "over the rounds, with their min-max in the tables, the JSON (`repeats`) and the plot's whiskers.")
@click.option("--json", "json_out", type=OutputPath(), default=None, help="Write the report as JSON.")
@click.option("--plot", "plot_out", type=OutputPath(), default=None,
              help="Write a summary plot (.png, .svg or .pdf): every configuration run, adaptive k included.")
@click.option("--overwrite", is_flag=True, help="Replace existing --json / --plot files.")
@tree_option
@drafter_option
@click.option("--peer", type=click.Choice(["hf", "llamacpp"]), default=None,
              help="Also run transformers' generate and assisted generation (hf), or llama.cpp's autoregressive and "
                   "speculative tools on the pack's GGUF sources (llamacpp); each in its own processes.")
@click.option("--llamacpp-dir", type=click.Path(path_type=Path), default=None,
              help="Directory of llama.cpp's tools (llama-completion, llama-speculative-simple, llama-speculative); "
                   "default: $SPECPACK_LLAMACPP.")
@user_errors
def bench_command(pack: Path, prompt_files: tuple[Path, ...], ks: str | None, max_new_tokens: int, limit: int | None,
                  temperature: float, seed: int, threads: int | None, device: str, timing_reps: int,
                  json_out: Path | None, plot_out: Path | None, tree_text: str, drafter: str | None, peer: str | None,
                  llamacpp_dir: Path | None, overwrite: bool, repeat: int) -> None:
    """Benchmark speculative decoding against the target alone, on the same pack, prompts and run."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from specpack.bench.prompt_sets import resolve_prompt_file
    from specpack.bench.report import build_report, machine_info, print_report
    from specpack.bench.runner import add_hf_extras, add_llamacpp_peer, run_bench
    from specpack.prompts import read_prompts

    if max_new_tokens < 2:
        raise SpecpackError("invalid --max-new-tokens", expected="an integer >= 2 (decoding starts after the first)",
                            found=str(max_new_tokens))
    if repeat < 1:
        raise SpecpackError("invalid --repeat", expected="an integer >= 1", found=str(repeat))
    if timing_reps < 1:
        raise SpecpackError("invalid --timing-reps", expected="an integer >= 1", found=str(timing_reps))
    _check_outputs(json_out, plot_out, overwrite)  # before the run: its results are never lost to a bad path
    tree = check_tree(parse_tree(tree_text))
    check_ks(parse_ks(ks), K_MAX, isinstance(tree, int))  # the sweep against a fixed tree, before the pack loads
    config = BenchConfig(ks=parse_ks(ks), max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                         threads=threads, device=device, timing_reps=timing_reps, peer=peer,
                         drafter=drafter, tree=tree, repeat=repeat)
    prompt_files = tuple(resolve_prompt_file(p) for p in prompt_files)  # a set's name: its fetched file
    prompts = read_prompts(prompt_files, limit)
    if peer == "llamacpp":  # refuse before the run, not after it
        from specpack.bench.peer_llamacpp import find_tools

        find_tools(llamacpp_dir)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True)) as progress:
        run = run_bench(pack, prompts, config, progress)
    add_hf_extras(run)  # child processes, after the progress bar
    if peer == "llamacpp":
        add_llamacpp_peer(run, llamacpp_dir)
    report = build_report(run, machine_info(threads))
    report["config"]["prompt_files"] = [str(p) for p in prompt_files]
    report["config"]["limit"] = limit
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report, indent=2) + "\n")
    # piped (a log, not a terminal): no width to fit, so no row is folded; in a terminal, wide cells fold (never cut)
    print_report(report, Console(width=None if sys.stdout.isatty() else 10_000))
    if plot_out is not None:
        from specpack.bench.plot import plot_report

        plot_report(report, plot_out)


def _check_outputs(json_out: Path | None, plot_out: Path | None, overwrite: bool) -> None:
    """--json and --plot can be written (and --plot drawn), checked before the benchmark runs."""
    if json_out is not None:
        check_output_file(json_out, "--json", overwrite=overwrite)
    if plot_out is not None:
        check_output_file(plot_out, "--plot", overwrite=overwrite, suffixes=PLOT_SUFFIXES)
        from specpack.bench.plot import require_matplotlib

        require_matplotlib()
