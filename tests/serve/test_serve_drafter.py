"""Who drafts for the server: `specpack serve --drafter` (default: the pack's own), the n-gram range options shared
with `generate`, and the per-request extension field `drafter`; a drafter the pack lacks is refused."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
from click.testing import CliRunner
from conftest import MODEL, Live

import specpack
from specpack.cli.main import cli
from specpack.runtime.ngram_drafter import NgramConfig
from specpack.serve.app import build_app
from specpack.serve.config import ServeConfig
from specpack.serve.server import serve_in_thread

PROMPT = "a b c d a b c d a b c d a b"  # repeats: the n-gram drafter finds matches
N = 16


@pytest.fixture(scope="module")
def ngram_url(live: Live) -> Iterator[str]:
    """A second live server over the same pack, started as `specpack serve --drafter ngram --ngram-min 1`."""
    config = ServeConfig(live.pack_dir, drafter="ngram", ngram=NgramConfig(1, 3), model_name=MODEL)
    pack = specpack.load(live.pack_dir, ngram=config.ngram)
    with serve_in_thread(build_app(pack, config)) as url:
        yield url
    pack.close()


def test_drafter_ngram_equals_pack_generate(live: Live, ngram_url: str) -> None:
    """Greedy output through the official client equals Pack.generate(..., drafter="ngram"), streamed or not."""
    reference = specpack.load(live.pack_dir, ngram=NgramConfig(1, 3))
    client = openai.OpenAI(base_url=f"{ngram_url}/v1", api_key="unused", max_retries=0, timeout=60)
    try:
        want = reference.generate(PROMPT, N, drafter="ngram")
        assert want.stats["proposed"] > 0  # the n-gram drafter did draft
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0)
        assert out.choices[0].text == want.text
        assert out.model_extra["speculation"]["drafter"] == "ngram"
        chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
        # a request may still ask for the model drafter (this pack has one)
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0,
                                        extra_body={"drafter": "model"})
        assert out.choices[0].text == reference.generate(PROMPT, N, drafter="model").text
        assert out.model_extra["speculation"]["drafter"] == "model"
    finally:
        client.close()
        reference.close()


def test_request_drafter_extension(client: openai.OpenAI, live: Live) -> None:
    """`drafter` as an extension field (extra_body), as top_k; the default is the pack's own."""
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0,
                                    extra_body={"drafter": "ngram"})
    assert out.choices[0].text == live.reference.generate(PROMPT, N, drafter="ngram").text
    assert out.model_extra["speculation"]["drafter"] == "ngram"
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0)
    assert out.model_extra["speculation"]["drafter"] == live.reference.manifest.drafter == "model"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, extra_body={"drafter": "eagle"})
    assert info.value.param == "drafter" and "unknown drafter 'eagle'" in info.value.message
    assert "model | ngram" in info.value.message


def test_a_drafter_the_pack_lacks_is_refused(tiny_ngram_pack: Callable[..., tuple[Path, Path]]) -> None:
    """A pack of the target alone: `--drafter model` exits 2 at startup; a request asking for it gets a 400."""
    pack_dir = tiny_ngram_pack("qwen2")[0]
    result = CliRunner().invoke(cli, ["serve", str(pack_dir), "--drafter", "model", "--port", "0"])
    assert result.exit_code == 2 and "this pack has no draft model" in result.output, result.output
    assert "use --drafter ngram" in result.output and "Traceback" not in result.output
    pack = specpack.load(pack_dir)
    with serve_in_thread(build_app(pack, ServeConfig(pack_dir, model_name=MODEL))) as url, \
            openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
        assert out.model_extra["speculation"]["drafter"] == "ngram"
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, extra_body={"drafter": "model"})
        assert info.value.status_code == 400 and info.value.param == "drafter"
        assert "this pack has no draft model" in info.value.message
    pack.close()


def test_drafter_and_ngram_options_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same option definitions as `generate` (specpack/cli/options.py), checked by NgramConfig."""
    import specpack.serve.server as server

    seen: list[ServeConfig] = []
    monkeypatch.setattr(server, "serve", seen.append)
    result = CliRunner().invoke(cli, ["serve", "PACK", "--drafter", "ngram", "--ngram-min", "1", "--ngram-max", "5"])
    assert result.exit_code == 0, result.output
    assert seen[0].drafter == "ngram" and seen[0].ngram == NgramConfig(1, 5)
    result = CliRunner().invoke(cli, ["serve", "PACK"])
    assert seen[1].drafter is None and seen[1].ngram == NgramConfig()
    result = CliRunner().invoke(cli, ["serve", "PACK", "--ngram-min", "4", "--ngram-max", "2"])
    assert result.exit_code == 2 and "invalid n-gram range" in result.output, result.output
    result = CliRunner().invoke(cli, ["serve", "PACK", "--drafter", "eagle"])
    assert result.exit_code == 2 and "'model', 'ngram'" in result.output, result.output
    serve_help, generate_help = (CliRunner().invoke(cli, [c, "--help"]).output for c in ("serve", "generate"))
    for option in ("--drafter", "--ngram-min", "--ngram-max"):
        assert option in serve_help and option in generate_help


def test_request_tree_extension(client: openai.OpenAI, live: Live) -> None:
    """`tree` as an extension field ("auto" | "off" | N), checked as Pack.generate checks it: this pack has no tree
    verify graph, so "auto" and "off" draft chains and a fixed tree is a 400; `serve --tree 4` exits 2 at startup."""
    for tree in ("auto", "off"):
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0,
                                        extra_body={"drafter": "ngram", "tree": tree})
        assert out.choices[0].text == live.reference.generate(PROMPT, N, drafter="ngram").text
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, extra_body={"tree": "wide"})
    assert info.value.param == "tree" and "invalid tree" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, extra_body={"drafter": "ngram", "tree": 4})
    assert "a fixed tree needs a pack whose verify graph takes trees" in info.value.message
    result = CliRunner().invoke(cli, ["serve", str(live.pack_dir), "--tree", "4", "--drafter", "ngram", "--port", "0"])
    assert result.exit_code == 2 and "a fixed tree needs a pack" in result.output, result.output
    result = CliRunner().invoke(cli, ["serve", str(live.pack_dir), "--tree", "wide", "--port", "0"])
    assert result.exit_code == 2 and "invalid --tree" in result.output, result.output
