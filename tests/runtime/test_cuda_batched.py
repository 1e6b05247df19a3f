"""The cuda backend's batched engines on the CPU EP (device="cpu"; backends/cuda_batched.py): the pack's batched graphs
with their caches in device buffers [slots, H, M, D], a run over slots [lo, hi) bound by pointer offset, under the
scheduler (Pack.start_batching picks them up through CudaBackend.batched_engines, as the cpu backend's).

- Six requests on four rows (seeded sampling at four settings, two greedy; model and n-gram drafters; k 0 to 4): the
  same tokens as the cpu backend's batched engines (HostCaches, the same graphs) and as each request alone on the
  pack's per-slot graphs, with most verify steps one run over all four rows, greedy rows drafting together.
- The binding: a range of slots is the buffer at lo * stride, shaped [hi - lo, ...].
- (slow) spec-export --dtype fp16 --max-batch 4: recorded with fp16 caches; on the CPU EP four greedy requests decoded
  together through its batched graphs give the tokens each gets alone through its batch-1 graphs.

The pack of the first: test_element_scatter's static standard-attention pack of the pair, with the batched graphs of
the same pair (tiny_batched_plain, as test_batched_sampling uses) attached into a copy and recorded in its manifest, as
spec-export --max-batch writes them (no export here: about 2 s of attaching). The CUDA run itself:
tests/gpu/test_cuda_batched_gpu.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from specpack import names
from specpack.contract.manifest import Manifest
from specpack.errors import SpecpackError
from specpack.export.graph_form import GraphForm
from specpack.export.writer import graph_entry
from specpack.graphs.attach import build_batched_greedy_graph, build_batched_verify_graph
from specpack.hashing import sha256_file
from specpack.runtime.backend import BackendOptions
from specpack.runtime.backends.cpu import OrtBackend
from specpack.runtime.backends.cuda import CudaBackend
from specpack.runtime.backends.cuda_batched import DeviceCaches
from specpack.runtime.batch_k import NoCap
from specpack.runtime.batched_caches import KVLayout
from specpack.runtime.batched_verify import BatchedTarget
from specpack.runtime.pack import Pack
from specpack.runtime.request import GenerateRequest
from specpack.runtime.tokenizer import PackTokenizer

FAMILY, DRAFT, SLOTS = "qwen2", "noisy", 4


def attach_batched(pack: Path, plain: dict[str, Path], max_batch: int) -> Manifest:
    """The batched graphs (plain: role -> its batched plain graph) attached into `pack`; its manifest with them (their
    `batched` records and files, validated as spec-export's)."""
    data = Manifest.read(pack).model_dump(mode="json", by_alias=True)
    work = pack.parent / "work"
    for role, head, build in (("target", "verify", build_batched_verify_graph),
                              ("draft", "greedy", build_batched_greedy_graph)):
        (work / role).mkdir(parents=True)
        for path in plain[role].parent.iterdir():  # attach moves the weights: a copy
            if path.name.startswith(plain[role].name):
                shutil.copy(path, work / role / path.name)
        graph_file = names.BATCHED_FILES[role]
        build(work / role / plain[role].name, pack / graph_file, data["vocab_size"])
        graph = graph_entry(pack, graph_file, GraphForm("static", "standard", "onnxruntime"))
        data[role]["batched"] = {"max_batch": max_batch, "head": head, "graph": graph.model_dump(mode="json"),
                                 "inputs": [names.DRAFT_COUNTS, names.TOKEN_COUNTS] if head == "verify" else []}
        data["files"] += [{"path": f, "sha256": sha256_file(pack / f), "size": (pack / f).stat().st_size}
                          for f in (graph.path, *graph.data_files)]
    shutil.rmtree(work)
    return Manifest.model_validate(data)


@pytest.fixture(scope="module")
def batched_pack(tiny_pack, tiny_batched_plain, tmp_path_factory: pytest.TempPathFactory  # type: ignore[no-untyped-def]
                 ) -> tuple[Path, Manifest]:
    source = tiny_pack(FAMILY, DRAFT, kv_cache="static", attention="standard", k=4)[0]  # test_element_scatter's
    pack = tmp_path_factory.mktemp("cuda-batched") / "pack"
    shutil.copytree(source, pack)
    plain = {"target": tiny_batched_plain(FAMILY), "draft": tiny_batched_plain(FAMILY, DRAFT, "draft")}
    return pack, attach_batched(pack, plain, SLOTS)


def open_pack(pack: Path, m: Manifest, backend: Callable[..., object], slots: int = SLOTS, **kw: object) -> Pack:
    b = backend(pack, m, BackendOptions(slots=slots, threads=1), **kw)
    return Pack(pack, m, PackTokenizer.load(pack / "tokenizer"), b, slots=slots)  # type: ignore[arg-type]


def requests(vocab: int) -> list[GenerateRequest]:
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, vocab - 8, 8 + 3 * i).tolist() for i in range(6)]
    kinds: list[dict[str, object]] = [
        {"k": 2, "temperature": 1.0, "seed": 1}, {"k": 4, "temperature": 0.7, "top_k": 20, "seed": 2},
        {"k": 3}, {"k": 3, "drafter": "ngram", "temperature": 1.2, "top_p": 0.9, "seed": 3},
        {"k": 0, "temperature": 1.0, "seed": 4}, {"k": 2}]  # the greedy ones draft through the batched greedy draft
    return [GenerateRequest.of(p, 16, **kind) for p, kind in zip(prompts, kinds, strict=True)]  # type: ignore[arg-type]


def batched_tokens(pack: Pack, reqs: list[GenerateRequest]) -> tuple[list[list[int]], BatchedTarget]:
    batcher = pack.start_batching(batch_policy=NoCap(), solo=False)
    target = batcher.scheduler.verifier
    assert isinstance(target, BatchedTarget) and batcher.scheduler.row_drafter is not None
    tokens = [h.result(timeout=120).tokens for h in [pack.submit(r) for r in reqs]]
    return tokens, target


def test_device_batched_engines_give_the_cpu_engines_tokens(batched_pack: tuple[Path, Manifest]) -> None:
    pack_dir, m = batched_pack
    reqs = requests(m.vocab_size)
    alone = open_pack(pack_dir, m, OrtBackend, slots=1)
    lone = [alone.generate_request(r).tokens for r in reqs]
    with open_pack(pack_dir, m, OrtBackend) as host:
        on_host, _ = batched_tokens(host, reqs)
    with open_pack(pack_dir, m, CudaBackend, device="cpu", precapture=False) as device:
        on_device, target = batched_tokens(device, reqs)
        assert isinstance(target.caches, DeviceCaches)
        draft = device._batcher.scheduler.row_drafter  # type: ignore[union-attr]
        assert isinstance(draft.engine.caches, DeviceCaches)  # type: ignore[union-attr]
        drafted_together = max(draft.engine.runs)  # type: ignore[union-attr]
    assert on_device == on_host
    assert on_device == lone
    assert drafted_together >= 2  # greedy rows' drafts in one run
    assert target.runs.count(SLOTS) > len(target.runs) // 3  # the rows verified together


def test_a_range_of_slots_is_bound_at_its_offset() -> None:
    layout = KVLayout(num_layers=1, kv_heads=2, head_dim=3, width=5, slots=4, dtype=np.dtype(np.float16))

    session = SimpleNamespace(session=SimpleNamespace(io_binding=lambda: None), input_names=set(),  # a DeviceSession's
                              capture=False)
    caches = DeviceCaches(session, layout, "cpu")  # type: ignore[arg-type]
    past, present = caches.rows(1, 3)
    base = caches._buffers[0].ptr
    for views in (past, present):
        view = views[names.kv_names(1, "past" if views is past else "present")[0]]
        assert view.shape == (2, 2, 5, 3) and view.ptr == base + 1 * 2 * 5 * 3 * 2  # type: ignore[union-attr]


def test_max_batch_past_the_export_is_refused(batched_pack: tuple[Path, Manifest]) -> None:
    pack_dir, m = batched_pack
    backend = CudaBackend(pack_dir, m, BackendOptions(slots=SLOTS + 1, threads=1), device="cpu", precapture=False)
    with pytest.raises(SpecpackError, match="exported for"):
        backend.batched_engines(SLOTS + 1)


# ------------------------------------------------------------------------------------- fp16 (spec-export, slow)


@pytest.fixture(scope="module")
def fp16_pack(tiny_export) -> Path:  # type: ignore[no-untyped-def]
    """spec-export --dtype fp16 --kv-cache static --attention standard --max-batch 4 (the GPU's batched pack)."""
    return tiny_export(FAMILY, DRAFT, k=4, dtype="fp16", kv_cache="static", attention="standard", max_batch=SLOTS)


@pytest.mark.slow  # a pack export with --max-batch (~40 s on 2 cores)
def test_an_fp16_batched_export_greedy_equals_its_batch1_graphs(fp16_pack: Path) -> None:
    """The fp16 batched graphs are recorded (caches in fp16), and on the CPU EP (ONNX Runtime casts fp16 MatMuls
    around fp32 ones there) four greedy requests decoded together through them (the cuda backend's batched engines)
    give the tokens each gives alone through the fp16 batch-1 graphs."""
    m = Manifest.read(fp16_pack)
    for entry in (m.target, m.draft):
        assert entry.dtype == "fp16" and entry.batched is not None and entry.batched.max_batch == SLOTS
        caches = [s for s in [*entry.batched.graph.inputs, *entry.batched.graph.outputs]
                  if s.name.startswith(("past_key_values.", "present."))]
        assert len(caches) == 4 * entry.num_layers and {s.dtype for s in caches} == {"float16"}
    rng = np.random.default_rng(7)
    reqs = [GenerateRequest.of(rng.integers(0, m.vocab_size - 8, 6 + 4 * i).tolist(), 20, k=k)
            for i, k in enumerate((0, 2, 4, None))]
    alone = open_pack(fp16_pack, m, CudaBackend, slots=1, device="cpu", precapture=False)
    lone = [alone.generate_request(r).tokens for r in reqs]
    with open_pack(fp16_pack, m, CudaBackend, device="cpu", precapture=False) as device:
        tokens, target = batched_tokens(device, reqs)
    assert tokens == lone
    assert target.runs.count(SLOTS) > len(target.runs) // 3


def test_the_manifest_checks_the_batched_caches_dtype(batched_pack: tuple[Path, Manifest]) -> None:
    """A batched graph's past / present are the model's dtype (the runtime allocates its caches so)."""
    from pydantic import ValidationError

    data = batched_pack[1].model_dump(mode="json", by_alias=True)
    for spec in data["target"]["batched"]["graph"]["inputs"]:
        if spec["name"].startswith("past_key_values."):
            spec["dtype"] = "float16"
    with pytest.raises(ValidationError, match="while dtype fp32 needs float32"):
        Manifest.model_validate(data)


def test_only_slot_0_is_precaptured_where_batched_graphs_take_the_rows(batched_pack: tuple[Path, Manifest],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded for several rows, a pack with batched graphs runs the per-slot shapes at load on slot 0 alone (the lone
    request's; the batched engines decode a batch's rows); without batched graphs, on every slot."""
    from specpack.runtime.backends import cuda

    pack_dir, m = batched_pack
    verified: list[int] = []
    verify = cuda.DeviceTarget.verify
    monkeypatch.setattr(cuda.DeviceTarget, "verify", lambda self, run: verified.append(run.state.slot) or verify(self, run))
    unbatched = m.model_copy(update={"target": m.target.model_copy(update={"batched": None})})
    for manifest, want in ((m, {0}), (unbatched, {0, 1})):
        verified.clear()
        backend = CudaBackend(pack_dir, manifest, BackendOptions(slots=2, threads=1), device="cpu", precapture=True)
        assert backend.precapture_slots == len(want) and set(verified) == want, (sorted(set(verified)), want)
        backend.close()


def test_a_greedy_batch_binds_no_draft_probs_of_its_own(batched_pack: tuple[Path, Manifest]) -> None:
    """draft_probs [B, K, V] fp32 is read only by sampling rows: a run without one binds the caches' `ignored` zeros
    (on a GPU nothing copied in; 155 MB a step at 64 rows and K 4), a run with one the host rows; the tokens are the
    cpu backend's either way (test above)."""
    pack_dir, m = batched_pack
    reqs = requests(m.vocab_size)
    with open_pack(pack_dir, m, CudaBackend, device="cpu", precapture=False) as device:
        batcher = device.start_batching(batch_policy=NoCap(), solo=False)
        target = batcher.scheduler.verifier
        assert isinstance(target, BatchedTarget) and isinstance(target.caches, DeviceCaches)
        bound: list[tuple[bool, bool]] = []  # (a sampling row in the run, draft_probs is the ignored buffer's view)
        real_run, caches = target.caches.run, target.caches

        def spy(inputs, outputs, **how):  # type: ignore[no-untyped-def]
            q = inputs[names.DRAFT_PROBS]
            sampling = bool((inputs[names.TEMPERATURE] > 0).any())
            ignored = caches._ignored is not None and getattr(q, "ptr", None) == caches._ignored.ptr
            bound.append((sampling, ignored))
            real_run(inputs, outputs, **how)

        caches.run = spy  # type: ignore[method-assign]
        for h in [device.submit(r) for r in reqs]:
            h.result(timeout=120)
    assert (False, True) in bound and (True, False) in bound, set(bound)
    assert (True, True) not in bound and (False, False) not in bound, set(bound)


def test_decode_steps_at_fixed_addresses_and_greedy_batches_on_the_greedy_form(
        batched_pack: tuple[Path, Manifest]) -> None:
    """What the cuda backend does on a GPU, on the CPU EP (where nothing is captured): decode steps over slots [0, 2^n)
    at fixed addresses (a binding per run shape, bound once, host inputs and outputs through device staging buffers),
    greedy batches on the verify graph's greedy form (graphs/batched_greedy_form.py), the rest on the graph as
    exported: the cpu backend's batched tokens, every request's lone tokens."""
    pack_dir, m = batched_pack
    rng = np.random.default_rng(3)
    greedy_only = [GenerateRequest.of(rng.integers(0, m.vocab_size - 8, 9 + 2 * i).tolist(), 16, k=2 + i % 2)
                   for i in range(SLOTS)]  # a batch without sampling rows: the greedy form's
    plain_mix = [GenerateRequest.of(rng.integers(0, m.vocab_size - 8, 8 + 3 * i).tolist(), 16, k=1 + i % 3,
                                    **({"temperature": 0.8 + 0.2 * i, "seed": 20 + i} if i % 2 else {}))  # type: ignore[arg-type]
                 for i in range(SLOTS)]  # greedy and temperature-only sampling rows: the plain form's
    ngram_mix = [*plain_mix[:-1], GenerateRequest.of(rng.integers(0, m.vocab_size - 8, 12).tolist(), 3, k=2,
                                                     temperature=0.9, seed=40, drafter="ngram")]  # type: ignore[arg-type]
    # an n-gram sampling row (a host one-hot q) beside the model's: the host path while it runs, in place after
    batches = (requests(m.vocab_size), greedy_only, plain_mix, ngram_mix)
    with open_pack(pack_dir, m, OrtBackend) as host:
        on_host = [batched_tokens(host, reqs)[0] for reqs in batches]
    with open_pack(pack_dir, m, CudaBackend, device="cpu", precapture=False, batched_greedy=True) as device:
        batcher = device.start_batching(batch_policy=NoCap(), solo=False)
        target, drafter = batcher.scheduler.verifier, batcher.scheduler.row_drafter
        assert isinstance(target, BatchedTarget) and isinstance(target.caches, DeviceCaches)
        draft = drafter.engine  # type: ignore[union-attr]
        greedy_session, plain_session = target.caches.greedy_session, target.caches.plain_session
        assert greedy_session is not None and plain_session is not None
        for caches in (target.caches, draft.caches):
            caches.staged = caches.launch_bound = True  # as on a GPU: the CPU EP ignores the graph ids
        greedy_session.capture = plain_session.capture = draft.caches.session.capture = True
        forms: list[str] = []
        in_place: list[tuple[int, int]] = []  # the runs whose sampling rows' q was the draft's rows in place
        real_rows = target.q_rows
        assert real_rows is not None
        target.q_rows = lambda lo, hi, rows: (in_place.append((lo, hi)), real_rows(lo, hi, rows))[1]
        for label, session in (("greedy", greedy_session), ("plain", plain_session), ("exported", target.caches.session)):
            real = session.run
            session.run = lambda binding, key, real=real, label=label: (forms.append(label), real(binding, key))[1]  # type: ignore[method-assign]
        on_device = [[h.result(timeout=120).tokens for h in [device.submit(r) for r in reqs]] for reqs in batches]
        fixed = (len(target.caches._fixed), len(draft.caches._fixed))
        assert draft.caches.fixed_rows == m.k_max + 1  # the draft's head with its K from shapes (batched_fixed_rows)
    assert on_device == on_host
    # greedy batches on the greedy form, with temperature-only sampling rows on the plain form, the others as exported;
    # the model's sampling rows verified on their q in place (no host copy), from slot 0 (decode steps over [0, 2^n))
    assert {"greedy", "plain", "exported"} <= set(forms)
    assert in_place and all(lo == 0 for lo, _ in in_place), in_place
    assert fixed[0] > 0 and fixed[1] > 0  # decode steps through bindings bound once per shape
    assert 3 not in target.runs and 4 in target.runs  # decode steps over [0, 2^n), prefills over their row


@pytest.mark.parametrize("precapture", [True, False])
def test_a_batcher_captures_its_decode_shapes_on_its_own_thread(batched_pack: tuple[Path, Manifest],
                                                                  precapture: bool) -> None:
    """ONNX Runtime keeps CUDA graphs per thread: start_batching runs the batched engines' decode step shapes
    (cuda_precapture.precapture_batched: the verify's greedy and plain forms, the draft) on the batcher's thread
    before its first step, so greedy and temperature-only sampling requests then run no warm-up run (no capture
    mid-request on a GPU) and keep their tokens; without precapture they do (and without the plain form's shapes,
    6 warm-up runs here). On the CPU EP, with
    the caches set as on a GPU (staged, launch-bound, sessions that capture: the warm-ups are counted, nothing is
    captured)."""
    import threading

    pack_dir, m = batched_pack
    rng = np.random.default_rng(5)
    greedy = [GenerateRequest.of(rng.integers(0, m.vocab_size - 8, 7 + 3 * i).tolist(), 16, k=1 + i % 3,
                                 # every other row temperature-only sampling: deterministic (n-gram) drafts, so that
                                 # the batched greedy draft and the verify's plain form serve them (no per-slot run)
                                 **({"temperature": 0.9, "seed": 30 + i, "drafter": "ngram"} if i % 2 else {}))  # type: ignore[arg-type]
              for i in range(SLOTS)]
    with open_pack(pack_dir, m, OrtBackend) as host:
        want = batched_tokens(host, greedy)[0]
    with open_pack(pack_dir, m, CudaBackend, device="cpu", precapture=precapture, batched_greedy=True) as device:
        engines = device.backend.batched_engines(SLOTS)  # type: ignore[attr-defined]
        draft = engines.drafter.engine
        for caches in (engines.target.caches, draft.caches):
            caches.staged = caches.launch_bound = True
        caches = engines.target.caches
        caches.greedy_session.capture = caches.plain_session.capture = draft.caches.session.capture = True
        threads: set[str] = set()
        for session in (caches.greedy_session, caches.plain_session, draft.caches.session):
            real = session.run
            session.run = lambda binding, key, real=real: (threads.add(threading.current_thread().name),  # type: ignore[method-assign]
                                                           real(binding, key))[1]
        batcher = device.start_batching(batched=engines.target, batched_draft=engines.drafter, batch_policy=NoCap(), solo=False)
        assert batcher.prepared.wait(60)
        before = device.backend.warmup_runs()
        got = [h.result(timeout=120).tokens for h in [device.submit(r) for r in greedy]]
        during = device.backend.warmup_runs() - before
    assert got == want
    assert threads == {"specpack-batcher"}  # every run of these sessions on the batcher's thread
    if precapture:
        assert before > 0 and during == 0, (before, during)  # every shape the requests ran was captured first
    else:
        assert before == 0 and during > 0, (before, during)


def test_joining_rows_prefill_together_where_a_run_costs_its_launch(batched_pack: tuple[Path, Manifest]) -> None:
    """Where a run costs its launch (a GPU: DeviceCaches.launch_bound), the scheduler runs an iteration's prefill
    chunks in one run and its prefills proper in one verify run (Scheduler.row_prefill), within PREFILL_TOGETHER
    tokens an iteration, instead of one run per row within one chunk; every request keeps the tokens the
    one-run-per-row scheduler gives it (the cpu backend's engines). Chunks of 8 tokens here, so that prompts of 9 to
    18 tokens take one or two chunks and a prefill proper."""
    pack_dir, m = batched_pack
    rng = np.random.default_rng(9)
    reqs = [GenerateRequest.of(rng.integers(0, m.vocab_size - 8, 9 + 3 * i).tolist(), 12, k=1 + i % 3)
            for i in range(SLOTS)]
    with open_pack(pack_dir, m, OrtBackend) as host:
        host.start_batching(batch_policy=NoCap(), prefill_chunk=8, solo=False)
        want = [h.result(timeout=120).tokens for h in [host.submit(r) for r in reqs]]
    with open_pack(pack_dir, m, CudaBackend, device="cpu", precapture=False, batched_greedy=True) as device:
        engines = device.backend.batched_engines(SLOTS)  # type: ignore[attr-defined]
        engines.target.caches.launch_bound = engines.drafter.engine.caches.launch_bound = True
        chunk_runs: list[int] = []     # rows of each prefill_chunks run
        prefill_runs: list[int] = []   # rows of each verify run of prefills proper
        real_chunks, real_verify = engines.target.prefill_chunks, engines.target.verify_rows
        engines.target.prefill_chunks = lambda chunks: (chunk_runs.append(len(chunks)), real_chunks(chunks))[1]  # type: ignore[method-assign]

        def verify_rows(rows):  # type: ignore[no-untyped-def]
            if all(s.length == s.prompt_length for s, _ in rows):  # no token out yet: prefills proper
                prefill_runs.append(len(rows))
            return real_verify(rows)

        engines.target.verify_rows = verify_rows  # type: ignore[method-assign]
        batcher = device.start_batching(batched=engines.target, batched_draft=engines.drafter, batch_policy=NoCap(),
                                        prefill_chunk=8, solo=False)
        assert batcher.scheduler.row_prefill is engines.target
        got = [h.result(timeout=120).tokens for h in [device.submit(r) for r in reqs]]
    assert got == want
    # prompts of 9, 12, 15, 18 tokens: their first chunks in one run, then the rests of 1, 4, 7 tokens (prefills
    # proper) in one run beside the last prompt's second chunk, then its rest of 2
    assert (chunk_runs, prefill_runs) == ([4, 1], [3, 1])
