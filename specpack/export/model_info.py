"""What export/ and later stages need to know about a causal LM, read from its config.json.

Light to import: transformers is imported inside `read_model_info` only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specpack.errors import SpecpackError

# Families the exporter is tested on (tests/export). Other decoder-only causal LMs that transformers knows are
# attempted; their graphs are checked by name and shape like these.
SUPPORTED_FAMILIES = ("llama", "qwen2", "mistral", "gpt2")
WEIGHT_SUFFIXES = (".safetensors", ".bin")  # what from_pretrained loads weights from


@dataclass(frozen=True)
class ModelInfo:
    """The shapes a plain graph is built with; see specpack/names.py for the I/O they size."""

    model_type: str  # config.model_type, e.g. "qwen2"
    num_layers: int
    kv_heads: int
    head_dim: int
    vocab_rows: int  # logits width = embedding rows (config.vocab_size, padding included)
    max_positions: int | None  # n_positions / max_position_embeddings; None when the model has no limit


def check_model_dir(model_dir: Path) -> Path:
    """`model_dir` itself if it is a directory holding config.json, else a SpecpackError."""
    if not model_dir.exists():
        raise SpecpackError(f"model directory {model_dir} does not exist",
                            expected="a Hugging Face model directory (config.json and weights)",
                            found="no such file or directory", hint="check the path")
    if not model_dir.is_dir():
        raise SpecpackError(f"{model_dir} is not a directory",
                            expected="a Hugging Face model directory (config.json and weights)",
                            found="a file", hint="pass the folder that holds config.json")
    if not (model_dir / "config.json").is_file():
        present = sorted(p.name for p in model_dir.iterdir())[:8]
        raise SpecpackError(f"{model_dir} has no config.json",
                            expected="a Hugging Face model directory (config.json and weights)",
                            found=f"files: {', '.join(present) or '(empty directory)'}",
                            hint="save the model with `save_pretrained`, or pass a hub id or a .gguf file")
    return model_dir


def require_weights(model_dir: Path) -> Path:
    """`model_dir` if it holds weight files (safetensors or PyTorch .bin), else a SpecpackError naming what it holds."""
    weights = [p for p in Path(model_dir).iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()]
    if not weights:
        present = sorted(p.name for p in Path(model_dir).iterdir())[:8]
        raise SpecpackError(f"{model_dir} has no weights", expected="model weights: *.safetensors or pytorch_model*.bin",
                            found=f"files: {', '.join(present)}",
                            hint="save the model with `save_pretrained` (it writes the weights beside config.json)")
    return Path(model_dir)


def read_model_info(model_dir: Path) -> ModelInfo:
    """Read a causal LM's shapes from `model_dir/config.json` (via transformers.AutoConfig)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_dir = check_model_dir(Path(model_dir))
    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (ValueError, KeyError, OSError) as e:  # unknown model_type, broken JSON
        raise SpecpackError(f"transformers cannot read {model_dir / 'config.json'}",
                            expected=f"a causal LM config (tested: {', '.join(SUPPORTED_FAMILIES)})",
                            found=str(e).splitlines()[0], hint="upgrade transformers if the family is new") from e
    model_type = str(config.model_type)
    arch = ", ".join(getattr(config, "architectures", None) or []) or type(config).__name__
    found = f"model_type {model_type!r} ({arch})"
    expected = f"a decoder-only causal language model (tested families: {', '.join(SUPPORTED_FAMILIES)})"
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise SpecpackError(f"{model_dir} is not a causal language model: AutoModelForCausalLM does not know it",
                            expected=expected, found=found, hint="pass a decoder-only text generation model")
    # BERT-like encoders (and BART) also map to a causal-LM head; they are not decoders to speculate with
    if getattr(config, "is_encoder_decoder", False) or model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        raise SpecpackError(f"{model_dir} is an encoder or encoder-decoder model, not a decoder-only causal LM",
                            expected=expected, found=found, hint="pass a decoder-only text generation model")

    text = config.get_text_config(decoder=True)
    try:
        num_layers = int(text.num_hidden_layers)
        heads = int(text.num_attention_heads)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        vocab_rows = int(text.vocab_size)
    except (AttributeError, TypeError) as e:
        raise SpecpackError(f"cannot read layer, head or vocabulary sizes from {model_dir / 'config.json'}",
                            expected=expected, found=f"{found}: {e}") from e
    max_positions = getattr(text, "max_position_embeddings", None)  # GPT-2's n_positions maps onto it
    return ModelInfo(model_type=model_type, num_layers=num_layers, kv_heads=kv_heads, head_dim=head_dim,
                     vocab_rows=vocab_rows, max_positions=int(max_positions) if max_positions else None)
