"""`specpack distill`: train a draft head for a target by self-distillation (docs/heads.md)."""

from __future__ import annotations

from pathlib import Path

import click

from specpack.cli.errors import user_errors
from specpack.cli.output_paths import OutputPath
from specpack.distill.config import CUDA_RECIPE, DEVICES, DistillConfig

DEFAULTS = DistillConfig()


def _defaults(attr: str) -> str:
    """The help's default: the CPU's and the GPU's recipe (DistillConfig.for_device)."""
    return f" [default: {getattr(DEFAULTS, attr):,} on the CPU, {CUDA_RECIPE[attr]:,} with --device cuda]"


@click.command("distill")
@click.option("--target", "target", required=True, help="Target model: HF model directory, hub id or .gguf file.")
@click.option("-o", "--output", "output", required=True, type=OutputPath(),
              help="Head directory to write (head.safetensors, head.json); a run resumes from its ckpt/.")
@click.option("--steps", type=int, default=None, help="Optimizer steps in all." + _defaults("steps"))
@click.option("--data", "data", multiple=True,
              help="Training data, repeatable: a text file, or a bench prompt file (answered by the target); "
                   "text:FILE / prompts:FILE force the kind; corpus:DIR adds an earlier run's corpus (its HEAD/ckpt "
                   "folder; same target) to the default sources. Default: Python's stdlib sources + prompts the "
                   "target answers from specpack's own templates (never evaluation sets).")
@click.option("--device", type=click.Choice(DEVICES), default=DEFAULTS.device, show_default=True)
@click.option("--seed", type=int, default=DEFAULTS.seed, show_default=True,
              help="Data order, initial weights and sampled answers.")
@click.option("--seq-len", type=int, default=DEFAULTS.seq_len, show_default=True, help="Tokens per training window.")
@click.option("--batch", type=int, default=None, help="Windows per step." + _defaults("batch"))
@click.option("--lr", type=float, default=DEFAULTS.lr, show_default=True, help="Peak learning rate (warmup, cosine).")
@click.option("--ttt-steps", type=int, default=DEFAULTS.ttt_steps, show_default=True,
              help="Training-time-test steps: the head fed its own outputs, as when it drafts.")
@click.option("--subset-size", type=int, default=DEFAULTS.subset_size, show_default=True,
              help="Vocabulary rows the head drafts over (the most frequent in the data; q is zero outside).")
@click.option("--stdlib-tokens", type=int, default=DEFAULTS.stdlib_tokens, show_default=True,
              help="Default recipe: tokens of Python's standard library sources.")
@click.option("--self-prompts", type=int, default=None,
              help="Default recipe: prompts written from specpack's templates and answered by the target."
                   + _defaults("self_prompts"))
@click.option("--self-instruct", type=int, default=None,
              help="Default recipe: requests the target writes itself, then answers (varied prose)."
                   + _defaults("self_instruct"))
@click.option("--answer-tokens", type=int, default=DEFAULTS.answer_tokens, show_default=True,
              help="New tokens the target writes per prompt.")
@click.option("--generation-batch", type=int, default=None,
              help="Prompts the target answers at once (a 1.5B target's cache at 1,024 rows of 456 tokens: about 13 "
                   "GB, by arithmetic; lower it on a smaller card)." + _defaults("generation_batch"))
@click.option("--checkpoint-every", type=int, default=DEFAULTS.checkpoint_every, show_default=True)
@click.option("--max-minutes", type=float, default=None,
              help="Stop after this long with a checkpoint; run the same command again to resume.")
@click.option("--stop-at", type=int, default=None, help="Stop after this step with a checkpoint (resume: run again).")
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's).")
@click.option("--init", "init", type=click.Path(file_okay=False), default=None,
              help="Start from this earlier head's trained weights (same target and shape) instead of random ones.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@user_errors
def distill_command(target: str, output: Path, steps: int | None, data: tuple[str, ...], device: str, seed: int,
                    seq_len: int, batch: int | None, lr: float, ttt_steps: int, subset_size: int, stdlib_tokens: int,
                    self_prompts: int | None, self_instruct: int | None, answer_tokens: int,
                    generation_batch: int | None, checkpoint_every: int, max_minutes: float | None,
                    stop_at: int | None, threads: int | None, init: str | None, no_progress: bool) -> None:
    """Train a draft head for TARGET by self-distillation (EAGLE-style; docs/heads.md)."""
    from specpack.distill.trainer import distill

    given = {"steps": steps, "batch": batch, "self_prompts": self_prompts, "self_instruct": self_instruct,
             "generation_batch": generation_batch}
    config = DistillConfig.for_device(
        device, **{name: value for name, value in given.items() if value is not None}, seed=seed, data=tuple(data),
        seq_len=seq_len, lr=lr, ttt_steps=ttt_steps, subset_size=subset_size, stdlib_tokens=stdlib_tokens,
        answer_tokens=answer_tokens, checkpoint_every=checkpoint_every, max_minutes=max_minutes, stop_at=stop_at,
        threads=threads, progress=not no_progress, init=init)
    distill(target, output, config)
    click.echo(str(output))
