"""Export settings: one frozen dataclass, its defaults in one place; the CLI reads them from here."""

from __future__ import annotations

from dataclasses import dataclass

from specpack.calibration.sets import DEFAULT_SAMPLES as DEFAULT_CALIB_SAMPLES
from specpack.calibration.sets import DEFAULT_SEED as DEFAULT_CALIB_SEED
from specpack.dtypes import DTYPES
from specpack.errors import SpecpackError
from specpack.export.builder_export import (
    EXECUTION_PROVIDERS,
    GRAPHS,
    check_builder_config,
    check_builder_quantization,
)
from specpack.export.graph_form import ATTENTION_CHOICES, FORMS, KV_CACHES, GraphForm, resolve_form
from specpack.limits import (
    DEFAULT_K,
    DEFAULT_MAX_LEN,
    DRAFTERS,
    K_MAX,
    K_MIN,
    TREE_WIDTH_MAX,
    check_export_k,
    check_tree_nodes,
)
from specpack.quantize import modes

# the CLI reads them here
__all__ = ["DEFAULT_K", "DEFAULT_KV_CACHE", "DEFAULT_MAX_LEN", "DRAFTERS", "DTYPES", "EXECUTION_PROVIDERS", "GRAPHS",
           "K_MAX", "K_MIN", "QUANTIZE_CHOICES", "ExportConfig", "default_kv_cache"]
DEFAULT_KV_CACHE = "concat"  # bench/README.md, "Static KV cache on the CPU": why
QUANTIZE_CHOICES = modes.ALL  # none, int8, int4 (weight-only), gguf (a GGUF source's own blocks), int8-sq, fp8
BATCHED_DTYPES = ("fp32", "fp16")  # --max-batch: the graph dtypes the batched form is exported in (fp16: unquantized)


@dataclass(frozen=True)
class ExportConfig:
    k: int = DEFAULT_K                # the pack's k_max: drafts per step, at most
    max_len: int | None = None        # prompt + generated tokens; None: min(2048, both position limits)
    dtype: str = "fp32"
    kv_cache: str = ""                # "concat" or "static" (graph_form.py); "": default_kv_cache(form, graphs)
    attention: str = "auto"           # "auto", "gqa" or "standard"; auto: gqa for a static cache if head_dim allows
    form: str = "onnxruntime"         # "tensorrt": TensorRT's ops in the heads, static cache, standard attention
    overwrite: bool = False           # replace an existing pack at the output path
    isolate: bool = True              # export each model in its own process (peak memory of the 1.5B: ~11 GB)
    jobs: int = 1                     # torch exports (stage 1) running at once, each in its own process (isolate):
                                      # their peak memory adds up
    quantize_draft: str | None = None   # modes.py; None: "gguf" for a .gguf source (unless dequantize), else "none"
    quantize_target: str | None = None
    dequantize: bool = False          # a .gguf source becomes an unquantized (dtype) graph, not its own blocks
    fidelity: bool = True             # measure a quantized graph against its unquantized reference (quantize/fidelity.py)
    fidelity_prompts: str | None = None  # a prompt file (specpack/prompts.py formats); None: fidelity.py's built-in prompts
    fidelity_limit: int = 8           # prompts taken from it
    fidelity_tokens: int = 48         # greedy continuation of each prompt by the pack's target
    drafter: str = "model"            # "model": a draft model's graph; "ngram": the target alone (prompt lookup drafts)
    draft_head: str | None = None     # a head directory from `specpack distill`: the pack drafts with it (drafter "head")
    calib_prompts: str | None = None  # a prompt file (specpack/prompts.py formats): the calibration set of int8-sq / fp8
    calib_samples: int = DEFAULT_CALIB_SAMPLES  # prompts drawn from it (seeded)
    calib_seed: int = DEFAULT_CALIB_SEED
    graphs: str = "torch"             # who writes the plain graphs: "torch" (torch_export.py) or "builder"
                                      # (onnxruntime-genai's model builder, builder_export.py)
    execution_provider: str = "cpu"   # "cpu" or "cuda": what the builder builds for (--graphs builder only)
    max_tree_nodes: int = 0           # > 0: the target's verify.onnx verifies token trees of up to this many nodes
                                      # (docs/trees.md; static cache, torch or builder graphs); 0: chains
    max_batch: int = 0                # > 0: the batched graphs too (docs/batching.md): verify_batched.onnx (and
                                      # draft_batched.onnx), requests decoded together up to this many; 0: none

    def __post_init__(self) -> None:
        if not self.kv_cache:  # the defaults are applied here, for the API and the CLI alike
            object.__setattr__(self, "kv_cache", default_kv_cache(self.form, self.graphs))
        check_export_k(self.k)
        self._check_tree()
        self._check_batch()
        if self.max_len is not None and (not isinstance(self.max_len, int) or self.max_len < 2):
            raise SpecpackError("invalid --max-len", expected="an integer >= 2", found=repr(self.max_len))
        if self.dtype not in DTYPES:
            raise SpecpackError("invalid --dtype", expected=" or ".join(DTYPES), found=repr(self.dtype))
        if self.drafter not in DRAFTERS:
            raise SpecpackError("invalid --drafter", expected=" or ".join(DRAFTERS), found=repr(self.drafter))
        if self.kv_cache not in KV_CACHES:
            raise SpecpackError("invalid --kv-cache", expected=" or ".join(KV_CACHES), found=repr(self.kv_cache))
        if self.attention not in ATTENTION_CHOICES:
            raise SpecpackError("invalid --attention", expected=" or ".join(ATTENTION_CHOICES),
                                found=repr(self.attention))
        if self.form not in FORMS:
            raise SpecpackError("invalid --form", expected=" or ".join(FORMS), found=repr(self.form))
        self._check_graphs()
        if self.draft_head is not None and self.quantize_draft not in (None, *modes.WEIGHT_ONLY):
            raise SpecpackError(f"--quantize-draft {self.quantize_draft} cannot quantize a draft head",
                                expected="--quantize-draft int8, int4 or none with --draft-head (weight-only)",
                                found=f"--quantize-draft {self.quantize_draft}",
                                hint="a head has no GGUF blocks or calibration set: use int8 or int4")
        attention = "standard" if self.form == "tensorrt" and self.attention == "auto" else self.attention
        if attention != "auto":  # refuses concat + gqa, and tensorrt off the static cache with standard attention
            GraphForm(self.kv_cache, attention, self.form)

        for option, number in (("--fidelity-limit", self.fidelity_limit), ("--fidelity-tokens", self.fidelity_tokens),
                               ("--calib-samples", self.calib_samples)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 1:
                raise SpecpackError(f"invalid {option}", expected="an integer >= 1", found=repr(number))
        for option, value in (("--quantize-draft", self.quantize_draft), ("--quantize-target", self.quantize_target)):
            if value is not None and value not in QUANTIZE_CHOICES:
                raise SpecpackError(f"invalid {option}", expected=", ".join(QUANTIZE_CHOICES), found=repr(value))
            if value in modes.CALIBRATED and self.calib_prompts is None:
                raise SpecpackError(f"{option} {value} needs a calibration set", expected="--calib-prompts FILE",
                                    found="no --calib-prompts", hint="a prompt file in specpack/prompts.py's formats")
            if value == modes.GGUF and self.dequantize:
                raise SpecpackError(f"{option} gguf contradicts --dequantize", expected="one of the two",
                                    found=f"{option} gguf --dequantize")

    def _check_tree(self) -> None:
        """--max-tree-nodes: a number in range, and a form the tree verify graph is built for."""
        if not check_tree_nodes(self.max_tree_nodes):
            return
        refused = [(self.kv_cache != "static", f"--kv-cache {self.kv_cache}", "--kv-cache static"),
                   (self.form != "onnxruntime", f"--form {self.form}", "--form onnxruntime")]
        for bad, found, expected in refused:
            if bad:
                raise SpecpackError(f"--max-tree-nodes cannot be exported with {found}: the tree verify graph is built "
                                    "for the static KV cache (torch or builder graphs) so far", expected=expected,
                                    found=found, hint="leave out --max-tree-nodes for this form (the concat cache and "
                                                      "the TensorRT heads are not built yet: docs/trees.md)")

    def _check_batch(self) -> None:
        """--max-batch: a number in range, and a pack the batched graphs are built for: the batched static form of
        torch's graphs, fp32 (unquantized or weight-only quantized as the batch-1 graphs; the cpu and cuda backends) or
        fp16 (unquantized; the cuda backend); docs/batching.md, "What remains"."""
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or not 1 <= self.jobs <= 16:
            raise SpecpackError("--jobs out of range", expected="1 <= jobs <= 16", found=repr(self.jobs),
                                hint="torch exports running at once; each holds its own model in memory")
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or not 0 <= self.max_batch <= 1024:
            raise SpecpackError("invalid --max-batch", expected="an integer in 0..1024 (0: no batched graphs)",
                                found=repr(self.max_batch))
        if not self.max_batch:
            return
        quantized = [q for q in (self.quantize_draft, self.quantize_target) if q not in (None, modes.NONE)]
        refused = [(self.graphs != "torch", f"--graphs {self.graphs}", "--graphs torch"),
                   (self.form != "onnxruntime", f"--form {self.form}", "--form onnxruntime"),
                   (self.dtype not in BATCHED_DTYPES, f"--dtype {self.dtype}", " or ".join(f"--dtype {d}" for d in
                                                                                           BATCHED_DTYPES)),
                   (self.max_tree_nodes > 0, "--max-tree-nodes", "chains"),
                   (self.draft_head is not None, "--draft-head", "--drafter model or ngram"),
                   (any(q in modes.CALIBRATED for q in quantized),
                    "--quantize-* " + " / ".join(modes.CALIBRATED), "unquantized or weight-only (int4, int8, gguf)"),
                   (self.dtype != "fp32" and bool(quantized), f"--dtype {self.dtype} with --quantize-* "
                    + " / ".join(quantized), f"unquantized weights with --dtype {self.dtype} (quantized: --dtype fp32)")]
        for bad, found, expected in refused:
            if bad:
                raise SpecpackError(f"--max-batch cannot be exported with {found} yet: the batched graphs are the "
                                    "standard-attention static form of torch's graphs, fp32 (weight-only quantization "
                                    "allowed) or fp16 (unquantized)", expected=expected, found=found,
                                    hint="leave out --max-batch, or export those graphs (for the cuda backend: --graphs "
                                         "torch --kv-cache static --dtype fp16; docs/batching.md, 'What remains')")

    def _check_graphs(self) -> None:
        """--graphs / --ep, and what the builder cannot do (builder_export.py lists it)."""
        if self.graphs not in GRAPHS:
            raise SpecpackError("invalid --graphs", expected=" or ".join(GRAPHS), found=repr(self.graphs))
        if self.execution_provider not in EXECUTION_PROVIDERS:
            raise SpecpackError("invalid --ep", expected=" or ".join(EXECUTION_PROVIDERS),
                                found=repr(self.execution_provider))
        if self.graphs == "torch":
            if self.execution_provider != "cpu":
                raise SpecpackError("--ep chooses what --graphs builder builds for", expected="--graphs builder "
                                    f"--ep {self.execution_provider}", found=f"--graphs torch --ep {self.execution_provider}",
                                    hint="torch graphs serve every device: leave --ep out")
            return
        refused = [(self.kv_cache != "static", f"--kv-cache {self.kv_cache}", "--kv-cache static (the default)"),
                   (self.attention == "standard", "--attention standard", "--attention gqa or auto"),
                   (self.form != "onnxruntime", f"--form {self.form}", "--form onnxruntime")]
        for bad, found, expected in refused:
            if bad:
                raise SpecpackError(f"--graphs builder cannot build {found}: its graphs are the static KV cache with "
                                    "GroupQueryAttention", expected=expected, found=found,
                                    hint="use --graphs torch for other forms")
        for role, value in (("draft", self.quantize_draft), ("target", self.quantize_target)):
            if value is not None:
                check_builder_quantization(role, value)
        check_builder_config(self.dtype, self.execution_provider)

    def draft_tree_width(self, vocab_size: int) -> int:
        """K of the draft model's tree form (docs/trees.md, "Trees drafted by the draft model"): a tree pack's draft
        model (torch or builder graphs) gets own rows' positions and mask and each row's top-K in draft_step.onnx, K =
        TREE_WIDTH_MAX at most the nodes and the vocabulary; 0: its chain form (no tree verify graph, no draft
        model)."""
        if not self.max_tree_nodes or self.drafter != "model" or self.draft_head:
            return 0
        return min(TREE_WIDTH_MAX, self.max_tree_nodes, vocab_size)

    def graph_form(self, head_dim: int) -> GraphForm:
        """The KV cache and attention form of one model's graph (attention "auto" depends on its head size);
        the builder's graphs are always static gqa."""
        if self.graphs == "builder":
            form = GraphForm("static", "gqa")
            form.check(head_dim)
            return form
        return resolve_form(self.kv_cache, self.attention, head_dim, self.form)

    def quantization(self, role: str, source: str) -> str:
        """The quantization mode of the `role` ("draft" | "target") graph exported from `source`."""
        chosen = self.quantize_draft if role == "draft" else self.quantize_target
        is_gguf = source.lower().endswith(".gguf")
        if chosen is None:
            return self._check_form(role, modes.GGUF if is_gguf and not self.dequantize else modes.NONE)
        if chosen == modes.GGUF and not is_gguf:
            raise SpecpackError(f"--quantize-{role} gguf needs a .gguf {role}", expected="a .gguf model file",
                                found=source, hint="use int4 or int8 for other sources")
        return self._check_form(role, chosen)

    def check_sources(self, *sources: str | None) -> None:
        """Options that only mean something for some sources: --dequantize needs a .gguf source."""
        if self.dequantize and not any(s is not None and s.lower().endswith(".gguf") for s in sources):
            raise SpecpackError("--dequantize applies to .gguf sources only", expected="a .gguf --draft or --target",
                                found=", ".join(s for s in sources if s is not None) or "no source",
                                hint="leave out --dequantize: other sources are exported unquantized (--dtype)")

    def _check_form(self, role: str, method: str) -> str:
        """Weight-only and calibrated graphs are quantized in either KV form (quantize/stage.py rewrites any plain
        graph; the fidelity stage measures concat-form packs only). The builder quantizes its static-form graphs itself
        (int4 / int8); a .gguf source's blocks it cannot keep."""
        if self.graphs == "builder":
            return check_builder_quantization(role, method)
        if self.max_batch and self.dtype != "fp32" and method != modes.NONE:  # e.g. a .gguf source's own blocks
            raise SpecpackError(f"--max-batch cannot be exported with --dtype {self.dtype} and a quantized {role} "
                                f"({method}) yet: the fp16 batched graphs are unquantized",
                                expected=f"--quantize-{role} none (or --dequantize), or --dtype fp32",
                                found=f"--dtype {self.dtype}, {role} {method}", hint="docs/batching.md, 'What remains'")
        return method

    def plain_graph_record(self) -> dict[str, str]:
        """What the manifest records of how the plain graphs were made (GraphEntry `exporter`,
        `execution_provider`): torch graphs serve every EP, builder graphs are built for one."""
        if self.graphs == "builder":
            return {"exporter": "builder", "execution_provider": self.execution_provider}
        return {}

    def resolve_max_len(self, *limits: int | None) -> int:
        """--max-len, or its default: the smaller of 2048 and the models' position limits; larger is refused."""
        known = [n for n in limits if n is not None]
        ceiling = min([DEFAULT_MAX_LEN, *known]) if self.max_len is None else min(known, default=self.max_len)
        if self.max_len is None:
            return ceiling
        if self.max_len > ceiling:
            raise SpecpackError("--max-len is larger than the models' position limit",
                                expected=f"--max-len <= {ceiling} (draft/target position limits {limits})",
                                found=str(self.max_len))
        return self.max_len


def default_kv_cache(form: str, graphs: str) -> str:
    """--kv-cache's default: static for --form tensorrt and --graphs builder (their only form), else concat."""
    return "static" if form == "tensorrt" or graphs == "builder" else DEFAULT_KV_CACHE
