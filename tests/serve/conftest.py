"""One live server over the tiny qwen2 pack for all serve tests, and an official `openai` client for it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from serve_harness import SlowPack

import specpack
from specpack.serve.app import build_app
from specpack.serve.config import ServeConfig
from specpack.serve.server import serve_in_thread

MODEL = "tiny"


@dataclass
class Live:
    url: str              # http://127.0.0.1:PORT
    pack: SlowPack        # the pack the server decodes with
    reference: Any        # a second load of the same pack, for the expected outputs
    app: Any
    pack_dir: Path

    def client(self, **options: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=60, **options)

    @property
    def decoder(self) -> Any:
        return self.app.state.decoder


@pytest.fixture(scope="session")
def live(tiny_pack: Callable[..., tuple[Path, Path, Path]]) -> Iterator[Live]:
    pack_dir = tiny_pack("qwen2", "noisy")[0]
    pack = SlowPack(specpack.load(pack_dir))
    reference = specpack.load(pack_dir)
    app = build_app(pack, ServeConfig(pack_dir, max_queue=1, model_name=MODEL))
    with serve_in_thread(app) as url:
        yield Live(url, pack, reference, app, pack_dir)
    pack.close()
    reference.close()


@pytest.fixture
def client(live: Live) -> Iterator[openai.OpenAI]:
    live.pack.delay = 0.0
    with live.client() as c:
        yield c
    live.pack.delay = 0.0
