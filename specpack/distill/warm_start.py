"""`specpack distill --init HEAD`: a new run starts from an earlier head's trained weights instead of random ones.

Data accumulates across sessions (`--data corpus:DIR`), and so can training: the earlier head must be for this very
target (its weights' hash) and of the same shape (HeadConfig: taps, sizes, subset size). Its trained tensors (fc,
norms, attention, MLP, final norm) are loaded; its vocabulary subset is not (the new run takes the most frequent tokens
of its own data, and the frozen lm_head rows with them), nor are the frozen parts (from the target, as always).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specpack.errors import SpecpackError
from specpack.heads.head_file import FROZEN, HeadRecord, check_target

if TYPE_CHECKING:
    from specpack.heads.model import DraftHead

NOT_LOADED = (*FROZEN, "subset")  # rebuilt from the target and the new run's own data


def describe(init: HeadRecord) -> dict[str, Any]:
    """What the new head's record keeps of the head it started from."""
    return {"path": str(init.path), "weights_sha256": init.data["weights_sha256"],
            "steps_done": init.data.get("training", {}).get("steps_done")}


def warm_start(head: DraftHead, init: HeadRecord, target_sha256: str, target_source: str) -> None:
    """`init`'s trained tensors into `head` (fresh, for `target_sha256`), after checking it is for this target and
    of this shape."""
    from safetensors.torch import load_file

    check_target(init, target_sha256, target_source)
    mine, theirs = head.config.to_json(), init.config.to_json()
    differ = sorted(key for key in {*mine, *theirs} if mine.get(key) != theirs.get(key))
    if differ:
        raise SpecpackError(f"--init {init.path}: that head has another shape",
                            expected=", ".join(f"{key} {mine.get(key)!r}" for key in differ),
                            found=", ".join(f"{key} {theirs.get(key)!r}" for key in differ),
                            hint="pass the --taps and --subset-size it was trained with, or train without --init")
    tensors = {name: t for name, t in load_file(str(init.weights_file)).items() if name not in NOT_LOADED}
    missing, unexpected = head.load_state_dict(tensors, strict=False)
    missing = [name for name in missing if name not in NOT_LOADED]
    if missing or unexpected:
        raise SpecpackError(f"--init {init.path}: its tensors do not fit", expected="the head's trained tensors",
                            found=f"missing {missing[:4]}, unexpected {unexpected[:4]}", hint="train without --init")
