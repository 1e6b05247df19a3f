"""`specpack generate`: stream a completion and print what was accepted."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from specpack.bounded_read import read_bounded
from specpack.cli.errors import user_errors
from specpack.cli.loading import load_pack_visibly
from specpack.cli.options import drafter_option, k_option, ngram_config, ngram_options, tree_option
from specpack.cli.pack_cmds import PIN_HELP
from specpack.errors import SpecpackError
from specpack.limits import PROMPT_FILE_BYTES, parse_k, parse_tree
from specpack.runtime.request import GREEDY, MAX_NEW_TOKENS, GenerateRequest


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    """--prompt TEXT or --prompt-file F (read as is, minus one trailing newline, at most PROMPT_FILE_BYTES);
    exactly one."""
    if (prompt is None) == (prompt_file is None):
        raise SpecpackError("give the prompt once", expected="exactly one of --prompt TEXT or --prompt-file F",
                            found="both" if prompt is not None else "neither")
    if prompt_file is not None:
        data = read_bounded(prompt_file, PROMPT_FILE_BYTES, "--prompt-file")  # never /dev/zero until MemoryError
        try:
            text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as read_text: universal newlines
        except UnicodeDecodeError as err:
            raise SpecpackError(f"--prompt-file {prompt_file} is not UTF-8 text", expected="a UTF-8 text file",
                                found=f"byte 0x{err.object[err.start]:02x} at offset {err.start}",
                                hint="convert it, e.g. iconv -f latin1 -t utf-8") from None
        prompt = text[:-1] if text.endswith("\n") else text
    assert prompt is not None
    if not prompt:
        raise SpecpackError("empty prompt", expected="at least one character", found="an empty prompt")
    return prompt


def _print_piece(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@click.command("generate")
@click.argument("pack", type=click.Path(path_type=Path))
@click.option("--prompt", default=None, help="Prompt text.")
@click.option("--prompt-file", type=click.Path(path_type=Path), default=None, help="Read the prompt from a file.")
@click.option("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, show_default=True)
@k_option
@tree_option
@drafter_option
@ngram_options
@click.option("--chat", is_flag=True, help="Wrap the prompt as one user message in the model's chat template.")
@click.option("--temperature", type=float, default=GREEDY.temperature, show_default=True, help="0 is greedy.")
@click.option("--top-k", type=int, default=GREEDY.top_k, show_default=True, help="0 disables.")
@click.option("--top-p", type=float, default=GREEDY.top_p, show_default=True, help="1.0 disables.")
@click.option("--seed", type=int, default=None, help="Seed of the uniforms (sampling only).")
@click.option("--device", default="cpu", show_default=True, help="Backend: cpu, cuda, reference or tensorrt.")
@click.option("--threads", type=int, default=None,
              help="Intra-op threads per session (default: one per core, or per CPU the process's affinity allows).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object {tokens, text, finish_reason, stats} and nothing else.")
@click.option("--manifest-sha256", default=None, help=PIN_HELP)
@user_errors
def generate_command(pack: Path, prompt: str | None, prompt_file: Path | None, max_new_tokens: int, k_text: str,
                     tree_text: str, drafter: str | None, ngram_min: int, ngram_max: int, ngram_width: int, chat: bool,
                     temperature: float, top_k: int, top_p: float, seed: int | None, device: str, threads: int | None,
                     as_json: bool, manifest_sha256: str | None) -> None:
    """Generate a completion with speculative decoding."""
    request = GenerateRequest.of(read_prompt(prompt, prompt_file), max_new_tokens, k=parse_k(k_text), drafter=drafter,
                                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, chat=chat,
                                 tree=parse_tree(tree_text))
    # the request is checked before the pack loads; the pack's limits then
    ngram = ngram_config(ngram_min, ngram_max, ngram_width)
    loaded, load_s = load_pack_visibly(pack, quiet=as_json, device=device, threads=threads,
                                       manifest_sha256=manifest_sha256, ngram=ngram, drafter=drafter,
                                       drafts=request.k != 0)
    out = loaded.generate_request(request, on_text=None if as_json else _print_piece)
    if as_json:
        click.echo(json.dumps({"tokens": out.tokens, "text": out.text, "finish_reason": out.finish_reason,
                               "stats": {**out.stats, "load_s": load_s}}))
        return
    click.echo("\n\n" + summary_line(out.stats), err=True)


def summary_line(s: dict[str, Any]) -> str:
    """What was accepted, with which drafter and k, how fast: one line for stderr."""
    per_pos = " ".join("-" if a is None else f"{a:.2f}" for a in s["per_position"])
    ks = " ".join(f"{k}:{n}" for k, n in enumerate(s["k_histogram"]) if n)
    what = "nodes" if s.get("tree") else "k"
    k = f"{what}=auto (up to {s['k']}; steps by {what} {ks})" if s["k_policy"] == "auto" else f"{what}={s['k']}"
    k = f"token trees, {k}" if s.get("tree") else k
    return (f"[specpack] {s['new_tokens']} tokens, {s['drafter']} drafter, {k}: alpha {s['alpha']:.3f}, "
            f"tau {s['tau']:.2f} ({s['accepted']}/{s['proposed']} drafts accepted in {s['steps']} steps; by position: "
            f"{per_pos}); {s['tokens_per_s']:.1f} tok/s decoding, first token {s['ttft_s'] * 1000:.0f} ms")
