"""`specpack distill`: the training loop (docs/heads.md, "Training").

    target (frozen) ──resolve, load fp32, hash──> target_sha256
    corpus = data.build_corpus (or HEAD/ckpt/corpus.npz when resuming);  subset = frequency_subset(corpus)
    head = DraftHead(seeded init, or --init's trained weights; embed, lm_head rows and final norm from the target)
    windows of seq_len tokens; every HOLDOUT_EVERY-th held out (never trained on)
    for step in [start, steps):                        batch = training windows drawn from (seed, step) only
        x [B, N] ──target──> g [B, N, F] (tapped hidden states), p = softmax(logits[:, 1:, subset])  [B, N-1, V_sub]
        loss = Σ_i 0.8^i · KL(p || head.ttt_forward(g, x)[i])  over rows whose label counts, whose target argmax is
               in the subset, and (step i) whose row t >= i
        AdamW step (clip 0.5; lr: warmup, cosine);  every log_every: a loss-curve point;  every checkpoint_every,
        at the end and at max_minutes: HEAD/ckpt/latest.pt;  at checkpoints and the end: top-1 and loss per
        training-time-test step on the held-out windows (the record's `heldout`: training top-1 alone cannot tell
        a head that generalizes from one that memorized its few million tokens)
    HEAD/head.safetensors + head.json (head_file.py)
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from specpack.distill.checkpoint import checkpoint_path, load_checkpoint, save_checkpoint
from specpack.distill.config import DistillConfig
from specpack.distill.data import Corpus, build_corpus, recipe
from specpack.distill.grouped_attention import use_grouped_decode
from specpack.distill.subset import coverage, frequency_subset
from specpack.distill.warm_start import describe, warm_start
from specpack.errors import SpecpackError
from specpack.heads.head_file import read_head

HOLDOUT_EVERY = 50  # every 50th training window is held out (never trained on): the record's held-out metric
EVAL_WINDOWS = 64  # held-out windows evaluated at each checkpoint and at the end

if TYPE_CHECKING:
    import torch

    from specpack.heads.model import DraftHead


def distill(target_src: str, out: Path, config: DistillConfig | None = None) -> Path:
    """Train a head for `target_src` into `out` (resuming from out/ckpt/latest.pt when it is there); returns `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specpack.export.sources import resolve_source
    from specpack.heads.target_hash import target_weights_sha256

    config = config or DistillConfig()
    out = Path(out)
    if config.device == "cuda" and not torch.cuda.is_available():
        raise SpecpackError("--device cuda needs a GPU torch can use", expected="torch.cuda.is_available()",
                            found="no CUDA device", hint="use --device cpu")
    torch.use_deterministic_algorithms(True, warn_only=True)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    target_dir = resolve_source(target_src)
    _log(f"loading the target {target_dir} ...")
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    target.requires_grad_(False)
    target_sha = target_weights_sha256(target)
    if config.device == "cuda":
        target = target.to("cuda", torch.bfloat16)
    use_grouped_decode(target)  # the data's generation: no key/value head copies per decode step
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    init = read_head(Path(config.init)) if config.init is not None else None  # checked as any head is read
    settings = {**config.record(), "recipe": recipe(config), "data": list(config.data),
                **({"init_weights_sha256": init.data["weights_sha256"]} if init is not None else {})}
    state = load_checkpoint(out, settings, target_sha)

    key = {"recipe": settings["recipe"], "data": settings["data"], "seed": config.seed, "target_sha256": target_sha}
    corpus = Corpus.load(checkpoint_path(out).parent, None if state is not None else key)
    if corpus is None:
        _log("building the training data ...")
        corpus = build_corpus(config, target, tokenizer, target_sha)
        corpus.save(checkpoint_path(out).parent, key)
    else:
        _log(f"the training data built before, read from {checkpoint_path(out).parent}")
    num_layers = int(target.config.get_text_config(decoder=True).num_hidden_layers)
    head = _new_head(target, config, corpus, num_layers)
    if init is not None and state is None:  # resuming: the checkpoint's weights, which started from init's
        warm_start(head, init, target_sha, target_src)
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=config.lr, betas=(0.9, 0.95),
                                  weight_decay=0.0)
    start, losses, wall = 0, [], 0.0
    window: list[list[float]] = []  # the steps since the last loss-curve point (a point is their mean)
    evals: list[dict[str, Any]] = []  # held-out top-1 and loss per training-time-test step, at checkpoints and the end
    if state is not None:
        head.load_state_dict(state["head"], strict=False)
        optimizer.load_state_dict(state["optimizer"])
        start, losses, wall = int(state["step"]), list(state["losses"]), float(state["wall_s"])
        window[:] = state.get("window", [])
        evals[:] = state.get("heldout", [])
        _log(f"resuming at step {start} of {config.steps}")

    def checkpoint(step: int, elapsed: float) -> None:
        save_checkpoint(out, {"step": step, "head": _trainable(head), "optimizer": optimizer.state_dict(),
                              "losses": losses, "window": window, "settings": settings, "target_sha256": target_sha,
                              "wall_s": elapsed, "heldout": evals})

    def evaluate(step: int) -> None:
        if heldout.size and (not evals or evals[-1]["step"] != step):
            evals.append({"step": step, **_evaluate(head, target, corpus, heldout, config)})

    pending: list[torch.Tensor] = []  # [1 + 2 K] metrics of the steps not read back yet (_step_metrics)

    def flush(step: int) -> None:
        """The pending steps' metrics into the window, in one copy from the device (and the progress bar)."""
        if pending:
            window.extend(torch.stack(pending).tolist())
            pending.clear()
            bar(step, window[-1][0], window[-1][1 + config.ttt_steps:])

    began = time.monotonic()
    step = start
    windows, heldout = _split(_windows(corpus, config.seq_len))
    with _progress(config, start) as bar:
        while step < config.steps:
            if config.max_minutes is not None and time.monotonic() - began > 60 * config.max_minutes:
                _log(f"--max-minutes reached at step {step}: checkpoint written, run again to resume")
                break
            if config.stop_at is not None and step >= config.stop_at:
                _log(f"stopped at step {step} (--stop-at): checkpoint written, run again to resume")
                break
            for group in optimizer.param_groups:
                group["lr"] = _lr(config, step)
            total, metrics = _train_step(head, target, corpus, windows, config, step, num_layers)
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), config.grad_clip)
            optimizer.step()
            step += 1
            pending.append(metrics)
            if step % config.log_every == 0 or step % config.checkpoint_every == 0 or step == config.steps:
                flush(step)
            if step % config.log_every == 0 or step == config.steps:  # a point: the mean since the last one
                mean = np.mean(window, axis=0).tolist()
                k = config.ttt_steps
                losses.append({"step": step, "loss": round(mean[0], 6), "per_step": [round(v, 6) for v in mean[1:1 + k]],
                               "top1": [round(v, 4) for v in mean[1 + k:]]})
                window.clear()
            if step % config.checkpoint_every == 0 and step < config.steps:
                evaluate(step)
                checkpoint(step, wall + time.monotonic() - began)
        flush(step)  # a run stopped early (--max-minutes, --stop-at) keeps its last steps' metrics in the checkpoint
    evaluate(step)
    elapsed = wall + time.monotonic() - began
    checkpoint(step, elapsed)
    if step < config.steps:
        return out
    from specpack.heads.head_file import save_head

    subset = head.subset.cpu().numpy()
    record = {"target": {"source": target_src, "model_type": head.config.model_type, "weights_sha256": target_sha},
              "recipe": recipe(config), "data": corpus.parts,
              "training": {**config.record(), "init": describe(init) if init is not None else None,
                           "steps_done": step, "wall_s": round(elapsed, 3),
                           "torch": torch.__version__, "subset_coverage": round(coverage(corpus.ids, subset), 6)},
              "losses": losses, "heldout": evals, "notes": dict(config.extra)}
    save_head(out, head.cpu(), record)
    seen = f", held-out top-1 {evals[-1]['top1']}" if evals else ""
    _log(f"head written to {out} (loss {losses[0]['loss'] if losses else '?'} -> {losses[-1]['loss'] if losses else '?'}"
         f"{seen})")
    return out


def _new_head(target: Any, config: DistillConfig, corpus: Corpus, num_layers: int) -> DraftHead:
    """A freshly initialised head (seeded), its frozen parts and final norm from the target."""
    import torch

    from specpack.heads.head_file import frozen_parts
    from specpack.heads.model import DraftHead, HeadConfig, default_taps

    text = target.config.get_text_config(decoder=True)
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    taps = config.taps or default_taps(num_layers)
    if any(not 0 <= t < num_layers for t in taps):
        raise SpecpackError("invalid --taps", expected=f"layer indices in 0..{num_layers - 1}", found=str(list(taps)))
    vocab_rows = int(target.get_output_embeddings().weight.shape[0])
    subset = torch.from_numpy(frequency_subset(corpus.ids, vocab_rows, config.subset_size))
    head_config = HeadConfig(
        model_type=str(target.config.model_type), target_hidden=hidden, taps=tuple(taps), hidden=hidden, heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
        intermediate=int(getattr(text, "intermediate_size", None) or 4 * hidden),
        rope_theta=float(_rope_theta(text)), rms_eps=float(getattr(text, "rms_norm_eps", 1e-6)),
        vocab_rows=vocab_rows, subset_size=int(subset.numel()))
    embed, lm_rows = frozen_parts(target, subset)
    torch.manual_seed(config.seed)
    head = DraftHead(head_config, embed, lm_rows, subset)
    norm = getattr(target.get_decoder(), "norm", None)
    if norm is not None and getattr(norm, "weight", None) is not None and norm.weight.shape == (hidden,):
        with torch.no_grad():
            head.final_norm.weight.copy_(norm.weight.float())
    return head.to(config.device)


def _rope_theta(text: Any) -> float:
    params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(text, "rope_theta", 10_000.0))


def _windows(corpus: Corpus, seq_len: int) -> np.ndarray:
    """Start offsets of the windows that hold at least one trained label (non-overlapping, seq_len apart)."""
    starts = np.arange(0, corpus.ids.size - seq_len + 1, seq_len)
    trained = np.array([corpus.mask[s + 2: s + seq_len].any() for s in starts], dtype=bool)
    return starts[trained]


def _split(windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(training windows, held-out windows): every HOLDOUT_EVERY-th window is never trained on, once there are at
    least 2 * HOLDOUT_EVERY windows (a tiny corpus keeps them all for training and has no held-out metric)."""
    if windows.size < 2 * HOLDOUT_EVERY:
        return windows, windows[:0]
    held = np.arange(windows.size) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    return windows[~held], windows[held]


def eval_windows(heldout: np.ndarray) -> np.ndarray:
    """EVAL_WINDOWS of the held-out windows, spread evenly from the first to the last (all of them if fewer)."""
    if heldout.size <= EVAL_WINDOWS:
        return heldout
    return heldout[np.linspace(0, heldout.size - 1, EVAL_WINDOWS).round().astype(int)]


def _evaluate(head: DraftHead, target: Any, corpus: Corpus, heldout: np.ndarray, config: DistillConfig
              ) -> dict[str, Any]:
    """Top-1 agreement with the target and the loss of each training-time-test step on EVAL_WINDOWS held-out windows
    spread evenly over the corpus (row-weighted over the batches), without gradients: what the head does on text it
    never saw. Spread, not the first ones: those are all in the corpus's first parts (Run H's 64 were 39 of stdlib)."""
    import torch

    chosen = eval_windows(heldout)
    hits = np.zeros(config.ttt_steps)
    loss = np.zeros(config.ttt_steps)
    batches = 0
    with torch.no_grad():
        for first in range(0, chosen.size, config.batch):
            starts = chosen[first:first + config.batch]
            index = starts[:, None] + np.arange(config.seq_len)[None, :]
            _, metrics = _step_metrics(head, target, corpus.ids[index].astype(np.int64), corpus.mask[index], config)
            values = metrics.cpu().numpy()
            loss += values[1:1 + config.ttt_steps] * starts.size
            hits += values[1 + config.ttt_steps:] * starts.size
            batches += starts.size
    return {"windows": int(chosen.size), "top1": [round(float(v), 4) for v in hits / batches],
            "loss": [round(float(v), 6) for v in loss / batches]}


def _batch(corpus: Corpus, windows: np.ndarray, config: DistillConfig, step: int) -> tuple[np.ndarray, np.ndarray]:
    """ids int64 [B, N], mask [B, N] of the step's windows: drawn from (seed, step) alone, so resuming repeats them."""
    rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([config.seed, step])))
    starts = windows[rng.integers(0, windows.size, config.batch)]
    index = starts[:, None] + np.arange(config.seq_len)[None, :]
    return corpus.ids[index].astype(np.int64), corpus.mask[index]


def _train_step(head: DraftHead, target: Any, corpus: Corpus, windows: np.ndarray, config: DistillConfig, step: int,
                num_layers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's weighted loss (with its graph) and its metrics (_step_metrics)."""
    ids_np, mask_np = _batch(corpus, windows, config, step)
    return _step_metrics(head, target, ids_np, mask_np, config)


def _step_metrics(head: DraftHead, target: Any, ids_np: np.ndarray, mask_np: np.ndarray, config: DistillConfig
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """On windows ids [B, N] (mask [B, N]): the weighted loss, and metrics [1 + 2 K] on the device (the loss, then
    the loss and the top-1 agreement of each of the K training-time-test steps): read back only where they are
    reported, so a step never waits for the GPU before its backward is queued."""
    import torch

    from specpack.heads.model import STEP_WEIGHT, soft_kl

    ids = torch.from_numpy(ids_np).to(config.device)
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
        features = torch.cat([out.hidden_states[t] for t in head.config.taps], dim=-1).float()  # [B, N, F]
        logits = out.logits[:, 1:]  # [B, n, V] (bf16 on a GPU): position t + 1's distribution, the label of row t
        best = logits.argmax(-1)  # [B, n]: what fp32 values of these logits give (an exact widening), without them
        in_subset = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        in_subset[head.subset] = True
        p = torch.softmax(logits[..., head.subset].float(), dim=-1)  # [B, n, V_sub]
        best_sub = p.argmax(-1)
        mask = torch.from_numpy(mask_np).to(config.device).bool()
        label_counts = torch.cat([mask[:, 2:], mask[:, -1:]], dim=1)  # row t predicts token t + 2
        valid = label_counts & in_subset[best]  # [B, n]
    rows = torch.arange(valid.shape[1], device=valid.device)[None, :]
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if config.device == "cuda" else nullcontext()
    with autocast:
        steps = head.ttt_forward(features, ids, config.ttt_steps)
    total = torch.zeros((), device=features.device)
    per_step, top1 = [], []
    for i, step_logits in enumerate(steps):
        rows_i = valid & (rows >= i)
        loss = soft_kl(step_logits, p, rows_i)
        total = total + STEP_WEIGHT ** i * loss
        per_step.append(loss.detach())
        hits = ((step_logits.argmax(-1) == best_sub) & rows_i).sum()
        top1.append(hits / rows_i.sum().clamp(min=1))
    return total, torch.stack([total.detach(), *per_step, *top1]).double()


def _lr(config: DistillConfig, step: int) -> float:
    """Linear warmup over warmup_frac of the steps, then cosine from lr down to lr * min_lr_frac."""
    warmup = max(1, round(config.warmup_frac * config.steps))
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
    floor = config.lr * config.min_lr_frac
    return floor + (config.lr - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _trainable(head: DraftHead) -> dict[str, Any]:
    from specpack.heads.head_file import FROZEN

    return {k: v.detach().cpu().clone() for k, v in head.state_dict().items() if k not in FROZEN}


class _progress:
    """A rich progress bar with the loss and the top-1 agreement of steps 0 and last (silent without progress)."""

    def __init__(self, config: DistillConfig, start: int):
        self.config, self.start = config, start
        self.bar: Any = None

    def __enter__(self) -> _progress:
        if self.config.progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("distill"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                                TimeRemainingColumn(), transient=False)
            self.bar.__enter__()
            self.task = self.bar.add_task("", total=self.config.steps, completed=self.start)
        return self

    def __call__(self, step: int, loss: float, top1: list[float]) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=step,
                            description=f"loss {loss:.4f}  top-1 {top1[0]:.2f} .. {top1[-1]:.2f}")

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


def _log(line: str) -> None:
    print(f"[distill] {line}", file=sys.stderr, flush=True)
