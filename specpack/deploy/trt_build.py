"""`specpack build PACK --backend tensorrt`: TensorRT engines from a pack's graphs, recorded in its manifest.

    build_pack_engines(pack, BuildOptions)
      1. read the manifest; TensorRT and the GPU present (before anything is said of the pack's form); check every
         file against the manifest (never build from altered graphs)
      2. check_buildable: static KV cache, standard ops (contract/engines.py)
      3. plan_build: per model, strongly typed (Q/DQ or fp16/bf16 graphs: the graph's types rule) or weakly
         typed with the --precision flag (fp32 graphs), refused where the GPU lacks the precision
      4. build_engine per model (TensorRT Python API: ONNX parser, one optimization profile over S, k and the
         cache length) into a staging folder beside engines/<platform>/, renamed into place
      5. record_engines: sha256, GPU, compute capability, TensorRT version into the manifest (atomic rewrite)

The TensorRT calls (build_engine, and the platform query) have never run on this project's machines (no
TensorRT here: docs/tensorrt.md); steps 1-3 and 5 run in CI with a fake builder (tests/deploy/test_trt_build.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specpack.contract.engines import (
    ENGINE_BACKEND,
    Platform,
    Shape,
    check_buildable,
    engine_dir,
    engine_file,
    profile_shapes,
    record_engines,
)
from specpack.contract.manifest import EngineEntry, Manifest, ModelEntry
from specpack.errors import SpecpackError

PRECISIONS = ("fp16", "bf16", "int8", "fp8")
DEFAULT_PRECISION = "fp16"
DEFAULT_WORKSPACE_GB = 4
QDQ_METHODS = {"int8-sq": "int8", "fp8": "fp8"}  # quantization method of a Q/DQ graph -> its engine precision
MIN_CC = {"bf16": (8, 0), "fp8": (8, 9), "int8": (6, 1), "fp16": (5, 3)}  # compute capability each precision needs
Profile = dict[str, tuple[Shape, Shape, Shape]]


@dataclass(frozen=True)
class BuildOptions:
    precision: str = DEFAULT_PRECISION   # fp16 | bf16: the flag for fp32 graphs; int8 | fp8: the pack's Q/DQ graphs
    workspace_gb: int = DEFAULT_WORKSPACE_GB

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise SpecpackError("invalid --precision", expected=" | ".join(PRECISIONS), found=repr(self.precision))
        if isinstance(self.workspace_gb, bool) or not isinstance(self.workspace_gb, int) or not 1 <= self.workspace_gb <= 1024:
            raise SpecpackError("invalid --workspace-gb", expected="an integer in 1..1024 (GiB of builder workspace)",
                                found=repr(self.workspace_gb))


@dataclass(frozen=True)
class ModelBuild:
    """How one model's engine is built."""

    role: str
    graph: str               # the pack's .onnx file
    strongly_typed: bool     # the graph's own types decide (Q/DQ, fp16 / bf16 graphs); no precision flags
    flag: str | None         # "fp16" | "bf16": the builder flag of a weakly typed build (fp32 graph)
    precision: str           # what the manifest records: "fp32", "fp16", "bf16", "int8", "fp8"


def plan_build(manifest: Manifest, options: BuildOptions, platform: Platform) -> list[ModelBuild]:
    """Each model's build, or a SpecpackError when the pack or the GPU cannot give the asked precision."""
    _check_capability(options.precision, platform)
    builds = [_model_build(role, model, options.precision) for role, model in manifest.models()]
    if options.precision in ("int8", "fp8") and not any(b.precision == options.precision for b in builds):
        method = next(m for m, p in QDQ_METHODS.items() if p == options.precision)
        found = ", ".join(f"{role} {m.quantization.method if m.quantization else 'none'}" for role, m in manifest.models())
        raise SpecpackError(f"--precision {options.precision} needs {options.precision.upper()} Q/DQ graphs in the pack",
                            expected=f"a model quantized with {method} (explicit quantization: TensorRT takes the "
                                     "scales from the graph's Q/DQ nodes)", found=f"quantization: {found}",
                            hint=f"re-export with `spec-export ... --quantize-draft {method} --calib-prompts FILE`, "
                                 "or build with --precision fp16")
    for build in builds:
        if build.precision in MIN_CC:
            _check_capability(build.precision, platform)
    return builds


def _model_build(role: str, model: ModelEntry, precision: str) -> ModelBuild:
    method = model.quantization.method if model.quantization is not None else "none"
    if method in QDQ_METHODS:
        return ModelBuild(role, model.graph.path, strongly_typed=True, flag=None, precision=QDQ_METHODS[method])
    if method != "none":
        raise SpecpackError(f"the {role} graph is quantized for ONNX Runtime", expected="float or Q/DQ graphs "
                            "(int8-sq, fp8)", found=f"quantization {method} (com.microsoft.MatMulNBits: not a TensorRT op)",
                            hint="re-export without --quantize-* int4/int8/gguf (or with int8-sq / fp8)")
    if model.dtype != "fp32":
        return ModelBuild(role, model.graph.path, strongly_typed=True, flag=None, precision=model.dtype)
    flag = precision if precision in ("fp16", "bf16") else "fp16"  # int8 / fp8 builds: float models in fp16
    return ModelBuild(role, model.graph.path, strongly_typed=False, flag=flag, precision=flag)


def _check_capability(precision: str, platform: Platform) -> None:
    need = MIN_CC[precision]
    major, minor = (int(x) for x in platform.compute_capability.split("."))
    if (major, minor) < need:
        raise SpecpackError(f"{platform.gpu} has no {precision.upper()} support in TensorRT",
                            expected=f"compute capability {need[0]}.{need[1]} or higher for {precision}",
                            found=f"compute capability {platform.compute_capability}",
                            hint="build with --precision fp16" + (" (or int8 with int8-sq graphs)" if precision == "fp8" else ""))


Builder = Callable[[Path, Path, Profile, ModelBuild, int], None]  # (graph, plan out, profile, build, workspace GiB)


def build_pack_engines(pack: Path, options: BuildOptions, *, platform: Platform | None = None,
                       builder: Builder | None = None) -> list[EngineEntry]:
    """Build and record one engine per model for this machine (or `platform`, with `builder`: tests)."""
    from specpack.contract.integrity import verify_pack
    from specpack.contract.manifest import Manifest
    from specpack.export.staging import staging_dir

    pack = Path(pack)
    manifest = Manifest.read(pack)
    if platform is None or builder is None:  # this machine: TensorRT and a GPU first, before the pack's form is judged
        from specpack.runtime.cuda_rt import Cuda
        from specpack.runtime.trt_env import current_platform, require_tensorrt

        require_tensorrt()  # a user without TensorRT learns that before being told to re-export the pack
        platform, builder = current_platform(Cuda.load()), build_engine
    verify_pack(pack, manifest)
    check_buildable(manifest)
    builds = plan_build(manifest, options, platform)
    folder = pack / engine_dir(platform)
    with staging_dir(folder) as staging:
        entries = []
        for b in builds:
            builder(pack / b.graph, staging / engine_file(b.role), profile_shapes(manifest, b.role), b, options.workspace_gb)
            entries.append(EngineEntry.model_validate({
                "path": f"{engine_dir(platform)}/{engine_file(b.role)}", "role": b.role, "backend": ENGINE_BACKEND,
                "gpu": platform.gpu, "compute_capability": platform.compute_capability,
                "tensorrt_version": platform.tensorrt_version, "precision": b.precision}))
        _replace_folder(staging, folder)
    record_engines(pack, manifest, entries)
    return entries


def _replace_folder(staging: Path, folder: Path) -> None:
    """Rename `staging` to `folder`; an existing folder (older engines of this platform) is replaced."""
    if folder.exists() or folder.is_symlink():
        old = folder.with_name(f".{folder.name}.old-{staging.name.rsplit('-', 1)[-1]}")
        folder.rename(old)
        staging.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(folder)


def build_engine(graph: Path, plan: Path, profile: Profile, build: ModelBuild, workspace_gb: int) -> None:
    """One engine through TensorRT's Python API (never run here: no TensorRT on this project's machines).

        ONNX graph --OnnxParser.parse_from_file--> network (strongly typed for Q/DQ / fp16 graphs)
                   --builder config: workspace pool, precision flag, one optimization profile--> serialized plan
    """
    from specpack.runtime.trt_env import require_tensorrt

    require_tensorrt()
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if build.strongly_typed else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(graph)):  # external data is read relative to the graph
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise SpecpackError(f"TensorRT's ONNX parser refused {graph.name}", expected="a graph of ops TensorRT supports",
                            found="; ".join(errors[:5]) or "no error text",
                            hint="export the TensorRT form of the graphs (docs/tensorrt.md)")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_gb << 30)
    if build.flag is not None:
        config.set_flag(trt.BuilderFlag.FP16 if build.flag == "fp16" else trt.BuilderFlag.BF16)
    profile_ = builder.create_optimization_profile()
    for name, (low, opt, high) in profile.items():
        profile_.set_shape(name, trt.Dims(list(low)), trt.Dims(list(opt)), trt.Dims(list(high)))
    config.add_optimization_profile(profile_)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise SpecpackError(f"TensorRT could not build an engine from {graph.name}", expected="a built engine",
                            found="build_serialized_network returned None (the log above says why)",
                            hint=f"try a larger --workspace-gb than {workspace_gb}, or --precision fp16")
    plan.write_bytes(bytes(serialized))
