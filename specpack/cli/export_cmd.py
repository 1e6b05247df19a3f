"""`spec-export` / `specpack export`: a draft and a target model in, a pack out."""

from __future__ import annotations

from pathlib import Path

import click

from specpack.cli.errors import user_errors
from specpack.cli.output_paths import OutputPath
from specpack.export.config import (
    DEFAULT_K,
    DEFAULT_KV_CACHE,
    DRAFTERS,
    DTYPES,
    EXECUTION_PROVIDERS,
    GRAPHS,
    K_MAX,
    K_MIN,
    QUANTIZE_CHOICES,
    ExportConfig,
)
from specpack.export.graph_form import ATTENTION_CHOICES, FORMS, KV_CACHES
from specpack.limits import TREE_NODES_MAX

DEFAULTS = ExportConfig()
QUANTIZE_HELP = ("Quantization of the {role}: weight-only int8 / int4 (ONNX Runtime MatMulNBits, lm_head and embedding "
                 "included), none, gguf (a .gguf source's own blocks), or calibrated Q/DQ of weights and activations "
                 "int8-sq (SmoothQuant) / fp8 (need --calib-prompts). Default: gguf for a .gguf source, else none. "
                 "With --graphs builder: none, int8 or int4 (the builder quantizes as it builds).")


@click.command("export")
@click.option("--draft", "draft", default=None,
              help="Draft model: HF model directory, hub id or .gguf file (none with --drafter ngram).")
@click.option("--target", "target", required=True, help="Target model: HF model directory, hub id or .gguf file.")
@click.option("-o", "--output", "output", required=True, type=OutputPath(), help="Pack directory to write.")
@click.option("--k", "k", type=int, default=DEFAULT_K, show_default=True, help=f"k_max: drafts per step, {K_MIN}..{K_MAX}.")
@click.option("--max-len", "max_len", type=int, default=None,
              help="Longest prompt + generation. Default: min(2048, the models' position limits).")
@click.option("--dtype", type=click.Choice(DTYPES), default="fp32", show_default=True,
              help="Weights, KV cache and logits; fp16 / bf16 are for GPUs (the heads compute in fp32).")
@click.option("--kv-cache", "kv_cache", type=click.Choice(KV_CACHES), default=None,
              help=f"concat: present = past + new; static: max_len buffers written in place, the length as data. "
                   f"Default: {DEFAULT_KV_CACHE}, static for --form tensorrt and --graphs builder.")
@click.option("--attention", type=click.Choice(ATTENTION_CHOICES), default="auto", show_default=True,
              help="Static cache only: gqa (GroupQueryAttention, head_dim % 8 == 0) or standard ONNX ops; "
                   "auto: gqa where the head size allows.")
@click.option("--form", type=click.Choice(FORMS), default=DEFAULTS.form, show_default=True,
              help="tensorrt: heads in TensorRT's ops (no fp64, TopK K < 3840) on the static cache with standard "
                   "attention; exact in distribution, not bit for bit with onnxruntime's heads.")
@click.option("--graphs", type=click.Choice(GRAPHS), default=DEFAULTS.graphs, show_default=True,
              help="Who writes the plain graphs: torch (torch.onnx.export) or builder (onnxruntime-genai's model "
                   "builder: static cache, GroupQueryAttention with the rotary inside, fused norms; needs "
                   "`pip install specpack[builder]`).")
@click.option("--ep", "execution_provider", type=click.Choice(EXECUTION_PROVIDERS),
              default=DEFAULTS.execution_provider, show_default=True,
              help="--graphs builder: the execution provider the graphs are built for (cuda: --dtype fp16 GPU packs).")
@click.option("--quantize-draft", type=click.Choice(QUANTIZE_CHOICES), default=None, help=QUANTIZE_HELP.format(role="draft"))
@click.option("--quantize-target", type=click.Choice(QUANTIZE_CHOICES), default=None,
              help=QUANTIZE_HELP.format(role="target"))
@click.option("--dequantize", is_flag=True, help="GGUF sources: dequantize to --dtype instead of keeping their blocks.")
@click.option("--no-fidelity", "no_fidelity", is_flag=True,
              help="Skip measuring quantized graphs against the unquantized ones (top-1 / KL, draft alpha).")
@click.option("--fidelity-prompts", type=click.Path(path_type=Path), default=None,
              help="Prompt file for the fidelity measurement (bench formats); default: a few built-in prompts.")
@click.option("--fidelity-limit", type=int, default=DEFAULTS.fidelity_limit, show_default=True,
              help="Prompts taken from --fidelity-prompts.")
@click.option("--fidelity-tokens", type=int, default=DEFAULTS.fidelity_tokens, show_default=True,
              help="Greedy tokens the pack's target continues each fidelity prompt with.")
@click.option("--calib-prompts", type=click.Path(path_type=Path), default=None,
              help="Prompt file (bench formats) to calibrate int8-sq / fp8 on.")
@click.option("--calib-samples", type=int, default=DEFAULTS.calib_samples, show_default=True,
              help="Prompts drawn from --calib-prompts (seeded).")
@click.option("--calib-seed", type=int, default=DEFAULTS.calib_seed, show_default=True,
              help="Seed of the draw from --calib-prompts.")
@click.option("--drafter", type=click.Choice(DRAFTERS), default="model", show_default=True,
              help="model: a pack with the --draft model; ngram: the target alone, drafting by prompt lookup.")
@click.option("--draft-head", "draft_head", type=click.Path(path_type=Path), default=None,
              help="A draft head trained for this target by `specpack distill` (no --draft): the pack drafts with it; "
                   "a head trained for another target is refused.")
@click.option("--max-tree-nodes", "max_tree_nodes", type=int, default=DEFAULTS.max_tree_nodes, show_default=True,
              help=f"Token trees: the target's verify graph takes a tree of up to this many drafts (1..{TREE_NODES_MAX}) "
                   "with `parents`, plus kv_compact.onnx; static KV cache, torch graphs. 0: chains only.")
@click.option("--max-batch", "max_batch", type=int, default=DEFAULTS.max_batch, show_default=True,
              help="Continuous batching: also write each model's batched graph (verify_batched.onnx, draft_batched.onnx"
                   "), so `serve --max-batch` verifies up to this many requests in one run (torch graphs, fp32, "
                   "or fp16 for the cuda backend; docs/batching.md). 0: none.")
@click.option("--jobs", "jobs", type=int, default=DEFAULTS.jobs, show_default=True,
              help="Torch exports (each model, and each batched form) running at once, each in its own process: "
                   "faster on many cores, but their peak memory adds up (about 11 GB for a 1.5B model's).")
@click.option("--overwrite", is_flag=True, help="Replace an existing pack at the output path.")
@user_errors
def export_command(draft: str | None, target: str, output: Path, k: int, max_len: int | None, dtype: str,
                   kv_cache: str | None, attention: str, form: str, graphs: str, execution_provider: str,
                   quantize_draft: str | None,
                   quantize_target: str | None, dequantize: bool, no_fidelity: bool,
                   fidelity_prompts: Path | None, fidelity_limit: int, fidelity_tokens: int, calib_prompts: Path | None,
                   calib_samples: int, calib_seed: int, drafter: str, draft_head: Path | None,
                   max_tree_nodes: int, max_batch: int, jobs: int, overwrite: bool) -> None:
    """Export a draft/target pair (or a target alone, --drafter ngram, or a target with its draft head, --draft-head)
    to a speculative-decoding pack."""
    from specpack.export.pipeline import export_pack

    config = ExportConfig(k=k, max_len=max_len, dtype=dtype, kv_cache=kv_cache or "", attention=attention, form=form,
                          graphs=graphs, execution_provider=execution_provider,
                          drafter=drafter, overwrite=overwrite, quantize_draft=quantize_draft,
                          quantize_target=quantize_target, dequantize=dequantize, fidelity=not no_fidelity,
                          fidelity_prompts=None if fidelity_prompts is None else str(fidelity_prompts),
                          fidelity_limit=fidelity_limit, fidelity_tokens=fidelity_tokens,
                          calib_prompts=None if calib_prompts is None else str(calib_prompts),
                          calib_samples=calib_samples, calib_seed=calib_seed,
                          draft_head=None if draft_head is None else str(draft_head),
                          max_tree_nodes=max_tree_nodes, max_batch=max_batch, jobs=jobs)
    export_pack(draft, target, output, config)
    click.echo(str(output))
