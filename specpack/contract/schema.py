"""The manifest schema as a JSON Schema document, generated from specpack.contract.manifest (the one definition).

    python -m specpack.contract.schema > docs/manifest.schema.json

tests/deploy/test_schema.py fails when the committed file differs from what this prints.
"""

from __future__ import annotations

import json
from typing import Any

from specpack.contract.manifest import JSON_DEPTH_LIMIT, MANIFEST_BYTES_LIMIT, Manifest

SCHEMA_FILE = "docs/manifest.schema.json"
RULES = [  # what JSON Schema cannot say; Manifest's validators enforce these too
    "`draft` is present exactly when `drafter` is \"model\"",
    "each graph's KV inputs are past_key_values.{i}.key|value and its outputs present.{i}.key|value for i < num_layers, "
    "shaped [batch, kv_heads, length, head_dim] in the model's dtype",
    "each graph has the inputs and outputs the runtime binds (names in specpack/names.py); `probs` and "
    "`draft_probs` are vocab_size wide",
    "vocab_size <= each model's vocab_rows; max_len <= each model's max_positions; every eos id < vocab_size",
    "every file the runtime opens (graphs, data_files, tokenizer/tokenizer.json, tokenizer/tokenizer_config.json, "
    "tokenizer_files, engines) is listed in `files`; no path is listed twice; manifest.json is not listed",
    "no engine names a graph's, an external data file's or a tokenizer file's path",
    "a model's `batched` graph is a torch graph of the static standard-attention form with positions as inputs and "
    "no tree, has the past / present KV tensors of its num_layers, the outputs of its head (verify: n_accepted, "
    "next_token; greedy: best) and its batch `inputs`, and its quantization method is the model's (none when absent)",
    f"the file is UTF-8 JSON of at most {MANIFEST_BYTES_LIMIT} bytes, nested at most {JSON_DEPTH_LIMIT} deep, "
    "without duplicate keys, NaN or Infinity (nor numbers past a float's range, such as 1e999)",
]


def manifest_json_schema() -> dict[str, Any]:
    schema = Manifest.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "specpack pack manifest (manifest.json)"
    schema["description"] = ("What a specpack pack holds. Generated from specpack/contract/manifest.py; "
                             "also enforced there: " + "; ".join(RULES) + ".")
    return schema


def render() -> str:
    return json.dumps(manifest_json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(render(), end="")
