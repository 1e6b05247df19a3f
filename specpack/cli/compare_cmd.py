"""`specpack compare`: one prompt decoded by the target alone (k 0) and by speculative decoding, from one load of
the pack, side by side: decode tokens/s, the speedup, time to first token, alpha and tau, and whether the texts match.

`make demo` ends with it, so the speedup is seen beside its baseline (same pack, prompt, machine and run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from specpack.cli.errors import user_errors
from specpack.cli.generate_cmd import _print_piece, read_prompt
from specpack.cli.loading import load_pack_visibly
from specpack.cli.options import drafter_option, k_option
from specpack.limits import parse_k
from specpack.runtime.request import GenerateRequest


@click.command("compare")
@click.argument("pack", type=click.Path(path_type=Path))
@click.option("--prompt", default=None, help="Prompt text.")
@click.option("--prompt-file", type=click.Path(path_type=Path), default=None, help="Read the prompt from a file.")
@click.option("--max-new-tokens", type=int, default=96, show_default=True)
@k_option
@drafter_option
@click.option("--chat", is_flag=True, help="Wrap the prompt as one user message in the model's chat template.")
@click.option("--threads", type=int, default=None, help="Intra-op threads per session (default: one per core).")
@user_errors
def compare_command(pack: Path, prompt: str | None, prompt_file: Path | None, max_new_tokens: int, k_text: str,
                    drafter: str | None, chat: bool, threads: int | None) -> None:
    """Decode one prompt with the target alone (k 0), then speculatively, from one load of PACK; print both rates.

    Greedy: both give the same text (the speculative output is the target's own). One prompt is one sample: for
    numbers to report, use `specpack bench` (several prompts, medians)."""
    text = read_prompt(prompt, prompt_file)
    # both requests checked before the load: a bad option fails at once
    baseline = GenerateRequest.of(text, max_new_tokens, k=0, chat=chat)
    speculative = GenerateRequest.of(text, max_new_tokens, k=parse_k(k_text), drafter=drafter, chat=chat)
    loaded, _ = load_pack_visibly(pack, threads=threads, drafter=drafter, drafts=speculative.k != 0)
    with loaded:
        click.echo(f"[specpack] 1/2 the target alone (k 0), the baseline: {max_new_tokens} tokens at most ...", err=True)
        alone = loaded.generate_request(baseline)
        click.echo(f"[specpack] 2/2 speculative decoding (k {k_text}), streamed:", err=True)
        spec = loaded.generate_request(speculative, on_text=_print_piece)
    click.echo("", err=False)
    click.echo(comparison(alone.stats, spec.stats, identical=alone.tokens == spec.tokens), err=True)


def comparison(alone: dict[str, Any], spec: dict[str, Any], *, identical: bool) -> str:
    """The two runs side by side (stderr), with the speedup in decode tokens/s."""
    ratio = spec["tokens_per_s"] / alone["tokens_per_s"] if alone["tokens_per_s"] else 0.0
    k = f"auto (up to {spec['k']})" if spec["k_policy"] == "auto" else str(spec["k"])
    rows = [
        ("", "target alone", "speculative"),
        ("decode tokens/s", f"{alone['tokens_per_s']:.1f}", f"{spec['tokens_per_s']:.1f}  ({ratio:.2f}x)"),
        ("first token", f"{alone['ttft_s'] * 1000:.0f} ms", f"{spec['ttft_s'] * 1000:.0f} ms"),
        ("new tokens", str(alone["new_tokens"]), str(spec["new_tokens"])),
        ("drafter, k", "-, 0", f"{spec['drafter']}, {k}"),
        ("alpha / tau", "-", f"{spec['alpha']:.2f} / {spec['tau']:.2f}"),
    ]
    lines = [f"  {a:<16} {b:>14}   {c}" for a, b, c in rows]
    lines.append("  same tokens as the target alone: " + ("yes" if identical else "no (sampling, or a numerical near-tie)"))
    lines.append("  (the draft opened with the pack; its prefill is in the speculative decode's time; one prompt is "
                 "one sample: `specpack bench` gives medians)")
    return "\n".join(lines)
