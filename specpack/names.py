"""Names of every graph input and output: the contract between export/, graphs/, deploy/ and runtime/.

Graphs are bound by these names, never by position.

Plain forward graph (export/, optimum convention), batch B = 1 in practice:
    input_ids                      int64 [B, S]
    position_ids                   int64 [B, S]    (absent from graphs that compute positions from the
                                                   static mask: the manifest's positions "internal")
    attention_mask                 int64 [B, L + S]
    past_key_values.{i}.key|value  dtype [B, kv_heads, L, head_dim]
    -> logits                      dtype [B, S, V]
    -> present.{i}.key|value       dtype [B, kv_heads, L + S, head_dim]

Draft step graph (graphs/draft_step.onnx): the plain inputs, plus the sampling inputs below
    -> token                       int64 [1]       drawn from the last position
    -> probs                       fp32  [1, V]    q: exactly the distribution `token` was drawn from
    -> present.*

Verify graph (graphs/verify.onnx): the plain inputs, where input_ids ends with the k draft tokens, plus
    draft_probs                    fp32  [1, k, V] q of each draft token (k = 0: prefill / plain AR step)
    uniforms                       fp32  [1, k+1]  u_1..u_k for the acceptance tests, u_{k+1} for the next draw
    and the sampling inputs below
    -> n_accepted                  int64 [1]       number of leading draft tokens accepted
    -> next_token                  int64 [1]       correction at the first rejection, or the bonus token
    -> present.*                   (the caller keeps the first L + S - k + n_accepted positions)

Head packs (spec-export --draft-head; docs/heads.md): the verify graph also outputs
    -> target_features             dtype [1, S, F] the residual stream entering the head's tapped layers, concatenated
                                   (F = taps x hidden), for every one of the run's S rows
head_step.onnx (the draft head's step; concat KV cache of one layer), the draft step's sampling inputs, plus
    input_ids                      int64 [1, C]    x_{t+1} of C rows read from the target's features
    features                       dtype [1, C, F] target_features of those rows
    draft_ids                      int64 [1, W]    x_{t+1} of W rows read from the head's own output (W = 0 or 1)
    hidden_in                      dtype [1, W, H] hidden_out of the run before
    past_key_values.0.key|value    dtype [1, kv_heads, L, head_dim]   (no attention_mask, no position_ids: row r is
                                                   at position L + r, causal)
    -> token, probs                as the draft step (probs: zeros outside the head's vocabulary subset)
    -> hidden_out                  dtype [1, 1, H] the last row's output, the next run's hidden_in
    -> present.0.key|value         dtype [1, kv_heads, L + C + W, head_dim]

Static KV cache form (kv_cache "static" in the manifest; export/graph_form.py), the same names, batch 1:
    attention_mask                 int64 [1, M]    ones at [0, L + S), zeros after: the valid length as data
    past_key_values.{i}.key|value  dtype [1, kv_heads, M, head_dim]   M = max_len, allocated once
    -> present.{i}.key|value       dtype [1, kv_heads, M, head_dim]   bound onto the past buffer: the graph
                                   writes rows [L, L + S) in place; rollback is a length update (L changes)
    so every run over S new tokens has the same shapes and buffer addresses (runtime/static_kv_cache.py).

Tree verify graph (verify.onnx of a pack exported with --max-tree-nodes T_max; docs/trees.md): the plain inputs,
where the last T rows of input_ids are a token tree's nodes and the row before them its root, plus
    parents                        int64 [1, T]    each node's parent (parents[i] < i), -1: the root; T <= T_max
    uniforms                       fp32  [1, T+1]  u[i] node i's test, u[T] the final draw
    and the sampling inputs below (no draft_probs: the deterministic rule, exact for any candidates)
    -> n_accepted, next_token
    -> path                        int64 [1, T+1]  the accepted rows, root first (0, node + 1 ...), -1 padded
    -> present.*                   (then kv_compact.onnx over `path`: the caller keeps L_root + n_accepted + 1)

Sampling inputs (both graphs); temperature 0 is greedy:
    temperature                    fp32  [1]
    top_k                          int64 [1]       0 disables
    top_p                          fp32  [1]       1.0 disables
    uniform                        fp32  [1]       (draft step only) the draw's uniform number
"""

from __future__ import annotations

INPUT_IDS = "input_ids"
POSITION_IDS = "position_ids"
ATTENTION_MASK = "attention_mask"
LOGITS = "logits"

TEMPERATURE = "temperature"
TOP_K = "top_k"
TOP_P = "top_p"
UNIFORM = "uniform"
TOKEN = "token"
PROBS = "probs"

DRAFT_PROBS = "draft_probs"
UNIFORMS = "uniforms"
N_ACCEPTED = "n_accepted"
NEXT_TOKEN = "next_token"
PARENTS = "parents"  # tree verify (graphs/tree_head.py): int64 [1, T], each node's parent, -1 the root
PATH = "path"  # tree verify: int64 [1, T+1], the accepted rows, root first, -1 padded
DRAFT_COUNTS = "draft_counts"  # batched verify (graphs/batched_head.py): int64 [B], the drafts row b verifies (k_b)
BEST = "best"  # the batched greedy head (graphs/batched_head.py): int64 [B, K+1], the argmax at each row's last k_b + 1 positions
TOKEN_COUNTS = "token_counts"  # batched verify: int64 [B], row b's real new tokens (the rest of its S are padding)

TARGET_FEATURES = "target_features"
PAST_TARGET_FEATURES = "past_target_features"  # static head packs: the features cache [1, 1, M, F] the verify writes
FEATURES = "features"
DRAFT_IDS = "draft_ids"
HIDDEN_IN = "hidden_in"
HIDDEN_OUT = "hidden_out"
# a head step for token trees (--draft-head with --max-tree-nodes; docs/heads.md, "Trees drafted by the head"); a tree
# pack's draft_step.onnx too (a draft model's tree form, docs/trees.md: its own rows are its last W input rows, and it
# has no tree_hidden)
DRAFT_POSITIONS = "draft_positions"  # int64 [1, W]: each own row's position (chains: its cache row)
DRAFT_MASK = "draft_mask"            # bool [1, W, M]: the cache rows each own row may read (AND the causal mask)
TREE_TOKENS = "tree_tokens"          # int64 [1, W + 1, K]: each own row's (then the last row's) top-K tokens
TREE_LOGPROBS = "tree_logprobs"      # fp32 [1, W + 1, K]: their log-probabilities (the head's, the draft's; temp. 1)
TREE_HIDDEN = "tree_hidden"          # [1, W + 1, H]: those rows' outputs o (a child row's hidden_in)

DRAFT_STEP_FILE = "draft_step.onnx"
HEAD_STEP_FILE = "head_step.onnx"
VERIFY_FILE = "verify.onnx"
BATCHED_FILES = {"target": "verify_batched.onnx", "draft": "draft_batched.onnx"}  # --max-batch (docs/batching.md)
KV_COMPACT_FILE = "kv_compact.onnx"  # tree packs: moves the accepted path's cache rows into place (graphs/kv_compact.py)
TOKENIZER_DIR = "tokenizer"  # the pack's tokenizer folder (runtime/tokenizer.py reads TOKENIZER_LOADED_FILES from it)
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
TOKENIZER_LOADED_FILES = (TOKENIZER_CONFIG_FILE, TOKENIZER_FILE)  # every file PackTokenizer.load opens: the manifest
                                                                  # must list them


def past_name(layer: int, kind: str) -> str:
    """`past_key_values.{layer}.key` or `.value`."""
    return f"past_key_values.{layer}.{kind}"


def present_name(layer: int, kind: str) -> str:
    """`present.{layer}.key` or `.value`."""
    return f"present.{layer}.{kind}"


def kv_names(num_layers: int, prefix: str) -> list[str]:
    """All cache names in layer order, key before value; prefix is "past" or "present"."""
    make = past_name if prefix == "past" else present_name
    return [make(i, kind) for i in range(num_layers) for kind in ("key", "value")]
