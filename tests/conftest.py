"""Shared session fixtures: tiny random model pairs (tests/tiny.py) and their plain ONNX exports, built once.

    tiny_pairs(family, draft="small", head_dim=12, max_positions=256, pad_rows=0) -> (draft_dir, target_dir)
    tiny_plain_graph(family, role="target", dtype="fp32", kv_cache="concat", attention="standard",
                     **pair options)                                           -> plain .onnx path (export/)
    tiny_pack(family, draft="small", k=8, max_len=None, **pair options)        -> (pack_dir, draft_dir, target_dir)
    tiny_ngram_pack(family, k=8, **pair options)                               -> (pack_dir, target_dir): no draft model
    tiny_export(family, draft="small" | None, pair options, **ExportConfig)     -> pack_dir of any export configuration
    tiny_head(family="qwen2", steps=120)                                        -> (head_dir, target_dir): distilled
    tiny_head_pack(family="qwen2")                                              -> (pack_dir, head_dir, target_dir)
    shared_plain_exports()        a context: export_pack (isolate=False) takes each plain graph from the build cache

Every build goes through `tiny_store` (tests/tiny_cache.py): built once per version of the code, under a file
lock, so the test workers (pytest-xdist) share each build and a later run on the same code builds nothing.
A model's plain graph (torch's export: most of a tiny pack's build time) is itself one build, keyed by the model
directory's contents and the export's arguments, so the packs of one pair that differ in k, max_len, quantization
or fidelity export each model once (tests/tiny_cache.py, `plain_graph`; torch's export writes the same bytes
every time).
torch and transformers are imported inside the fixtures only.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from tests.tiny_cache import BuildCache, plain_graph
from tests.tiny_heads import TINY_HEAD_SETTINGS, tiny_head_corpus

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:  # `import tiny` from any test: pytest puts the rootdir, not tests/, on sys.path
    sys.path.insert(0, _TESTS)

PairFactory = Callable[..., tuple[Path, Path]]
SharedPlainExports = Callable[[], AbstractContextManager[None]]
PAIR_DEFAULTS = {"head_dim": 12, "max_positions": 256, "pad_rows": 0}  # tiny_pairs' (a build's key names them all)


SLOW_DEADLINE_ENV = "SPECPACK_SLOW_DEADLINE"  # epoch seconds: slow tests not started by then are skipped (.ci/run)
SLOW_SEED_ENV = "SPECPACK_SLOW_SEED"  # any string: the slow tests run in an order shuffled by it (.ci/run: the commit)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With SPECPACK_SLOW_SEED, the slow tests go last in an order shuffled by the seed, so that CI runs, each
    cut short by its deadline, cover different parts of the slow set (every xdist worker shuffles alike)."""
    seed = os.environ.get(SLOW_SEED_ENV)
    if seed is None:
        return
    import random

    slow = [item for item in items if item.get_closest_marker("slow")]
    random.Random(seed).shuffle(slow)
    items[:] = [item for item in items if not item.get_closest_marker("slow")] + slow


def pytest_runtest_setup(item: pytest.Item) -> None:
    deadline = os.environ.get(SLOW_DEADLINE_ENV)
    if deadline and item.get_closest_marker("slow") and time.time() > float(deadline):
        pytest.skip(f"the slow set's time budget ({SLOW_DEADLINE_ENV}) is spent; `make test-all` runs it whole")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker on a core of its own (torch and the runtime's ONNX Runtime pools follow
    the affinity: specpack/runtime/ort_session.py), so that workers never spin threads on each other's core."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if worker is not None and 1 < count <= len(cpus):
        os.sched_setaffinity(0, {cpus[int(worker.removeprefix("gw")) % len(cpus)]})


@pytest.fixture(scope="session")
def tiny_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> BuildCache:
    """Where tiny builds live: the pytest cache (`pytest --cache-clear` empties it), else beside the temp dirs."""
    cache = getattr(request.config, "cache", None)
    root = cache.mkdir("specpack-tiny") if cache is not None else tmp_path_factory.getbasetemp().parent / "specpack-tiny"
    return BuildCache(Path(root))


@pytest.fixture(scope="session")
def tiny_pairs(tiny_store: BuildCache) -> PairFactory:
    """A factory of tiny (draft_dir, target_dir) pairs, one build per distinct argument set."""

    def make(family: str, draft: str = "small", **options: int) -> tuple[Path, Path]:
        import tiny

        o = {**PAIR_DEFAULTS, **options}  # head_dim, max_positions, pad_rows

        def build(root: Path) -> None:
            tiny.make_pair(family, root, draft, **o)  # type: ignore[arg-type]

        root = tiny_store.get(("pair", family, draft, o["head_dim"], o["max_positions"], o["pad_rows"]), build)
        return root / f"{family}-draft-{draft}", root / f"{family}-target"

    return make


@pytest.fixture(scope="session")
def shared_plain_exports(tiny_store: BuildCache) -> SharedPlainExports:
    """A context in which export_pack (isolate=False) copies each model's plain graph from `plain_graph`'s entry
    instead of exporting it again: every other stage runs as it does. torch's export writes the same bytes for the
    same model and arguments, so the pack is the one a fresh export writes."""

    @contextmanager
    def shared() -> Iterator[None]:
        from specpack.export import pipeline

        def export(model_dir: Path, plain: Path, dtype: str, form: object, taps: tuple[int, ...] = (),
                   tree_nodes: int = 0, draft_tree: bool = False) -> None:
            entry = plain_graph(tiny_store, model_dir, plain.name, dtype, form, taps, tree_nodes, draft_tree)
            for path in entry.iterdir():
                shutil.copyfile(path, plain.parent / path.name)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(pipeline, "_export_plain", export)
            yield

    return shared


@pytest.fixture(scope="session")
def tiny_plain_graph(tiny_pairs: PairFactory, tiny_store: BuildCache) -> Callable[..., Path]:
    """A factory of exported plain graphs of tiny models: (family, role="target"|"draft", dtype, kv_cache,
    attention, **pair) -> .onnx."""

    def make(family: str, role: str = "target", dtype: str = "fp32", kv_cache: str = "concat",
             attention: str = "standard", **pair: int | str) -> Path:
        from specpack.export.graph_form import GraphForm

        requested = str(pair.pop("draft", "small"))
        draft = "small" if role == "target" else requested  # every draft kind's pair has the same target (tiny.py)
        options = {**PAIR_DEFAULTS, **pair}
        draft_dir, target_dir = tiny_pairs(family, draft, **options)
        model_dir = target_dir if role == "target" else draft_dir
        return plain_graph(tiny_store, model_dir, f"{role}.onnx", dtype, GraphForm(kv_cache, attention)) / f"{role}.onnx"

    return make


@pytest.fixture(scope="session")
def tiny_batched_plain(tiny_pairs: PairFactory, tiny_store: BuildCache) -> Callable[..., Path]:
    """(family, draft kind, role) -> that tiny model in the batched static form (export/batched_export.py), fp32,
    built once; tests attach a head to a copy (attach moves the weights)."""

    def make(family: str, draft: str = "small", role: str = "target") -> Path:
        from specpack.export.batched_export import export_batched_graph

        draft_dir, target_dir = tiny_pairs(family, draft)

        def build(root: Path) -> None:
            export_batched_graph(target_dir if role == "target" else draft_dir, root / f"{role}.onnx")

        return tiny_store.get(("batched-plain", family, draft if role == "draft" else "small", role), build) / \
            f"{role}.onnx"

    return make


@pytest.fixture(scope="session")
def tiny_export(tiny_pairs: PairFactory, tiny_store: BuildCache, shared_plain_exports: SharedPlainExports
                ) -> Callable[..., Path]:
    """(family, draft="small" | None, pair options, **ExportConfig fields) -> a pack of that tiny pair exported
    with that configuration (draft None: the target alone), built once; tests copy it before they change it."""

    def make(family: str, draft: str | None = "small", pair: dict[str, int] | None = None,
             **config: object) -> Path:
        from specpack.export.pipeline import ExportConfig, export_pack

        options = {**PAIR_DEFAULTS, **(pair or {})}
        draft_dir, target_dir = tiny_pairs(family, draft or "small", **options)

        export_config = ExportConfig(isolate=False, **config)  # type: ignore[arg-type]  # its defaults applied

        def build(root: Path) -> None:
            with shared_plain_exports():
                export_pack(None if draft is None else str(draft_dir), str(target_dir), root / "pack", export_config)

        key = ("pack", family, draft, *sorted(options.items()), export_config)
        return tiny_store.get(key, build) / "pack"

    return make


@pytest.fixture(scope="session")
def tiny_pack(tiny_pairs: PairFactory, tiny_export: Callable[..., Path]) -> Callable[..., tuple[Path, Path, Path]]:
    """(family, draft="small", k=8, max_len=None, kv_cache="concat", attention="auto", **pair)
    -> (pack_dir, draft_dir, target_dir)."""

    def make(family: str, draft: str = "small", k: int = 8, max_len: int | None = None, kv_cache: str = "concat",
             attention: str = "auto", **pair: int) -> tuple[Path, Path, Path]:
        pack = tiny_export(family, draft, pair, k=k, max_len=max_len, kv_cache=kv_cache, attention=attention)
        return (pack, *tiny_pairs(family, draft, **pair))

    return make


@pytest.fixture(scope="session")
def trt_pack(tiny_export: Callable[..., Path]) -> Path:
    """A tiny qwen2 pack in the form TensorRT engines are built from (static KV cache, standard ops), k 4,
    max_len 64; tests copy it before they add engines (tests/deploy/test_trt_build.py)."""
    return tiny_export("qwen2", "small", k=4, max_len=64, kv_cache="static", attention="standard")


@pytest.fixture(scope="session")
def tiny_ngram_pack(tiny_pairs: PairFactory, tiny_export: Callable[..., Path]) -> Callable[..., tuple[Path, Path]]:
    """(family, k=8, **pair) -> (pack_dir, target_dir): a pack exported with --drafter ngram (the target alone)."""

    def make(family: str, k: int = 8, **pair: int) -> tuple[Path, Path]:
        return tiny_export(family, None, pair, k=k, drafter="ngram"), tiny_pairs(family, **pair)[1]

    return make




@pytest.fixture(scope="session")
def tiny_head(tiny_pairs: PairFactory, tiny_store: BuildCache) -> Callable[..., tuple[Path, Path]]:
    """(family="qwen2", steps=120, **pair) -> (head_dir, target_dir): a head distilled from the tiny target on
    tiny_head_corpus, on the CPU (about 5 s); pair: tiny_pairs' options (e.g. head_dim=16 for GroupQueryAttention)."""

    def make(family: str = "qwen2", steps: int = 120, **pair: int) -> tuple[Path, Path]:
        from specpack.distill.config import DistillConfig
        from specpack.distill.trainer import distill

        target = tiny_pairs(family, **pair)[1]

        def build(root: Path) -> None:
            data = tiny_head_corpus(root / "corpus.txt")
            distill(str(target), root / "head", DistillConfig(steps=steps, data=(str(data),), **TINY_HEAD_SETTINGS))

        key = ("head", family, steps, *sorted(TINY_HEAD_SETTINGS.items()), *sorted(pair.items()))
        return tiny_store.get(key, build) / "head", target

    return make


@pytest.fixture(scope="session")
def tiny_head_pack(tiny_head: Callable[..., tuple[Path, Path]], tiny_store: BuildCache
                   ) -> Callable[..., tuple[Path, Path, Path]]:
    """(family="qwen2", kv_cache="concat") -> (pack_dir, head_dir, target_dir): `spec-export --target T --draft-head
    HEAD` (k 4) in that KV form (static: the head reads the target's features cache; the cuda backend's form)."""

    def make(family: str = "qwen2", kv_cache: str = "concat", head_dim: int | None = None, **form: str
             ) -> tuple[Path, Path, Path]:
        """form: more ExportConfig fields (e.g. dtype="fp16", attention="gqa": the GPU's form); head_dim: the tiny
        pair's (16 for the model builder's GroupQueryAttention)."""
        from specpack.export.pipeline import ExportConfig, export_pack

        head, target = tiny_head(family, **({} if head_dim is None else {"head_dim": head_dim}))

        def build(root: Path) -> None:
            export_pack(None, str(target), root / "pack", ExportConfig(isolate=False, k=4, draft_head=str(head),
                                                                       kv_cache=kv_cache, **form))  # type: ignore[arg-type]

        key = ("head_pack", family, str(head), kv_cache, *sorted(form.items()))
        return tiny_store.get(key, build) / "pack", head, target

    return make
