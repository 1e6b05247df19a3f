"""Limits shared by export, the runtime, the CLI and bench: each is defined here once (docs/contracts.md).

    k at export     a pack's k_max, the most drafts one verify takes:  K_MIN..K_MAX (1..16)
    k at run time   drafts per step for one request:                   0..the pack's k_max (0: the target alone),
                    or "auto" (K_AUTO; None in the Python API): adaptive, the default
    dtypes          the graph dtypes spec-export writes                specpack/dtypes.py (DTYPES, the one table)
    tree nodes      a tree pack's most nodes per verify                1..TREE_NODES_MAX (spec-export --max-tree-nodes;
                    0: no tree, the default)
    tree at run     token trees for one request                        "auto" (TREE_AUTO, the default: the tree policy
                    time                                               where the pack and drafter verify trees), "off"
                                                                       (TREE_OFF: chains), or N, a fixed node budget
                                                                       in 1..the pack's max tree nodes
"""

from __future__ import annotations

from typing import Final, Literal

import numpy as np

from specpack.dtypes import numpy_dtype  # its home is dtypes.py (the dtype table); the backends import it from here
from specpack.errors import SpecpackError

__all__ = [
    "DEFAULT_K",
    "DEFAULT_MAX_LEN",
    "DRAFTERS",
    "K_AUTO",
    "K_MAX",
    "K_MIN",
    "PROMPT_FILE_BYTES",
    "PROMPT_SET_BYTES",
    "TREE_AUTO",
    "TREE_OFF",
    "QuantizationMode",
    "TreeOption",
    "check_export_k",
    "check_k",
    "check_tree",
    "numpy_dtype",
    "parse_k",
    "parse_tree",
]

K_MIN, K_MAX = 1, 16       # a pack's k_max (spec-export --k)
DEFAULT_K = 4              # spec-export's default k_max
TREE_NODES_MAX = 64        # spec-export --max-tree-nodes: the most nodes a tree verify graph is built for (docs/trees.md)
TREE_WIDTH_MAX = 8         # K of a tree-drafting step graph's TopK (a draft head's, a draft model's): the most children
                           # a node of a drafted tree gets
K_AUTO = "auto"            # run-time k chosen per step (runtime/adaptive_k.py)
TREE_AUTO: Final = "auto"  # run-time tree: the tree policy (runtime/tree_policy.py)
TREE_OFF: Final = "off"    # run-time tree: chains
DRAFTERS = ("model", "ngram", "head")  # who drafts: the pack's draft model, prompt lookup (runtime/ngram_drafter.py),
                                       # or the pack's draft head (docs/heads.md)
# a pack's quantization modes, named once: the manifest's Quantization.method; quantize/modes.py says what each means
TreeOption = Literal["auto", "off"] | int  # a request's tree: TREE_AUTO, TREE_OFF or a node budget
QuantizationMode = Literal["none", "int8", "int4", "gguf", "int8-sq", "fp8"]
DEFAULT_MAX_LEN = 2048     # spec-export's default max length (capped by the models' position limits)
PROMPT_FILE_BYTES = 4 << 20    # generate --prompt-file: 262,144 tokens (the largest max_len) are about 1 MiB of text
PROMPT_SET_BYTES = 64 << 20    # one bench --prompts file, after decompression (Spec-Bench's is 0.7 MB)


def check_export_k(k: object) -> int:
    """A pack's k_max: an integer in K_MIN..K_MAX."""
    if isinstance(k, bool) or not isinstance(k, int) or not K_MIN <= k <= K_MAX:
        raise SpecpackError("invalid --k", expected=f"an integer in {K_MIN}..{K_MAX}", found=repr(k))
    return k


def check_tree_nodes(nodes: object) -> int:
    """A pack's most tree nodes per verify: 0 (no tree verify graph) or an integer in 1..TREE_NODES_MAX."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 0 <= nodes <= TREE_NODES_MAX:
        raise SpecpackError("invalid --max-tree-nodes", expected=f"an integer in 1..{TREE_NODES_MAX} (0: no tree)",
                            found=repr(nodes))
    return nodes


def check_k(k: object, k_max: int = K_MAX, *, minimum: int = 0, what: str = "k") -> int:
    """Drafts per step at run time: an integer (Python or numpy) in minimum..k_max, k_max being the pack's
    (K_MAX, any pack's largest, before a pack is loaded); 0 is the target alone."""
    whose = "this pack's k_max" if k_max < K_MAX else "the largest k_max"
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or not minimum <= k <= k_max:
        alone = "; 0: the target alone" if minimum == 0 else ""
        raise SpecpackError(f"invalid {what}", expected=f"an integer in {minimum}..{k_max} ({whose}{alone})",
                            found=repr(k), hint="re-export with a larger --k for more drafts per step")
    return int(k)


def parse_k(text: str, what: str = "--k") -> int | None:
    """A command line's k: "auto" -> None (adaptive), else an integer (its range is checked by check_k)."""
    if text.strip().lower() == K_AUTO:
        return None
    try:
        return int(text)
    except ValueError:
        raise SpecpackError(f"invalid {what}", expected=f"an integer, or {K_AUTO!r}", found=repr(text)) from None



def check_tree(tree: object, max_nodes: int | None = None) -> TreeOption:
    """A request's tree: "auto", "off" or a node budget N (Python or numpy integer), 1..max_nodes, a loaded pack's most
    tree nodes (0: the pack has no tree verify graph, where only "auto" and "off" are accepted; None: before a pack is
    known, 1..TREE_NODES_MAX)."""
    if isinstance(tree, str) and tree in (TREE_AUTO, TREE_OFF):
        return TREE_AUTO if tree == TREE_AUTO else TREE_OFF
    if isinstance(tree, (bool, np.bool_)) or not isinstance(tree, (int, np.integer)):
        raise SpecpackError("invalid tree", expected=f"{TREE_AUTO!r}, {TREE_OFF!r} or a node budget (an integer)",
                            found=repr(tree)[:80])
    if max_nodes == 0:
        raise SpecpackError("a fixed tree needs a pack whose verify graph takes trees",
                            expected=f"tree {TREE_AUTO!r} or {TREE_OFF!r} for this pack (no tree verify graph)",
                            found=f"tree {int(tree)}",
                            hint="re-export with --kv-cache static --max-tree-nodes 16 (docs/trees.md), or use "
                                 f"--tree {TREE_OFF}")
    top = TREE_NODES_MAX if max_nodes is None else max_nodes
    if not 1 <= tree <= top:
        whose = "the largest a pack takes" if max_nodes is None else "this pack's max tree nodes"
        raise SpecpackError("invalid tree", expected=f"a node budget in 1..{top} ({whose}), {TREE_AUTO!r} or "
                            f"{TREE_OFF!r}", found=repr(int(tree)),
                            hint="re-export with a larger --max-tree-nodes for bigger trees")
    return int(tree)


def parse_tree(text: str, what: str = "--tree") -> TreeOption:
    """A command line's tree: "auto", "off" or an integer (its range is checked by check_tree)."""
    word = text.strip().lower()
    if word in (TREE_AUTO, TREE_OFF):
        return check_tree(word)
    try:
        return int(word)
    except ValueError:
        raise SpecpackError(f"invalid {what}", expected=f"{TREE_AUTO!r}, {TREE_OFF!r} or a node budget (an integer)",
                            found=repr(text)) from None
