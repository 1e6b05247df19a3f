"""HEAD/ckpt/latest.pt: everything a run needs to continue exactly where it stopped.

    {"step": int, "head": trainable state dict (subset included), "optimizer": AdamW state, "losses": [...],
     "window": the per-step values since the last loss-curve point,
     "settings": DistillConfig.record() minus steps, "target_sha256": str, "wall_s": float}

Written to a temporary file and renamed (a crash never leaves half a checkpoint). The data order is a function of
(seed, step) and nothing else random happens in a step, so a resumed run gives the same weights as one that never
stopped (on the CPU, with torch's deterministic algorithms; tests/distill).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specpack.errors import SpecpackError

CKPT_DIR, LATEST = "ckpt", "latest.pt"


def checkpoint_path(out: Path) -> Path:
    return out / CKPT_DIR / LATEST


def save_checkpoint(out: Path, state: dict[str, Any]) -> None:
    import torch

    path = checkpoint_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{LATEST}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(out: Path, settings: dict[str, Any], target_sha256: str) -> dict[str, Any] | None:
    """The checkpoint of a run with the same settings and target, None when there is none; a SpecpackError when
    the one there was made with other settings (continuing it would mix two runs)."""
    import torch

    path = checkpoint_path(out)
    if not path.is_file():
        return None
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("target_sha256") != target_sha256:
        raise SpecpackError(f"{path} belongs to a head for another target", expected=f"target sha256 {target_sha256}",
                            found=f"target sha256 {state.get('target_sha256')}", hint="write the new head elsewhere (-o)")
    theirs = {k: v for k, v in state.get("settings", {}).items() if k != "steps"}
    ours = {k: v for k, v in settings.items() if k != "steps"}
    if theirs != ours:
        changed = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        raise SpecpackError(f"{path} was written with other settings", expected=f"the same {', '.join(changed)}",
                            found=", ".join(f"{k} {theirs.get(k)!r}" for k in changed),
                            hint=f"rerun with those settings to resume, or remove {path.parent} to start over")
    return state
