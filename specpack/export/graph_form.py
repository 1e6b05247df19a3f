"""The form of a plain graph: its KV cache (concat or static) and its attention (standard ops or GQA).

    kv_cache   concat    present = past + new, [B, kv_heads, L + S, head_dim]; rollback keeps the first L
               static    past and present are one buffer [1, kv_heads, max_len, head_dim], written in place;
                         the valid length is the static attention mask (names.py); rollback is a length update
    attention  standard  default-domain ONNX ops only (any head size; TensorRT)
               gqa       com.microsoft.GroupQueryAttention, shared past/present buffer (static cache only;
                         head_dim a multiple of 8)
    heads      onnxruntime  the sampling heads exact with the oracle bit for bit (graphs/sampling_graph.py)
               tensorrt     the heads in TensorRT's ops (graphs/sampling_trt.py: no fp64, TopK K < 3840), on
                            the static cache with standard attention: `--form tensorrt`

Recorded for each graph in the manifest (`kv_cache`, `attention`, `heads`), read by the runtime to pick its cache.
Light: no torch, no onnx.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpack.errors import SpecpackError

KV_CACHES = ("concat", "static")
ATTENTIONS = ("gqa", "standard")
ATTENTION_CHOICES = ("auto", *ATTENTIONS)  # auto: gqa for a static cache where the head size allows it
FORMS = ("onnxruntime", "tensorrt")  # --form: which runtime the heads are written for (`heads` below)
GQA_HEAD_DIM_MULTIPLE = 8  # ONNX Runtime's GroupQueryAttention needs head_size % 8 == 0


@dataclass(frozen=True)
class GraphForm:
    kv_cache: str = "concat"
    attention: str = "standard"
    heads: str = "onnxruntime"

    def __post_init__(self) -> None:
        if self.heads not in FORMS:
            raise SpecpackError("invalid --form", expected=" or ".join(FORMS), found=repr(self.heads))
        if self.heads == "tensorrt" and (self.kv_cache, self.attention) != ("static", "standard"):
            raise SpecpackError("the tensorrt form needs the static KV cache with standard attention",
                                expected="--kv-cache static --attention standard (or auto)",
                                found=f"--kv-cache {self.kv_cache} --attention {self.attention}")
        if self.kv_cache not in KV_CACHES:
            raise SpecpackError("invalid --kv-cache", expected=" or ".join(KV_CACHES), found=repr(self.kv_cache))
        if self.attention not in ATTENTIONS:
            raise SpecpackError("invalid --attention", expected=" or ".join(ATTENTIONS), found=repr(self.attention))
        if self.kv_cache == "concat" and self.attention == "gqa":
            raise SpecpackError("GroupQueryAttention needs the static KV cache", expected="--kv-cache static with "
                                "--attention gqa", found="--kv-cache concat --attention gqa",
                                hint="pass --kv-cache static, or --attention standard")

    def check(self, head_dim: int) -> None:
        """A SpecpackError if this form cannot serve a model with `head_dim`."""
        if self.attention == "gqa" and head_dim % GQA_HEAD_DIM_MULTIPLE:
            raise SpecpackError("GroupQueryAttention needs a head size that is a multiple of 8",
                                expected=f"head_dim % {GQA_HEAD_DIM_MULTIPLE} == 0", found=f"head_dim {head_dim}",
                                hint="use --attention standard (or auto) for this model")

    def __str__(self) -> str:
        heads = ", TensorRT heads" if self.heads == "tensorrt" else ""
        return f"{self.kv_cache} KV cache, {self.attention} attention{heads}"


CONCAT = GraphForm("concat", "standard")


def resolve_form(kv_cache: str, attention: str, head_dim: int, heads: str = "onnxruntime") -> GraphForm:
    """The form for one model: `attention` "auto" is gqa for a static cache when head_dim allows it (standard
    for the tensorrt form)."""
    if attention == "auto" and heads == "tensorrt":
        attention = "standard"
    elif attention == "auto":
        gqa = kv_cache == "static" and head_dim % GQA_HEAD_DIM_MULTIPLE == 0
        attention = "gqa" if gqa else "standard"
    form = GraphForm(kv_cache, attention, heads)
    form.check(head_dim)
    return form


def head_attention(target_attention: str, kv_cache: str, max_tree_nodes: int, head_dim: int) -> str:
    """The head step's attention form: "gqa" (one GroupQueryAttention with the rotary inside) where the target's graph
    uses GroupQueryAttention, on the static cache, outside the tree form (whose own rows' positions and masks are
    data), for head_dim % 8 == 0; else "standard" (default-domain ops)."""
    gqa = (target_attention == "gqa" and kv_cache == "static" and not max_tree_nodes
           and head_dim % GQA_HEAD_DIM_MULTIPLE == 0)
    return "gqa" if gqa else "standard"
