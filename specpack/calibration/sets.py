"""Calibration sets for the calibrated Q/DQ modes (calibrated.py): prompts in, token sequences and a hash out.

    prompt file (specpack/prompts.py's formats) --seeded choice of N--> texts --model's tokenizer--> ids [N][S]
    dataset_sha256 = sha256 of the ids as canonical JSON: what calibration actually saw

A missing, empty or malformed prompt file fails with the readers' SpecpackError; so does a set that tokenizes
to nothing. Export-time only (transformers' tokenizer, with its chat template for chat prompts).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from specpack.errors import SpecpackError

if TYPE_CHECKING:
    from specpack.prompts import BenchPrompt

DEFAULT_SAMPLES = 32
DEFAULT_SEED = 0
MAX_TOKENS = 256  # each sequence is cut to this many tokens (activation ranges, not long-context behaviour)


@dataclass(frozen=True)
class CalibrationSet:
    sequences: tuple[tuple[int, ...], ...]  # token ids of each sample, prompt order of the seeded choice
    source: str                              # "<file name>: N of M prompts, seed S"
    sha256: str

    @property
    def samples(self) -> int:
        return len(self.sequences)


def calibration_set(prompt_file: str | Path, samples: int, seed: int, model_dir: Path) -> CalibrationSet:
    """`samples` prompts of `prompt_file` chosen with numpy's Philox seeded by `seed` (all when it has fewer),
    tokenized by the model's tokenizer."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise SpecpackError("invalid --calib-samples", expected="an integer >= 1", found=repr(samples))
    path = Path(prompt_file).expanduser()
    prompts = check_prompt_file(path)
    rng = np.random.Generator(np.random.Philox(seed))
    chosen = sorted(rng.choice(len(prompts), size=min(samples, len(prompts)), replace=False).tolist())
    tokenizer = _tokenizer(model_dir)
    sequences = []
    for i in chosen:
        p = prompts[i]
        ids = (tokenizer.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]
               if p.chat and tokenizer.chat_template else tokenizer.encode(p.text, add_special_tokens=False))
        if len(ids):
            sequences.append(tuple(int(t) for t in ids[:MAX_TOKENS]))
    if not sequences:
        raise SpecpackError(f"no calibration tokens from {path}", expected="prompts that tokenize to at least one token",
                            found=f"{len(chosen)} empty prompts")
    digest = hashlib.sha256(json.dumps(sequences, separators=(",", ":")).encode()).hexdigest()
    return CalibrationSet(tuple(sequences), f"{path.name}: {len(sequences)} of {len(prompts)} prompts, seed {seed}",
                          digest)


def check_prompt_file(prompt_file: str | Path) -> list[BenchPrompt]:
    """The prompts of a calibration prompt file; a SpecpackError if it is missing, empty or malformed."""
    from specpack.prompts import read_prompts

    path = Path(prompt_file).expanduser()
    if not path.is_file():
        raise SpecpackError(f"calibration prompt file not found: {path}", expected="an existing prompt file",
                            found="no such file", hint="--calib-prompts takes a bench prompt file")
    return read_prompts([path])  # raises on an empty or malformed file


def _tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
