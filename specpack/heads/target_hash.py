"""The hash that ties a head to its target: sha256 over the target's weights as fp32, in parameter-name order.

Every (name, shape, fp32 bytes) of the model's state dict is hashed, so the same weights give the same hash whatever
dtype or file layout they were saved in (a bf16 copy of fp32 weights does not: its values differ). Tied weights are
hashed under each name. `specpack distill` records it; `spec-export --draft-head` recomputes it from the target it
exports and refuses a head whose hash differs.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def target_weights_sha256(model: torch.nn.Module) -> str:
    """Hex sha256 over every state-dict tensor of `model` as fp32 (name, shape and bytes)."""
    import torch

    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            if not tensor.is_floating_point():
                continue  # buffers such as position ids are not weights
            digest.update(f"{name}:{tuple(tensor.shape)}\n".encode())
            digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()
