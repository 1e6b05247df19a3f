"""`specpack serve` on the command line: the web libraries load only when serving; bad options exit 2."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import Live

from specpack.cli.main import cli
from specpack.serve.config import ServeConfig


def test_the_cli_does_not_import_the_web_libraries() -> None:
    code = ("import sys, specpack.cli.main; "
            "bad = [m for m in ('starlette', 'uvicorn', 'prometheus_client', 'fastapi') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_help_lists_the_options() -> None:
    result = CliRunner().invoke(cli, ["serve", "--help"])
    assert result.exit_code == 0
    for option in ("--host", "--port", "--device", "--k", "--max-queue", "--timeout", "--shutdown-grace", "--read-timeout",
                   "--max-connections"):
        assert option in result.output


def test_missing_pack_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and result.output.startswith("error:"), result.output


def test_k_above_the_packs_k_max_exits_2(live: Live) -> None:
    k_max = live.reference.manifest.k_max
    result = CliRunner().invoke(cli, ["serve", str(live.pack_dir), "--k", str(k_max + 1), "--port", "0"])
    assert result.exit_code == 2 and "invalid --k" in result.output and f"0..{k_max}" in result.output, result.output


def test_bad_option_values_exit_2() -> None:
    for args in (["--max-queue", "-1"], ["--timeout", "0"], ["--port", "70000"], ["--read-timeout", "0"],
                 ["--read-timeout", "nan"], ["--read-timeout", "1e9"], ["--max-connections", "0"],
                 ["--shutdown-grace", "inf"], ["--shutdown-grace", "nan"], ["--timeout", "inf"]):
        result = CliRunner().invoke(cli, ["serve", "PACK", *args])
        assert result.exit_code == 2 and "invalid --" in result.output, (args, result.output)


def test_device_reaches_the_runtime(live: Live) -> None:
    """--device picks the backend through specpack.load: cuda is refused by the runtime here (no CUDA EP, or
    not implemented yet), with its message and exit status 2, before anything listens."""
    result = CliRunner().invoke(cli, ["serve", str(live.pack_dir), "--device", "cuda", "--port", "0"])
    assert result.exit_code == 2 and "cuda" in result.output, result.output


def test_unknown_device_exits_2() -> None:
    result = CliRunner().invoke(cli, ["serve", "PACK", "--device", "tpu"])
    assert result.exit_code == 2 and "cpu" in result.output and "reference" in result.output, result.output


def test_a_port_in_use_or_a_bad_host_exits_2(live: Live) -> None:
    """The address is bound before uvicorn starts (which would log the error and exit 1 or 3)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", str(live.pack_dir), "--port", str(port)])
    assert result.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in result.output, result.output
    assert "--port" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(cli, ["serve", str(live.pack_dir), "--host", "256.1.1.1", "--port", "0"])
    assert result.exit_code == 2 and "cannot listen on --host 256.1.1.1" in result.output, result.output


@pytest.mark.parametrize(("text", "k"), [("auto", None), ("AUTO", None), ("0", 0), ("3", 3)])
def test_k_is_auto_or_a_number_as_for_generate(monkeypatch: pytest.MonkeyPatch, text: str, k: int | None) -> None:
    """--k auto (the default: adaptive k, Pack.generate's k=None) or a fixed N, parsed as `generate --k` is."""
    import specpack.serve.server as server

    seen: list[ServeConfig] = []
    monkeypatch.setattr(server, "serve", seen.append)
    result = CliRunner().invoke(cli, ["serve", "PACK", "--k", text])
    assert result.exit_code == 0 and seen[0].k == k, result.output
    result = CliRunner().invoke(cli, ["serve", "PACK", "--k", "many"])
    assert result.exit_code == 2 and "expected: an integer, or 'auto'" in result.output, result.output
    assert CliRunner().invoke(cli, ["serve", "--help"]).output.count("auto") >= 1


def test_max_body_bytes_is_checked() -> None:
    result = CliRunner().invoke(cli, ["serve", "PACK", "--max-body-bytes", "0"])
    assert result.exit_code == 2 and "invalid --max-body-bytes" in result.output, result.output


def test_a_port_in_use_is_refused_before_the_pack_loads(tmp_path: Path) -> None:
    """The address is bound first: with no pack at all, a busy port is still the error (the pack was never opened)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", str(tmp_path / "no-pack-here"), "--port", str(port)])
    assert result.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in result.output, result.output
    assert "no pack at" not in result.output and "Traceback" not in result.output


def test_serve_says_its_url_and_model_name_once_listening(live: Live) -> None:
    """One line with the OpenAI base URL (the real port, here picked by --port 0) and the model name to send."""
    import json
    import os
    import re
    import select
    import signal
    import time
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "specpack", "serve", str(live.pack_dir), "--port", "0",
                             "--model-name", "my-model"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = b""
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        found = None
        while found is None and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                seen += os.read(proc.stdout.fileno(), 65536)  # unbuffered: select sees every byte not yet read
                found = re.search(r"listening on (http://127\.0\.0\.1:(\d+)/v1) \(OpenAI base_url\), model \"my-model\"",
                                  seen.decode(errors="replace"))
        assert found is not None and found.group(2) != "0", seen.decode(errors="replace")
        with urllib.request.urlopen(found.group(1) + "/models", timeout=30) as response:
            assert [m["id"] for m in json.load(response)["data"]] == ["my-model"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
