"""`specpack distill`: train a draft head for a target by self-distillation (docs/heads.md)."""

from __future__ import annotations

from pathlib import Path

import click

from specpack.cli.errors import user_errors
from specpack.cli.output_paths import OutputPath
from specpack.distill.config import DEVICES, DistillConfig

DEFAULTS = DistillConfig()


@click.command("distill")
@click.option("--target", "target", required=True, help="Target model: HF model directory, hub id or .gguf file.")
@click.option("-o", "--output", "output", required=True, type=OutputPath(),
              help="Head directory to write (head.safetensors, head.json); a run resumes from its ckpt/.")
@click.option("--steps", type=int, default=DEFAULTS.steps, show_default=True, help="Optimizer steps in all.")
@click.option("--data", "data", multiple=True,
              help="Training data, repeatable: a text file, or a bench prompt file (answered by the target); "
                   "text:FILE / prompts:FILE force the kind; corpus:DIR adds an earlier run's corpus (its HEAD/ckpt "
                   "folder; same target) to the default sources. Default: Python's stdlib sources + prompts the "
                   "target answers from specpack's own templates (never evaluation sets).")
@click.option("--device", type=click.Choice(DEVICES), default=DEFAULTS.device, show_default=True)
@click.option("--seed", type=int, default=DEFAULTS.seed, show_default=True,
              help="Data order, initial weights and sampled answers.")
@click.option("--seq-len", type=int, default=DEFAULTS.seq_len, show_default=True, help="Tokens per training window.")
@click.option("--batch", type=int, default=DEFAULTS.batch, show_default=True, help="Windows per step.")
@click.option("--lr", type=float, default=DEFAULTS.lr, show_default=True, help="Peak learning rate (warmup, cosine).")
@click.option("--ttt-steps", type=int, default=DEFAULTS.ttt_steps, show_default=True,
              help="Training-time-test steps: the head fed its own outputs, as when it drafts.")
@click.option("--subset-size", type=int, default=DEFAULTS.subset_size, show_default=True,
              help="Vocabulary rows the head drafts over (the most frequent in the data; q is zero outside).")
@click.option("--stdlib-tokens", type=int, default=DEFAULTS.stdlib_tokens, show_default=True,
              help="Default recipe: tokens of Python's standard library sources.")
@click.option("--self-prompts", type=int, default=DEFAULTS.self_prompts, show_default=True,
              help="Default recipe: prompts written from specpack's templates and answered by the target.")
@click.option("--self-instruct", type=int, default=DEFAULTS.self_instruct, show_default=True,
              help="Default recipe: requests the target writes itself, then answers (varied prose).")
@click.option("--answer-tokens", type=int, default=DEFAULTS.answer_tokens, show_default=True,
              help="New tokens the target writes per prompt.")
@click.option("--generation-batch", type=int, default=DEFAULTS.generation_batch, show_default=True,
              help="Prompts the target answers at once (more on a GPU).")
@click.option("--checkpoint-every", type=int, default=DEFAULTS.checkpoint_every, show_default=True)
@click.option("--max-minutes", type=float, default=None,
              help="Stop after this long with a checkpoint; run the same command again to resume.")
@click.option("--stop-at", type=int, default=None, help="Stop after this step with a checkpoint (resume: run again).")
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's).")
@click.option("--init", "init", type=click.Path(file_okay=False), default=None,
              help="Start from this earlier head's trained weights (same target and shape) instead of random ones.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@user_errors
def distill_command(target: str, output: Path, steps: int, data: tuple[str, ...], device: str, seed: int, seq_len: int,
                    batch: int, lr: float, ttt_steps: int, subset_size: int, stdlib_tokens: int, self_prompts: int,
                    self_instruct: int, answer_tokens: int, generation_batch: int, checkpoint_every: int,
                    max_minutes: float | None, stop_at: int | None, threads: int | None, init: str | None,
                    no_progress: bool) -> None:
    """Train a draft head for TARGET by self-distillation (EAGLE-style; docs/heads.md)."""
    from specpack.distill.trainer import distill

    config = DistillConfig(steps=steps, seed=seed, device=device, data=tuple(data), seq_len=seq_len, batch=batch, lr=lr,
                           ttt_steps=ttt_steps, subset_size=subset_size, stdlib_tokens=stdlib_tokens,
                           self_prompts=self_prompts, self_instruct=self_instruct,
                           answer_tokens=answer_tokens, generation_batch=generation_batch,
                           checkpoint_every=checkpoint_every,
                           max_minutes=max_minutes, stop_at=stop_at, threads=threads, progress=not no_progress,
                           init=init)
    distill(target, output, config)
    click.echo(str(output))
