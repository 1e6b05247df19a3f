"""A head on disk: HEAD/head.safetensors (what was trained) + HEAD/head.json (what it is and how it was made).

    HEAD/
      head.safetensors   fc, norms, attention, MLP, final norm (fp32) and `subset` (int64 [V_sub], token ids)
      head.json          {"format": "specpack-head", "version": 1, "kind": "eagle3",
                          "config": HeadConfig, "target": {source, model_type, weights_sha256},
                          "weights_sha256": sha256 of head.safetensors, "subset_sha256": of the int64 id list,
                          "recipe": {...}, "data": [{name, kind, sha256, tokens}], "training": {...},
                          "losses": [{"step", "loss", "per_step": [...], "top1": [...]}]}
      ckpt/latest.pt     the trainer's checkpoint (distill/checkpoint.py); not read by export

The target's embedding and lm_head rows are not stored: `build_head` takes them from the target model, whose
weights hash must equal the one recorded (target_hash.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specpack.errors import SpecpackError
from specpack.hashing import sha256_file

if TYPE_CHECKING:
    import torch

    from specpack.heads.model import DraftHead, HeadConfig

FORMAT, VERSION, KIND = "specpack-head", 1, "eagle3"
WEIGHTS_FILE, RECORD_FILE = "head.safetensors", "head.json"
RECORD_BYTES = 16 << 20  # a record with a loss curve of 100k points is ~10 MB
FROZEN = ("embed", "lm_rows", "inv_freq")  # buffers rebuilt from the target, never stored


@dataclass(frozen=True)
class HeadRecord:
    """head.json, read and checked."""

    path: Path
    data: dict[str, Any]

    @property
    def config(self) -> HeadConfig:
        from specpack.heads.model import HeadConfig

        return HeadConfig.from_json(self.data["config"])

    @property
    def target_sha256(self) -> str:
        return str(self.data["target"]["weights_sha256"])

    @property
    def weights_file(self) -> Path:
        return self.path / WEIGHTS_FILE


def subset_sha256(subset: torch.Tensor) -> str:
    """sha256 of the subset's token ids as little-endian int64."""
    return hashlib.sha256(subset.detach().cpu().numpy().astype("<i8").tobytes()).hexdigest()


def save_head(out: Path, head: DraftHead, record: dict[str, Any]) -> Path:
    """Write head.safetensors and head.json (the record plus format, config, weights and subset hashes); both are
    written to temporary names and renamed, so a reader never sees half a head."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items() if k not in FROZEN}
    weights_tmp = out / f".{WEIGHTS_FILE}.tmp"
    save_file(tensors, str(weights_tmp))
    full = {"format": FORMAT, "version": VERSION, "kind": KIND, "config": head.config.to_json(), **record,
            "weights_sha256": sha256_file(weights_tmp), "subset_sha256": subset_sha256(head.subset)}
    record_tmp = out / f".{RECORD_FILE}.tmp"
    record_tmp.write_text(json.dumps(full, indent=1) + "\n", encoding="utf-8")
    os.replace(weights_tmp, out / WEIGHTS_FILE)
    os.replace(record_tmp, out / RECORD_FILE)
    return out


def read_head(path: Path) -> HeadRecord:
    """head.json of the head at `path`, checked: format, version, kind, and head.safetensors' hash."""
    path = Path(path)
    record_path = path / RECORD_FILE
    expected = f"a head directory written by `specpack distill` ({RECORD_FILE} and {WEIGHTS_FILE})"
    if not record_path.is_file() or not (path / WEIGHTS_FILE).is_file():
        found = "no such directory" if not path.exists() else ", ".join(sorted(p.name for p in path.iterdir())[:6])
        raise SpecpackError(f"{path} is not a draft head", expected=expected, found=found or "an empty directory",
                            hint="train one with `specpack distill --target T -o HEAD`")
    if record_path.stat().st_size > RECORD_BYTES:
        raise SpecpackError(f"{record_path} is too large", expected=f"at most {RECORD_BYTES:,} bytes",
                            found=f"{record_path.stat().st_size:,} bytes")
    try:
        data = json.loads(record_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise SpecpackError(f"{record_path} is not valid JSON", expected=expected, found=str(err)[:120]) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SpecpackError(f"{record_path} is not a head record", expected=f"format {FORMAT!r}",
                            found=repr(data.get("format") if isinstance(data, dict) else type(data).__name__))
    if data.get("version") != VERSION or data.get("kind") != KIND:
        raise SpecpackError(f"{record_path}: unsupported head", expected=f"version {VERSION}, kind {KIND!r}",
                            found=f"version {data.get('version')!r}, kind {data.get('kind')!r}",
                            hint="upgrade specpack, or train the head again")
    for key in ("config", "target", "weights_sha256", "subset_sha256"):
        if key not in data:
            raise SpecpackError(f"{record_path} lacks {key!r}", expected="a complete head record",
                                found=", ".join(sorted(data)))
    digest = sha256_file(path / WEIGHTS_FILE)
    if digest != data["weights_sha256"]:
        raise SpecpackError(f"{path / WEIGHTS_FILE} does not match its record", expected=data["weights_sha256"],
                            found=digest, hint="the head was changed after it was written: train or copy it again")
    return HeadRecord(path, data)


def frozen_parts(target: Any, subset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's input embedding [V, H] and its lm_head rows for `subset` [V_sub, H], as fp32."""
    import torch

    with torch.no_grad():
        embed = target.get_input_embeddings().weight.detach().to(torch.float32)
        lm = target.get_output_embeddings().weight.detach().to(torch.float32)
        return embed, lm[subset]


def build_head(record: HeadRecord, target: Any) -> DraftHead:
    """The trained head in fp32 on the CPU, its frozen parts taken from `target` (whose hash the caller checked)."""
    from safetensors.torch import load_file

    from specpack.heads.model import DraftHead

    tensors = load_file(str(record.weights_file))
    subset = tensors["subset"]
    embed, lm_rows = frozen_parts(target, subset)
    head = DraftHead(record.config, embed, lm_rows, subset)
    missing, unexpected = head.load_state_dict(tensors, strict=False)
    missing = [m for m in missing if m not in FROZEN]
    if missing or unexpected:
        raise SpecpackError(f"{record.weights_file} does not fit its config", expected="the head's tensors",
                            found=f"missing {missing[:4]}, unexpected {unexpected[:4]}", hint="train the head again")
    return head.eval()


def check_target(record: HeadRecord, target_sha256: str, target_source: str) -> None:
    """Refuse a head trained for another target (exit 2 through the CLI's error handler)."""
    if record.target_sha256 != target_sha256:
        trained_for = record.data["target"].get("source", "?")
        raise SpecpackError(f"the draft head {record.path} was trained for another target",
                            expected=f"a head for {target_source} (target weights sha256 {target_sha256})",
                            found=f"a head for {trained_for} (target weights sha256 {record.target_sha256})",
                            hint=f"train a head for this target: specpack distill --target {target_source} -o HEAD")
