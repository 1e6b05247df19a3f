"""Distillation settings: one frozen dataclass, its defaults in one place; the CLI reads them from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specpack.errors import SpecpackError

DEVICES = ("cpu", "cuda")
DEFAULT_SUBSET = 32_768  # FR-Spec / EAGLE-3 size for a ~150k vocabulary (docs/design/heads_and_trees.md §3.4)
# The default recipe on a GPU (`for_device("cuda")`; the dataclass's own defaults are the CPU's, sized for the tiny test
# models): 16,384 self-instruct requests and 1,024 seed prompts answered 1,024 at a time (cache 28 layers x K,V x 2 heads
# x 128 x 2 B = 28 KiB a token, so about 13 GB at 1,024 rows of ~200 prompt + 256 answer tokens, by arithmetic; 9.9 GiB
# peak measured at 48 new tokens), about 5 M tokens with the stdlib text, then 4,000 steps of 8 windows. Measured as one
# run on an H100 for the 1.5B target (bench/README.md, "Run K"; 3,300 steps, generation batch 2,048): 6 minutes for
# loading, data and probe, 131.6 ms a step, 13.6 minutes in all: about 15 with 4,000 steps (Run I's head took about
# 5,400 over 8.6 M tokens).
CUDA_RECIPE: dict[str, int] = {"steps": 4_000, "batch": 8, "self_prompts": 1_024, "self_instruct": 16_384,
                               "generation_batch": 1_024}


@dataclass(frozen=True)
class DistillConfig:
    steps: int = 2_000                 # optimizer steps in all (a resumed run continues up to this many)
    seed: int = 0                      # data order, initial weights, sampled generations
    device: str = "cpu"                # "cuda": the target in bf16, the head's matmuls under bf16 autocast
    data: tuple[str, ...] = ()         # files: text, or bench prompt files ("prompts:FILE" forces prompts)
    default_recipe: bool = True        # add the default sources (stdlib + self-written prompts) when --data is empty
    seq_len: int = 512                 # tokens per training window
    batch: int = 4                     # windows per step
    lr: float = 3e-4                   # peak; linear warmup over warmup_frac of the steps, cosine to lr * min_lr_frac
    warmup_frac: float = 0.03
    min_lr_frac: float = 0.1
    grad_clip: float = 0.5             # EAGLE-1/3
    ttt_steps: int = 5                 # training-time-test steps (the head fed its own outputs)
    subset_size: int = DEFAULT_SUBSET  # vocabulary rows the head drafts over (all, when the vocabulary is smaller)
    taps: tuple[int, ...] | None = None  # tapped layers; None: (2, L // 2, L - 3), clamped
    stdlib_tokens: int = 1_000_000     # default recipe: Python's standard library sources, this many tokens
    self_prompts: int = 256            # default recipe: prompts written from seed_prompts.py's templates
    self_instruct: int = 1024          # default recipe: requests the target writes itself, then answers (self_instruct.py)
    answer_tokens: int = 256           # new tokens the target writes per prompt
    generation_batch: int = 32         # prompts the target answers at once (CUDA_RECIPE's on a GPU)
    checkpoint_every: int = 200        # steps between checkpoints (and at the end, and at max_minutes)
    log_every: int = 10                # steps between loss-curve points
    max_minutes: float | None = None   # stop (with a checkpoint) after this long; run again to resume
    stop_at: int | None = None         # stop (with a checkpoint) after this step; run again to resume
    progress: bool = True              # rich progress bar
    threads: int | None = None         # torch's CPU threads; None: torch's default (1 is fastest on a busy machine)
    extra: dict[str, str] = field(default_factory=dict)  # free-form notes recorded with the head
    init: str | None = None            # an earlier head for this target and shape to start from (warm_start.py)

    def __post_init__(self) -> None:
        positive = {"--steps": self.steps, "--seq-len": self.seq_len, "--batch": self.batch,
                    "--ttt-steps": self.ttt_steps, "--subset-size": self.subset_size,
                    "--generation-batch": self.generation_batch,
                    "--checkpoint-every": self.checkpoint_every, "--log-every": self.log_every}
        for option, value in positive.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecpackError(f"invalid {option}", expected="an integer >= 1", found=repr(value))
        if self.seq_len < 3:
            raise SpecpackError("invalid --seq-len", expected="at least 3 tokens", found=str(self.seq_len))
        if self.device not in DEVICES:
            raise SpecpackError("invalid --device", expected=" or ".join(DEVICES), found=repr(self.device))
        if not 0 < self.lr < 1:
            raise SpecpackError("invalid --lr", expected="0 < lr < 1", found=repr(self.lr))
        for option, number in (("--stdlib-tokens", self.stdlib_tokens), ("--self-prompts", self.self_prompts),
                               ("--self-instruct", self.self_instruct),
                               ("--answer-tokens", self.answer_tokens)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise SpecpackError(f"invalid {option}", expected="an integer >= 0", found=repr(number))
        if self.stop_at is not None and (isinstance(self.stop_at, bool) or not isinstance(self.stop_at, int)
                                         or self.stop_at < 1):
            raise SpecpackError("invalid --stop-at", expected="an integer >= 1", found=repr(self.stop_at))
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise SpecpackError("invalid --max-minutes", expected="a number > 0", found=repr(self.max_minutes))

    @classmethod
    def for_device(cls, device: str, **given: Any) -> DistillConfig:
        """The settings `given`, the rest the device's defaults (CUDA_RECIPE on a GPU, the dataclass's elsewhere)."""
        return cls(device=device, **{**(CUDA_RECIPE if device == "cuda" else {}), **given})

    def record(self) -> dict[str, object]:
        """What the head's record keeps of the settings (the ones that change the result)."""
        return {"steps": self.steps, "seed": self.seed, "device": self.device, "seq_len": self.seq_len,
                "batch": self.batch, "lr": self.lr, "warmup_frac": self.warmup_frac, "min_lr_frac": self.min_lr_frac,
                "grad_clip": self.grad_clip, "ttt_steps": self.ttt_steps, "subset_size": self.subset_size,
                "step_weight": 0.8, "optimizer": "AdamW(0.9, 0.95), weight decay 0"}
