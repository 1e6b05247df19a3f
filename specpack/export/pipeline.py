"""spec-export: model sources in, a pack directory out. Stages run in order, each files -> files:

    resolve sources -> read model info -> vocabulary check -> plain graphs (torch, one process each)
      -> draft_step.onnx / verify.onnx (graphs/) -> tokenizer -> manifest (deploy/)

Everything is written into a staging directory beside the output and renamed into place at the end,
so a failed or interrupted export leaves no half-written pack, and --overwrite replaces only a pack
(export/staging.py).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from specpack.deploy.writer import write_pack_manifest
from specpack.export.config import ExportConfig
from specpack.export.model_info import ModelInfo, read_model_info, require_weights
from specpack.export.sources import resolve_source, source_record
from specpack.export.staging import check_destination, publish, run_isolated, staging_dir, stop_on_signals
from specpack.names import DRAFT_STEP_FILE, VERIFY_FILE

T = TypeVar("T")


@stop_on_signals()  # SIGTERM stops the workers and removes the staging directory, as SIGINT does
def export_pack(draft_src: str, target_src: str, out: Path, config: ExportConfig | None = None) -> Path:
    """Export a draft/target pair to a pack at `out`; returns `out`."""
    config = config or ExportConfig()
    out = Path(out)
    check_destination(out, config.overwrite)
    # a GGUF source converts to an fp32 model directory (the 1.5B peaks near 9 GB): each in its own process
    draft_dir, target_dir = (_run_stage(resolve_source, config.isolate, src) for src in (draft_src, target_src))
    for model_dir in (draft_dir, target_dir):
        require_weights(model_dir)
    draft_info, target_info = read_model_info(draft_dir), read_model_info(target_dir)
    from specpack.export.vocab import check_same_vocabulary

    vocab_size = check_same_vocabulary(draft_dir, target_dir, draft_info.vocab_rows, target_info.vocab_rows)
    max_len = config.resolve_max_len(draft_info.max_positions, target_info.max_positions)

    with staging_dir(out) as staging:
        work = staging / "work"
        work.mkdir()
        for role, model_dir, graph_file in (("draft", draft_dir, DRAFT_STEP_FILE), ("target", target_dir, VERIFY_FILE)):
            _log(f"exporting the {role} ({model_dir.name}) ...")
            _run_stage(_export_one, config.isolate, model_dir, work / f"{role}.onnx", staging / graph_file,
                       role, vocab_size, config.dtype)
        shutil.rmtree(work)
        from specpack.export.tokenizer_export import write_tokenizer

        tokenizer = write_tokenizer(target_dir, staging)
        write_pack_manifest(
            staging, config=config, vocab_size=vocab_size, max_len=max_len, tokenizer=tokenizer,
            draft=(source_record(draft_src, draft_dir), draft_info), target=(source_record(target_src, target_dir), target_info),
        )
        publish(staging, out, config.overwrite)
    _log(f"pack written to {out}")
    return out


def _export_one(model_dir: Path, plain: Path, graph_out: Path, role: str, vocab_size: int, dtype: str) -> None:
    """Plain forward graph, then the head on top of it (the plain graph's weights move to the head graph)."""
    from specpack.export.torch_export import export_plain_graph
    from specpack.graphs.attach import build_draft_step_graph, build_verify_graph

    export_plain_graph(model_dir, plain, dtype)
    build = build_draft_step_graph if role == "draft" else build_verify_graph
    build(plain, graph_out, vocab_size)


def _run_stage(fn: Callable[..., T], isolate: bool, *args: object) -> T:
    """Run a stage in a fresh process (its memory is returned when it ends) or in this one."""
    return run_isolated(fn, *args) if isolate else fn(*args)


def _log(message: str) -> None:
    print(f"[spec-export] {message}", file=sys.stderr, flush=True)


__all__ = ["ExportConfig", "ModelInfo", "export_pack"]
