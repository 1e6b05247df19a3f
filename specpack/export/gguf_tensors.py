"""A GGUF file's tensors must cover the model its metadata describes: every parameter there, with its shape,
and nothing else. transformers fills a missing tensor with random weights (one log line), drops an extra one
and raises a bare RuntimeError for a mis-shaped one; a pack built from that would be silently wrong.

    load_covered(gguf_path, load)  -> the model `load` returns, or a SpecpackError naming the tensors

Names map through gguf-py's own table (llama.cpp's names <-> Hugging Face names). GGUF lists dims innermost
first, so a [out, in] weight is stored as [in, out]; GPT-2's Conv1D weights are the other way round: either
order of the same dims is accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from specpack.errors import SpecpackError

SHOWN = 8
NOT_PARAMETERS = frozenset({"rope_freqs.weight"})  # GGUF tensors transformers reads as config, not weights


def load_covered(gguf_path: Path, load: Callable[[Path], Any]) -> Any:
    """`load(gguf_path)`, after (or, when loading fails, instead of) checking the tensors cover the model."""
    try:
        model = load(gguf_path)
    except RuntimeError:  # transformers' refusal of mismatched sizes: name the tensors instead
        from transformers import AutoConfig

        path = Path(gguf_path).resolve()
        check_tensor_coverage(gguf_path, AutoConfig.from_pretrained(str(path.parent), gguf_file=str(path)))
        raise
    check_tensor_coverage(gguf_path, model.config)
    return model


def check_tensor_coverage(gguf_path: Path, config: Any) -> None:
    """SpecpackError naming missing, extra and mis-shaped tensors of `gguf_path` for a model of `config`."""
    from specpack.export.gguf import read_gguf_summary

    summary = read_gguf_summary(gguf_path)  # the tensor table, without gguf-py's slow full reader
    have, arch = summary.tensors, summary.architecture
    want = _expected_tensors(arch, config)
    missing = sorted(want.keys() - have.keys())
    extra = sorted(have.keys() - want.keys() - NOT_PARAMETERS)
    wrong = [f"{name} {list(reversed(have[name]))} (the model needs {list(want[name])})"
             for name in sorted(want.keys() & have.keys()) if want[name] not in (have[name], tuple(reversed(have[name])))]
    found = [f"{label}: {_names(items)}" for label, items in (("missing", missing), ("extra", extra),
                                                              ("wrong shape", wrong)) if items]
    if found:
        raise SpecpackError(f"the tensors of {Path(gguf_path).name} do not cover the model it describes",
                            expected=f"the {len(want)} tensors of a {config.num_hidden_layers}-layer {arch} model, "
                                     "each with its shape", found="; ".join(found),
                            hint="the file is damaged or was edited: download it again")


def _expected_tensors(arch: str, config: Any) -> dict[str, tuple[int, ...]]:
    """GGUF name -> Hugging Face shape of every parameter of a model built from `config` (on the meta device)."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    archs = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in archs:
        raise SpecpackError(f"cannot check the tensors of a GGUF {arch!r} model", expected=f"one of {sorted(archs)}",
                            found=repr(arch), hint="upgrade the gguf package")
    table = gguf.get_tensor_name_map(archs[arch], int(config.num_hidden_layers))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    out = {}
    for name, param in model.named_parameters():  # tied weights appear once
        gguf_name = table.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is not None:
            out[gguf_name] = tuple(param.shape)
    return out


def _names(items: list[str]) -> str:
    return ", ".join(items[:SHOWN]) + (f" (and {len(items) - SHOWN} more)" if len(items) > SHOWN else "")
