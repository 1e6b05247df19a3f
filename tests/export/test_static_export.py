"""The static KV cache form of the torch export: the same logits as the concat form through prefill, steps and
rollbacks; greedy speculative decoding through the static verify graph equals transformers' generate; the graph
writes only the new rows of the bound buffers (in place); fp16 / bf16 graphs with fp32 heads."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from graphs.plain import copy_plain
from static_harness import ConcatRunner, StaticRunner, session
from transformers import AutoModelForCausalLM

from specpack import names
from specpack.errors import SpecpackError
from specpack.export.graph_form import GraphForm, resolve_form
from specpack.export.model_info import read_model_info
from specpack.export.torch_export import export_plain_graph
from specpack.graphs.attach import LogitsNotPrunedWarning, build_draft_step_graph, build_verify_graph

TOL = 1e-4  # fp32 logits, as tests/export/test_torch_export.py
MAX_LEN = 40
# (family, head_dim, attention): every family in the standard form; GQA where head_dim % 8 == 0
CASES = [("llama", 12, "standard"), ("qwen2", 12, "standard"), ("mistral", 20, "standard"), ("gpt2", 12, "standard"),
         ("qwen2", 16, "gqa"), ("gpt2", 16, "gqa")]
# prefill, a step, a verify-sized run, rollbacks (one of 3 rejected drafts, then back to the prompt), new tokens
SCRIPT: list[tuple[str, int]] = [("run", 5), ("run", 1), ("run", 4), ("rollback", 7), ("run", 3), ("run", 1),
                                 ("rollback", 2), ("run", 5), ("run", 1)]


def _ids(vocab: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.int64)


@pytest.mark.parametrize(("family", "head_dim", "attention"), CASES, ids=[f"{f}-h{h}-{a}" for f, h, a in CASES])
def test_static_logits_equal_concat(tiny_pairs, tiny_plain_graph, family: str, head_dim: int, attention: str) -> None:
    _, target = tiny_pairs(family, head_dim=head_dim)
    info = read_model_info(target)
    static = StaticRunner(tiny_plain_graph(family, kv_cache="static", attention=attention, head_dim=head_dim),
                          info, MAX_LEN)
    concat = ConcatRunner(tiny_plain_graph(family, head_dim=head_dim), info)
    for i, (action, n) in enumerate(SCRIPT):
        if action == "rollback":
            static.rollback(n)
            concat.rollback(n)
            continue
        ids = _ids(info.vocab_rows, n, seed=i)
        got, want = static.run(ids)[names.LOGITS], concat.run(ids)[names.LOGITS]  # [1, n, V]
        assert got.shape == want.shape == (1, n, info.vocab_rows)
        assert np.abs(got - want).max() < TOL, f"step {i} ({action} {n})"
    assert static.length == concat.length == 2 + 5 + 1


def test_graph_contract(tiny_plain_graph, tmp_path: Path) -> None:
    """Batch 1, the static mask [1, M], past and present [1, kv_heads, M, head_dim] (M symbolic), no control flow
    (CUDA graphs capture none), GroupQueryAttention nodes only in the gqa form; the standard form uses
    default-domain ops only, no fp64, and its Range nodes read shapes only (a Range over data would make the
    CUDA EP copy the value to the host mid-graph). ONNX Runtime fuses every RMSNorm."""
    for attention in ("gqa", "standard"):
        model = onnx.load(str(tiny_plain_graph("qwen2", kv_cache="static", attention=attention, head_dim=16)),
                          load_external_data=False)
        dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in [*model.graph.input, *model.graph.output]}
        assert dims[names.ATTENTION_MASK] == [1, "max_sequence_length"]
        assert dims[names.past_name(0, "key")] == dims[names.present_name(0, "value")] == [1, 2, "max_sequence_length", 16]
        domains = {n.domain for n in model.graph.node}
        ops = {n.op_type for n in model.graph.node}
        assert not ops & {"If", "Loop", "Scan"}
        assert all(_from_shapes(model, i) for n in model.graph.node if n.op_type == "Range" for i in n.input)
        assert _fused_rms_norms(tiny_plain_graph("qwen2", kv_cache="static", attention=attention, head_dim=16),
                                tmp_path / attention) == 2 * 3 + 1  # 2 per layer + the final norm
        if attention == "gqa":
            assert "GroupQueryAttention" in ops and "ScatterND" not in ops
        else:
            assert domains <= {"", "ai.onnx"} and "ScatterND" in ops
            assert not any(init.data_type == onnx.TensorProto.DOUBLE for init in model.graph.initializer)


def _from_shapes(model: onnx.ModelProto, value: str) -> bool:
    """`value` is computed from Shape / Constant nodes and initializers only."""
    node = next((n for n in model.graph.node if value in n.output), None)
    if node is None:
        return value in {i.name for i in model.graph.initializer}
    return node.op_type in ("Shape", "Constant") or all(_from_shapes(model, i) for i in node.input if i)


def _fused_rms_norms(graph: Path, work: Path) -> int:
    """SimplifiedLayerNormalization nodes after ONNX Runtime's load-time fusions (torch_export writes RMSNorm
    as the chain they recognize)."""
    import onnxruntime as ort

    work.mkdir()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(work / "optimized.onnx")
    ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(work / "optimized.onnx"), load_external_data=False)
    return sum(n.op_type == "SimplifiedLayerNormalization" for n in optimized.graph.node)


def _reference(target: Path, prompt: np.ndarray, max_new: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    out = model.generate(torch.from_numpy(prompt)[None], attention_mask=torch.ones(1, prompt.size, dtype=torch.long),
                         max_new_tokens=max_new, do_sample=False, pad_token_id=0)
    return out[0, prompt.size :].tolist()  # ends early at an eos


@pytest.mark.parametrize(("family", "head_dim", "attention"), [("llama", 12, "standard"), ("qwen2", 16, "gqa")])
def test_greedy_speculation_through_static_verify_graph(tiny_pairs, tiny_plain_graph, tmp_path: Path, family: str,
                                                        head_dim: int, attention: str) -> None:
    """Speculative greedy decoding with the static verify graph (drafts: the reference continuation with every
    other proposal corrupted, so drafts are rejected and the cache rolls back) gives transformers' tokens."""
    _, target = tiny_pairs(family, head_dim=head_dim)
    info = read_model_info(target)
    plain = copy_plain(tiny_plain_graph(family, kv_cache="static", attention=attention, head_dim=head_dim),
                       tmp_path / "plain.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("error", LogitsNotPrunedWarning)  # the lm_head of the static graph is pruned
        build_verify_graph(plain, tmp_path / names.VERIFY_FILE, info.vocab_rows)
    prompt = _ids(info.vocab_rows, 6, seed=7)
    reference = _reference(target, prompt, 24)
    max_new = len(reference)
    assert max_new > 12
    runner = StaticRunner(tmp_path / names.VERIFY_FILE, info, MAX_LEN)
    sampling = {names.TEMPERATURE: np.zeros(1, np.float32), names.TOP_K: np.zeros(1, np.int64),
                names.TOP_P: np.ones(1, np.float32)}
    rng = np.random.default_rng(0)
    tokens: list[int] = []
    pending = prompt  # committed tokens not yet in the cache: the prompt, then the last emitted token
    step = 0
    while len(tokens) < max_new:
        k = min(3, max_new - len(tokens) - 1)
        drafts = np.array(reference[len(tokens) : len(tokens) + k], np.int64)
        if step % 2 and k:
            i = rng.integers(0, k)
            drafts[i] = (drafts[i] + 1) % info.vocab_rows  # a wrong draft: the rest after it is rejected too
        cached = runner.length
        out = runner.run(np.concatenate([pending, drafts]), **sampling,
                         **{names.DRAFT_PROBS: np.zeros((1, k, info.vocab_rows), np.float32),
                            names.UNIFORMS: np.zeros((1, k + 1), np.float32)})
        n, next_token = int(out[names.N_ACCEPTED][0]), int(out[names.NEXT_TOKEN][0])
        runner.rollback(cached + pending.size + n)  # keep the committed tokens and the accepted drafts
        tokens += [*drafts[:n].tolist(), next_token]
        pending, step = np.array([next_token], np.int64), step + 1
    assert tokens == reference
    assert step < max_new  # some steps accepted drafts


@pytest.mark.parametrize("attention", ["gqa", "standard"])
def test_writes_only_new_rows(tiny_pairs, tiny_plain_graph, attention: str) -> None:
    """In place: with every page of the cache outside rows [L, L + S) write-protected, a run succeeds and gives
    the same logits (a full copy, or writing anywhere else, would crash the child process); a rollback with the
    whole cache write-protected writes nothing. tests/export/inplace_probe.py is the child."""
    _, target = tiny_pairs("qwen2", head_dim=16)
    info = read_model_info(target)
    graph = tiny_plain_graph("qwen2", kv_cache="static", attention=attention, head_dim=16)
    probe = Path(__file__).with_name("inplace_probe.py")
    spec = json.dumps({"graph": str(graph), "layers": info.num_layers, "kv_heads": info.kv_heads,
                       "head_dim": info.head_dim, "vocab": info.vocab_rows})
    proc = subprocess.run([sys.executable, str(probe), spec], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"child exited {proc.returncode} (negative: killed by that signal)\n{proc.stderr}"
    report = json.loads(proc.stdout)
    # Rows [L, L + S) of one head span one page, or two where they straddle a page boundary (the buffer's
    # alignment decides): every other page of the cache is protected.
    assert report["new_row_ranges"] <= report["writable_pages"] <= 2 * report["new_row_ranges"]
    assert report["protected_pages"] >= report["cache_pages"] - report["writable_pages"]
    assert report["protected_pages"] > 4 * report["writable_pages"]
    assert report["max_abs_diff"] < TOL
    assert report["addresses_unchanged"]


def test_sliding_window(tiny_pairs, tmp_path: Path) -> None:
    """Mistral with a 4-token window: the static graph (both attention forms) applies the window like torch."""
    draft, _ = tiny_pairs("mistral", head_dim=16)  # one layer is enough here
    model_dir = Path(shutil.copytree(draft, tmp_path / "mistral-sw4"))
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "sliding_window": 4}))
    info = read_model_info(model_dir)
    ids = _ids(info.vocab_rows, 11, seed=3)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids)[None]).logits.numpy()  # [1, 11, V], window applied
    for attention in ("standard", "gqa"):
        graph = tmp_path / attention / "plain.onnx"
        export_plain_graph(model_dir, graph, form=GraphForm("static", attention))
        runner = StaticRunner(graph, info, MAX_LEN)
        got = np.concatenate([runner.run(ids[a:b])[names.LOGITS] for a, b in ((0, 6), (6, 7), (7, 11))], axis=1)
        assert np.abs(got - want).max() < TOL, attention


def test_form_choices() -> None:
    assert resolve_form("static", "auto", 16) == GraphForm("static", "gqa")
    assert resolve_form("static", "auto", 12) == GraphForm("static", "standard")
    assert resolve_form("concat", "auto", 16) == GraphForm("concat", "standard")
    with pytest.raises(SpecpackError, match="multiple of 8"):
        resolve_form("static", "gqa", 20)
    with pytest.raises(SpecpackError, match="needs the static KV cache"):
        GraphForm("concat", "gqa")
    with pytest.raises(SpecpackError, match="--kv-cache"):
        GraphForm("ring", "standard")


# ---------------------------------------------------------------------------------------------- fp16 / bf16

@pytest.mark.parametrize("attention", ["gqa", "standard"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_graphs_have_fp32_heads(tiny_pairs, tmp_path: Path, dtype: str, attention: str) -> None:
    """fp16 / bf16 static graphs: cache and logits in that dtype, the verify head casts the logits to fp32 before
    anything else. ONNX Runtime's CPU EP runs the fp16 graphs of both attention forms close to fp32 torch; it
    has no bf16 kernels for them (the session refuses to load), so bf16 graphs are checked by the ONNX checker
    only: they are for the GPU."""
    draft, _ = tiny_pairs("qwen2", head_dim=16)
    info = read_model_info(draft)
    plain = tmp_path / "plain.onnx"
    export_plain_graph(draft, plain, dtype, GraphForm("static", attention))
    elem = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}[dtype]
    model = onnx.load(str(plain), load_external_data=False)
    assert {v.type.tensor_type.elem_type for v in model.graph.output} == {elem}
    if dtype == "fp16":
        runner = StaticRunner(plain, info, MAX_LEN, np.float16)
        ids = _ids(info.vocab_rows, 7, seed=1)
        got = np.concatenate([runner.run(ids[:5])[names.LOGITS], runner.run(ids[5:])[names.LOGITS]], axis=1)
        torch_model = AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32).eval()
        with torch.no_grad():
            want = torch_model(input_ids=torch.from_numpy(ids)[None]).logits.numpy()
        assert got.dtype == np.float16
        assert np.abs(got.astype(np.float32) - want).max() < 0.05 * max(1.0, float(np.abs(want).max()))
        del runner
    graphs = {names.DRAFT_STEP_FILE: build_draft_step_graph, names.VERIFY_FILE: build_verify_graph}
    for file, build in graphs.items():
        build(copy_plain(plain, tmp_path / f"copy-{file}"), tmp_path / file, info.vocab_rows)
        head = onnx.load(str(tmp_path / file), load_external_data=False)

        def readers(value: str, head: onnx.ModelProto = head) -> list[onnx.NodeProto]:
            return [n for n in head.graph.node if value in n.input]

        (squeeze,) = readers(names.LOGITS)  # logits [1, rows, V] -> Squeeze -> Cast to fp32 -> the head
        (cast,) = readers(squeeze.output[0])
        assert (cast.op_type, cast.attribute[0].i) == ("Cast", onnx.TensorProto.FLOAT), file
        if dtype == "bf16":
            with pytest.raises(Exception, match="NOT_IMPLEMENTED : Could not find an implementation"):
                session(tmp_path / file)
        else:
            session(tmp_path / file)
    probs = {o.name: o.type.tensor_type.elem_type for o in onnx.load(str(tmp_path / names.DRAFT_STEP_FILE),
                                                                     load_external_data=False).graph.output}
    assert probs[names.PROBS] == onnx.TensorProto.FLOAT


def test_pack_manifest_records_each_graph_form(tiny_pairs, tmp_path: Path) -> None:
    """spec-export --kv-cache static: both graphs static, attention auto (standard for head_dim 12), recorded in
    the manifest; --attention gqa for head_dim 12 is refused before anything is exported."""
    from specpack.contract.manifest import Manifest
    from specpack.export.config import ExportConfig
    from specpack.export.pipeline import export_pack

    draft, target = tiny_pairs("llama")
    with pytest.raises(SpecpackError, match="multiple of 8"):
        export_pack(str(draft), str(target), tmp_path / "refused",
                    ExportConfig(kv_cache="static", attention="gqa", isolate=False))
    assert not (tmp_path / "refused").exists()
    out = export_pack(str(draft), str(target), tmp_path / "pack", ExportConfig(kv_cache="static", max_len=64,
                                                                                 isolate=False))
    manifest = Manifest.read(out)
    for model in (manifest.draft, manifest.target):
        assert (model.graph.kv_cache, model.graph.attention) == ("static", "standard")
        mask = next(t for t in model.graph.inputs if t.name == names.ATTENTION_MASK)
        assert mask.shape == [1, "max_sequence_length"]
