"""A pack whose graphs are onnxruntime-genai's model builder graphs with our heads attached (experiment).

    python bench/genai_pack.py SRC_PACK GENAI_TARGET_DIR GENAI_DRAFT_DIR OUT_PACK

SRC_PACK: a static-cache pack of the same pair (its tokenizer, sources and limits are kept); GENAI_*_DIR: the
builder's output folders (`python -m onnxruntime_genai.models.builder -m MODEL -o DIR -p fp16 -e cuda`). The
builder's graph has our plain static contract's names (input_ids, attention_mask [1, M] static mask, past /
present shared buffers, logits) and no position_ids (its GroupQueryAttention applies the rotary from the
sequence lengths); attach.py puts the verify and draft-step heads on it. The builder folders are read, not
changed (their graphs are copied first: attach moves external data).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any


def genai_pack(src: Path, target: Path, draft: Path, out: Path, dtype: str = "fp16") -> Any:
    """-> the pack's Manifest, in memory: the schema requires position_ids, which the builder's graphs do not
    take, so this experiment's manifest is not readable by `specpack.load` (open it with `open_genai_pack`)."""
    import onnx

    from specpack.deploy.manifest import MANIFEST_FILE, FileEntry, Manifest
    from specpack.deploy.writer import graph_entry
    from specpack.export.graph_form import GraphForm
    from specpack.graphs.attach import build_draft_step_graph, build_verify_graph
    from specpack.hashing import sha256_file
    from specpack.names import DRAFT_STEP_FILE, VERIFY_FILE

    manifest = Manifest.read(src)
    # the builder writes ONNX Runtime's SimplifiedLayerNormalization in the default domain, which onnx's checker
    # does not know: attach's final check is skipped for these graphs (ONNX Runtime loads them)
    onnx.checker.check_model = lambda *args, **kwargs: None
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("verify.onnx*", "draft_step.onnx*", MANIFEST_FILE, ".*"))
    for builder_dir, build, graph_file in ((target, build_verify_graph, VERIFY_FILE),
                                           (draft, build_draft_step_graph, DRAFT_STEP_FILE)):
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            for f in builder_dir.iterdir():
                if f.name.startswith("model.onnx"):
                    shutil.copy(f, Path(tmp) / f.name)
            build(Path(tmp) / "model.onnx", out / graph_file, manifest.vocab_size)
    form = GraphForm("static", "gqa")
    files = [FileEntry(path=p.relative_to(out).as_posix(), sha256=sha256_file(p), size=p.stat().st_size)
             for p in sorted(out.rglob("*")) if p.is_file() and p.name != MANIFEST_FILE and not p.name.startswith(".")]
    new = manifest.model_copy(update={
        "target": manifest.target.model_copy(update={"graph": graph_entry(out, VERIFY_FILE, form), "dtype": dtype}),
        "draft_model": manifest.draft.model_copy(update={"graph": graph_entry(out, DRAFT_STEP_FILE, form),
                                                         "dtype": dtype}),
        "files": files})
    new.write(out)
    return new


def open_genai_pack(path: Path, manifest: Any, cuda_graphs: bool = True, device: str = "cuda") -> Any:
    from specpack.runtime.backend import BackendOptions
    from specpack.runtime.backends.cuda import CudaBackend
    from specpack.runtime.pack import Pack
    from specpack.runtime.tokenizer import PackTokenizer

    backend = CudaBackend(path, manifest, BackendOptions(), device=device, cuda_graphs=cuda_graphs)
    return Pack(path, manifest, PackTokenizer.load(path / "tokenizer"), backend)


if __name__ == "__main__":
    genai_pack(*(Path(a) for a in sys.argv[1:5]))
