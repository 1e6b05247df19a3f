"""Model sources: a local Hugging Face model directory, a hub id or a GGUF file -> a local model directory.

    resolve_source("models/qwen")          -> models/qwen                      (must hold config.json)
    resolve_source("Qwen/Qwen2.5-0.5B")    -> hub snapshot in the HF cache     (huggingface_hub.snapshot_download)
    resolve_source("q.Q4_K_M.gguf")        -> specpack.export.gguf.convert_gguf(...)
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from specpack.errors import SpecpackError
from specpack.export.model_info import WEIGHT_SUFFIXES, check_model_dir
from specpack.hashing import sha256_file

# What a hub snapshot needs: config, tokenizer, generation config and chat template, and the weights
_HUB_FILES = ["*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken", "*.safetensors"]
_HUB_FALLBACK_WEIGHTS = ["*.bin"]  # only for repos without safetensors
_HUB_SKIP = ["*/*", "consolidated*"]  # subfolders (onnx/, original/) and duplicate native checkpoints
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")  # "name" or "org/name"


def resolve_source(src: str) -> Path:
    """A local model directory for `src`: a model directory, a `.gguf` file, or a hub id ("org/name")."""
    path = Path(src).expanduser()
    if src.lower().endswith(".gguf"):
        if not path.is_file():
            found = "a directory" if path.is_dir() else "no such file or directory"
            raise SpecpackError(f"GGUF file {src} does not exist", expected="a readable .gguf file", found=found,
                                hint="check the path")
        from specpack.export.gguf import convert_gguf

        return convert_gguf(path)
    if path.exists():
        return check_model_dir(path)
    if _looks_local(src):
        raise SpecpackError(f"model source {src} does not exist",
                            expected="a model directory, a .gguf file or a hub id such as Qwen/Qwen2.5-0.5B",
                            found="no such file or directory", hint="check the path")
    return _download(src)


def _looks_local(src: str) -> bool:
    """A path rather than a hub id: starts with . / ~, has a backslash or more than one '/', or is no valid id."""
    seps = {os.sep, os.altsep or os.sep} - {"/"}
    return src.startswith((".", "/", "~")) or any(s in src for s in seps) or not _HUB_ID.match(src)


def _download(repo_id: str) -> Path:
    """snapshot_download of the files a model directory needs; SpecpackError when offline or missing."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = f"{repo_id} does not exist locally"
    expected = "a model directory, a .gguf file or a hub id such as Qwen/Qwen2.5-0.5B"
    try:
        snap = Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES, ignore_patterns=_HUB_SKIP))
        if not any(snap.glob("*.safetensors")):
            snap = Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES + _HUB_FALLBACK_WEIGHTS,
                                          ignore_patterns=_HUB_SKIP))
    except (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError) as e:
        raise SpecpackError(f"{what}, and the Hugging Face hub has no such repo (or it is private or gated)",
                            expected=expected, found=_first_line(e),
                            hint="check the spelling, or log in with `hf auth login` for a gated model") from e
    except LocalEntryNotFoundError as e:  # offline, and nothing in the local cache
        raise SpecpackError(f"{what}, and the Hugging Face hub could not be reached", expected=expected,
                            found=_first_line(e), hint="check the network, or download the model and pass its path"
                            ) from e
    except (HfHubHTTPError, OSError, ValueError) as e:  # other HTTP errors, network errors, invalid ids
        raise SpecpackError(f"{what}, and downloading it from the Hugging Face hub failed", expected=expected,
                            found=_first_line(e), hint="check the network, or download the model and pass its path"
                            ) from e
    return check_model_dir(snap)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"



def source_record(src: str, model_dir: Path) -> dict[str, object]:
    """The manifest's record of one model source: what was asked for, where it resolved, and file hashes.

    "files" maps names of files in `model_dir` (config.json, *.safetensors, *.bin) and, for a GGUF source,
    the .gguf file's own name, to their sha256.
    """
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    weights = sorted(p.name for p in model_dir.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file())
    names = ["config.json", *weights]
    files = {name: sha256_file(model_dir / name) for name in names}
    if src.lower().endswith(".gguf"):
        gguf = Path(src).expanduser()
        files[gguf.name] = sha256_file(gguf)
    return {"source": src, "resolved": str(model_dir), "model_type": config.get("model_type"), "files": files}
