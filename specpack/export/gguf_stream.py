"""A GGUF file's weights -> one fp32 model.safetensors, one tensor at a time (peak: one tensor + the mapped file).

    config = write_streamed(gguf_path, out)  -> the model config (config.json and model.safetensors written),
                                                or None: not a family this path covers (gguf.py then loads the
                                                whole model through transformers, as before)

The same steps, in the same code, as transformers' own GGUF loader (`load_gguf_checkpoint`): the config from
the file's metadata, gguf-py's `dequantize`, the architecture's `TensorProcessor` (llama's reverse q/k
permutation) and `get_gguf_hf_weights_map` for the names; then what `save_pretrained` keeps (tied weights once,
`remove_tied_weights_from_state_dict`). Only families transformers loads through that legacy path and that
have no weight conversions on save are covered (STREAMED); the output equals the whole-model path's tensor for
tensor, byte for byte (tests/export/test_gguf_stream.py; the real Qwen2.5-Coder 0.5B and 1.5B files: README.md,
"Requirements, as measured").

The safetensors file is written as the `safetensors` package writes it: a header of every tensor's dtype,
shape and byte range (sorted by name, all F32), padded with spaces to 8 bytes, then the data in that order.
Quantized tensors are dequantized ROWS rows at a time into the fp32 tensor (blocks never span rows).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

STREAMED = frozenset({"qwen2", "llama"})  # GGUF architecture == transformers model_type, legacy loader, no renames
ROWS = 4096  # rows dequantized at once: gguf-py's numpy dequantize needs a few times its output in temporaries
WEIGHTS = "model.safetensors"
ONE_FILE = 50 * 10**9  # save_pretrained's default max_shard_size: a larger model is sharded, by the whole path


class NotStreamable(Exception):
    """This file is outside what the streaming path reproduces exactly; the whole-model path converts it."""


def write_streamed(gguf_path: Path, out: Path) -> Any | None:
    """Write config.json and model.safetensors of `gguf_path` into `out`; None (nothing written) if not covered."""
    try:
        plan = _plan(gguf_path)
    except NotStreamable:
        return None
    config, model, processor, parsed, mapping, sources, shapes = plan
    out.mkdir(parents=True, exist_ok=True)
    _write_safetensors(out / WEIGHTS, sources, shapes, processor, parsed, mapping)
    config.dtype = "float32"  # what save_pretrained records for an fp32 model
    config.architectures = [type(model).__name__]
    config.save_pretrained(out)
    return config


def _plan(gguf_path: Path) -> tuple[Any, ...]:
    """(config, meta model, processor, parsed metadata, gguf->hf name map, hf name -> tensor, hf name -> shape)."""
    import torch
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoModelForCausalLM

    try:  # the loader's own pieces, as transformers 5.24 has them; a version without them converts the whole way
        from transformers.integrations.gguf import is_gguf_arch_supported
        from transformers.modeling_gguf_pytorch_utils import (
            TENSOR_PROCESSORS,
            TensorProcessor,
            get_gguf_hf_weights_map,
            load_gguf_checkpoint,
        )
        from transformers.modeling_utils import remove_tied_weights_from_state_dict
    except ImportError as e:
        raise NotStreamable(str(e)) from e

    from specpack.export.gguf_tensors import check_tensor_coverage

    path = Path(gguf_path).resolve()
    parsed = load_gguf_checkpoint(str(path), return_tensors=False)
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=str(path))
    reader = GGUFReader(str(path))  # memory-mapped: tensor data is read when touched
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    if arch not in STREAMED or config.model_type != arch or is_gguf_arch_supported(arch):
        raise NotStreamable(arch)
    check_tensor_coverage(gguf_path, config)  # the whole-model path's refusal of missing/extra/mis-shaped tensors
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if getattr(model, "_weight_conversions", None) or any(
            b for name, b in model.named_buffers() if name in model.state_dict()):
        raise NotStreamable("weight conversions or saved buffers")
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=parsed["config"])
    mapping = get_gguf_hf_weights_map(model, processor)
    state = model.state_dict()
    kept = remove_tied_weights_from_state_dict(dict(state), model)
    sources: dict[str, Any] = {}
    for tensor in reader.tensors:
        hf_name = mapping.get(tensor.name)
        if hf_name is None:
            continue  # rope_freqs and the like: read as config, never a weight
        if hf_name in sources:
            raise NotStreamable(f"two tensors for {hf_name}")
        sources[hf_name] = tensor
    if set(sources) != set(kept):
        raise NotStreamable("the file's tensors are not the saved weights one for one")
    if sum(4 * state[name].numel() for name in kept) > ONE_FILE:
        raise NotStreamable("more than one safetensors shard")
    return config, model, processor, parsed, mapping, sources, {name: tuple(state[name].shape) for name in kept}


def _write_safetensors(path: Path, sources: dict[str, Any], shapes: dict[str, tuple[int, ...]], processor: Any,
                       parsed: dict[str, Any], mapping: dict[str, str]) -> None:
    import numpy as np

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    start = 0
    for name in sorted(sources):
        size = 4 * int(np.prod(shapes[name], dtype=np.int64))
        header[name] = {"dtype": "F32", "shape": list(shapes[name]), "data_offsets": [start, start + size]}
        start += size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in sorted(sources):
            weights = _dequantized(sources[name])
            weights = processor.process(weights=weights, name=sources[name].name, tensor_key_mapping=mapping,
                                        parsed_parameters=parsed).weights
            if weights.dtype != np.dtype("<f4") or tuple(weights.shape) != shapes[name]:
                raise RuntimeError(f"GGUF tensor {sources[name].name} gave {weights.dtype} {weights.shape}, "
                                   f"expected float32 {shapes[name]} for {name}")
            f.write(np.ascontiguousarray(weights).data)
            del weights


def _dequantized(tensor: Any) -> Any:
    """gguf-py's `dequantize` of the whole tensor, computed ROWS rows at a time for block-quantized ones."""
    import numpy as np
    from gguf import GGMLQuantizationType, dequantize

    data = tensor.data
    if tensor.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) or data.ndim < 2:
        return dequantize(data, tensor.tensor_type)
    rows = data.reshape(-1, data.shape[-1])
    first = dequantize(rows[:1], tensor.tensor_type)
    out = np.empty((rows.shape[0], first.shape[-1]), dtype=first.dtype)
    for a in range(0, rows.shape[0], ROWS):
        out[a : a + ROWS] = dequantize(rows[a : a + ROWS], tensor.tensor_type)
    return out.reshape(*data.shape[:-1], first.shape[-1])
