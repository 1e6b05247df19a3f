"""`specpack inspect` on hostile free-form manifest fields: printable, escaped output; exit 0, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specpack.cli.main import cli
from specpack.contract.manifest import MANIFEST_FILE
from tests.deploy.manifests import valid_manifest


def _inspect(tmp_path: Path, raw: dict[str, Any]) -> str:
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(raw))
    result = CliRunner().invoke(cli, ["inspect", str(tmp_path)])
    assert result.exit_code == 0 and result.exception is None, result.output
    assert all(c.isprintable() or c == "\n" for c in result.output), repr(result.output)
    return result.output


def _int4(**details: Any) -> dict[str, Any]:
    return {"method": "int4", "quantizer": "q", "bytes_before": 10, "bytes_after": 5, "summary": {"int4": 1},
            "tensors": [{"tensor": "w", "path": "kept", "why": "small"}], **details}


@pytest.mark.parametrize("hostile", ["\x1b]0;owned\x07", "\x1b[2J\x1b[H", "\u202egnp.exe", "a\u2066b\u2069", "\x9b31m"])
def test_escape_sequences_and_bidi_overrides_in_free_form_fields_are_escaped(tmp_path: Path, hostile: str) -> None:
    raw = valid_manifest()
    raw["target"]["quantization"] = _int4(quantizer=hostile, tensors=[{"tensor": "w", "path": "kept", "why": hostile}])
    assert "target: int4" in _inspect(tmp_path, raw)


def test_bidi_overrides_in_a_source_are_escaped(tmp_path: Path) -> None:
    raw = valid_manifest()
    raw["draft"]["source"]["source"] = "models/\u202eevil\u202c"  # the schema allows it: not a control character
    assert "\u202e" not in _inspect(tmp_path, raw)  # shown escaped (the table may fold it across lines)


@pytest.mark.parametrize(("role", "details"), [
    ("target", {"bytes_before": 10**400}),
    ("draft", {"fidelity": {"by_k": {"2": {"quantized": {"alpha": 10**400}, "reference": {"alpha": 0.5}}}}}),
])
def test_huge_integers_in_free_form_records(tmp_path: Path, role: str, details: dict[str, Any]) -> None:
    raw = valid_manifest()
    raw[role]["quantization"] = _int4(**details)
    assert f"{role}: int4" in _inspect(tmp_path, raw)
