"""TensorRT engines in a pack: where they live, which one a machine may load, and the optimization profiles.

    Platform(gpu, compute_capability, tensorrt_version)   what an engine is built for (and a machine offers)
    engine_dir(platform)       -> "engines/nvidia-h200-sm90-trt10.13.0.35"   (one folder per platform)
    check_buildable(manifest)  the graphs are of a form TensorRT engines are built from (static, standard ops)
    profile_shapes(manifest, role) -> {input: (min, opt, max)}   the one optimization profile of a graph
    select_engine(manifest, role, platform) -> EngineEntry   the listed engine built for this platform, or
                               a SpecpackError saying what was expected, what the pack has, and what to do
    record_engines(pack, manifest, entries) -> Manifest      the manifest rewritten with the new engines
                               (every engine hashed; staged, validated, renamed over: never half written)

Nothing here imports tensorrt: the bookkeeping is the same on a machine without it (and tested there).
Engines are executable code: the runtime loads only engines the manifest lists (the integrity check hashes
them with the other files), and only the one built for its own GPU and TensorRT version.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specpack import names
from specpack.contract.manifest import MANIFEST_FILE, EngineEntry, FileEntry, Manifest, ModelEntry, TensorSpec, parse_manifest
from specpack.errors import SpecpackError
from specpack.hashing import sha256_file

ENGINES_DIR = "engines"
PLAN_SUFFIX = ".plan"
ENGINE_BACKEND = "tensorrt"
Shape = tuple[int, ...]


@dataclass(frozen=True)
class Platform:
    """What an engine is built for: TensorRT plans run only on the GPU model and TensorRT version they were
    built with (no hardware- or version-compatibility flags are set)."""

    gpu: str                    # e.g. "NVIDIA H200", "Orin" (cudaDeviceProp.name)
    compute_capability: str     # "9.0", "8.7"
    tensorrt_version: str       # tensorrt.__version__, e.g. "10.13.0.35"

    def __str__(self) -> str:
        return f"{self.gpu} (compute capability {self.compute_capability}) with TensorRT {self.tensorrt_version}"

    @classmethod
    def of(cls, entry: EngineEntry) -> Platform:
        return cls(entry.gpu, entry.compute_capability, entry.tensorrt_version)


def engine_dir(platform: Platform) -> str:
    """The pack folder of one platform's engines: `engines/<gpu>-sm<cc>-trt<version>`."""
    gpu = re.sub(r"[^a-z0-9]+", "-", platform.gpu.lower()).strip("-") or "gpu"
    return f"{ENGINES_DIR}/{gpu}-sm{platform.compute_capability.replace('.', '')}-trt{platform.tensorrt_version}"


def engine_file(role: str) -> str:
    """The plan file of a model inside its platform's folder."""
    graph = names.DRAFT_STEP_FILE if role == "draft" else names.VERIFY_FILE
    return graph.removesuffix(".onnx") + PLAN_SUFFIX


def check_buildable(manifest: Manifest) -> None:
    """TensorRT engines are built from the static KV cache form with standard ops (docs/tensorrt.md): fixed
    buffer addresses for CUDA graphs, no ONNX Runtime contrib ops (GroupQueryAttention)."""
    for role, model in manifest.models():
        g = model.graph
        if g.kv_cache != "static" or g.attention != "standard":
            raise SpecpackError(f"the {role} graph is not in a form TensorRT engines are built from",
                                expected="kv_cache static, attention standard (default ONNX ops only)",
                                found=f"kv_cache {g.kv_cache}, attention {g.attention}",
                                hint="re-export the pack with `spec-export ... --form tensorrt` (the static cache with "
                                     "standard attention and heads TensorRT's parser takes; a .gguf source also needs "
                                     "--dequantize); TensorRT itself is needed only where the engines are built")


def profile_shapes(manifest: Manifest, role: str) -> dict[str, tuple[Shape, Shape, Shape]]:
    """(min, opt, max) of every input of one graph, by what the runtime binds (names.py):

        input_ids, position_ids   [1, S]       S in 1..max_len (prefill), opt 1 (draft) or k_max + 1 (verify)
        draft_probs               [1, k, V]    k in 0..k_max (0: prefill and plain steps)
        uniforms                  [1, k + 1]
        attention_mask, past_*    fixed        static form: [1, M] and [1, H, M, D], M = max_len
        temperature, top_k, ...   fixed        [1]
    """
    model = _model(manifest, role)
    k_max, max_len = manifest.k_max, manifest.max_len
    s_opt = 1 if role == "draft" else k_max + 1
    ranges: dict[str, tuple[int, int, int]] = {  # the one symbolic axis of each input: (min, opt, max)
        names.INPUT_IDS: (1, s_opt, max_len), names.POSITION_IDS: (1, s_opt, max_len),
        names.DRAFT_PROBS: (0, k_max, k_max), names.UNIFORMS: (1, k_max + 1, k_max + 1),
    }
    out = {}
    for spec in model.graph.inputs:
        dims = [_fixed_dim(spec, axis, d, manifest, ranges) for axis, d in enumerate(spec.shape)]
        out[spec.name] = (tuple(d[0] for d in dims), tuple(d[1] for d in dims), tuple(d[2] for d in dims))
    return out


def _fixed_dim(spec: TensorSpec, axis: int, dim: int | str, manifest: Manifest,
               ranges: dict[str, tuple[int, int, int]]) -> tuple[int, int, int]:
    if isinstance(dim, int):
        return (dim, dim, dim)
    if axis == 0:
        return (1, 1, 1)  # batch: the runtime runs one sequence per engine call
    if spec.name in ranges:
        return ranges[spec.name]
    if spec.name == names.ATTENTION_MASK or spec.name.startswith("past_key_values."):
        return (manifest.max_len,) * 3  # the static form: buffers of the pack's full length
    raise SpecpackError(f"no optimization profile for input {spec.name}", expected="the inputs of names.py",
                        found=f"{spec.name} with shape {spec.shape}", hint="re-export the pack with this specpack")


def _model(manifest: Manifest, role: str) -> ModelEntry:
    return manifest.draft if role == "draft" else manifest.target


def select_engine(manifest: Manifest, role: str, platform: Platform) -> EngineEntry:
    """The engine the manifest lists for `role` built for `platform`; refused clearly otherwise."""
    listed = [e for e in manifest.engines if e.role == role and e.backend == ENGINE_BACKEND]
    for entry in listed:
        if Platform.of(entry) == platform:
            return entry
    build = "build them on this machine: `specpack build PACK --backend tensorrt`"
    if not listed:
        raise SpecpackError(f"the pack has no TensorRT engine for the {role}", expected=f"an engine built for {platform}",
                            found="no engines listed in the manifest", hint=build)
    raise SpecpackError(f"the pack's TensorRT engines for the {role} were built for another GPU or TensorRT version",
                        expected=f"an engine built for {platform}",
                        found="; ".join(f"{e.path}: {Platform.of(e)}" for e in listed),
                        hint=f"{build} (engines run only on the GPU model and TensorRT version they were built with)")


def record_engines(pack_dir: Path, manifest: Manifest, entries: list[EngineEntry]) -> Manifest:
    """The manifest with `entries` added (replacing any listed engine of the same path or the same role and
    platform), every engine hashed into `files`, and "tensorrt" in `backends`; written atomically."""
    replaced = {(e.role, Platform.of(e)) for e in entries}
    new_paths = {e.path for e in entries}
    kept = [e for e in manifest.engines if e.path not in new_paths and (e.role, Platform.of(e)) not in replaced]
    dropped = {e.path for e in manifest.engines} - {e.path for e in kept}
    files = [f for f in manifest.files if f.path not in dropped | new_paths]
    for entry in entries:
        plan = pack_dir / entry.path
        files.append(FileEntry(path=entry.path, sha256=sha256_file(plan), size=plan.stat().st_size))
    backends = manifest.backends if ENGINE_BACKEND in manifest.backends else [*manifest.backends, ENGINE_BACKEND]
    data = manifest.model_dump(mode="json", by_alias=True)
    data.update(engines=[e.model_dump(mode="json") for e in (*kept, *entries)],
                files=[f.model_dump(mode="json") for f in files], backends=backends)
    return write_manifest_atomic(pack_dir, Manifest.model_validate(data))


def write_manifest_atomic(pack_dir: Path, manifest: Manifest) -> Manifest:
    """Validate exactly the bytes to be written, write them beside manifest.json, fsync, rename over it."""
    text = manifest.to_json() + "\n"
    checked = parse_manifest(text.encode(), pack_dir / MANIFEST_FILE)  # the reader takes exactly what is written
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST_FILE}.", dir=pack_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, pack_dir / MANIFEST_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return checked
