"""docs/manifest.schema.json is generated from the code: the committed file must be what the code prints now."""

from __future__ import annotations

import json
from pathlib import Path

from specpack.contract.schema import SCHEMA_FILE, render

ROOT = Path(__file__).resolve().parents[2]


def test_committed_json_schema_is_up_to_date() -> None:
    committed = (ROOT / SCHEMA_FILE).read_text(encoding="utf-8")
    assert committed == render(), f"regenerate it: python -m specpack.contract.schema > {SCHEMA_FILE}"


def test_json_schema_describes_the_manifest_fields() -> None:
    schema = json.loads(render())
    assert {"draft", "target", "files", "eos_token_ids", "max_len", "engines", "drafter"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["FileEntry"]["properties"]["sha256"]["pattern"] == "^[0-9a-f]{64}$"
