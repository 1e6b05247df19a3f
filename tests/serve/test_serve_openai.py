"""The official `openai` client against a live server: greedy output equals Pack.generate, streamed or not."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlparse

import openai
import pytest
from conftest import MODEL, Live

PROMPT = "def fibonacci(n):\n    "
MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "Seven."},
    {"role": "user", "content": "Another one?"},
]
N = 24


def expected(live: Live, prompt: str | list[int], n: int = N) -> tuple[str, str, int]:
    """(text, finish_reason, completion tokens) of the same greedy request through Pack.generate."""
    out = live.reference.generate(prompt, n)
    eos = bool(out.tokens) and out.tokens[-1] in live.reference.manifest.eos_token_ids
    return out.text, "stop" if eos else "length", len(out.tokens)


def chat_ids(live: Live) -> list[int]:
    return live.reference.tokenizer.encode_messages(MESSAGES)


def test_models_lists_the_served_pack(client: openai.OpenAI, live: Live) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_models_retrieve_gives_the_served_model(client: openai.OpenAI, live: Live) -> None:
    """GET /v1/models/{id}: the same model object as the list's."""
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.object == "model" and model.owned_by == "specpack"
    assert model.model_dump() == client.models.list().data[0].model_dump()


def test_completion_equals_pack_generate(client: openai.OpenAI, live: Live) -> None:
    text, finish, n_tokens = expected(live, PROMPT)
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0)
    assert out.choices[0].text == text
    assert out.choices[0].finish_reason == finish
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(live.reference.encode(PROMPT)), n_tokens)
    spec = out.model_extra["speculation"]
    assert spec["k"] == live.reference.manifest.k_max and 0 <= spec["alpha"] <= 1 and spec["tau"] >= 1


def test_completion_stream_equals_pack_generate(client: openai.OpenAI, live: Live) -> None:
    text, finish, n_tokens = expected(live, PROMPT)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == finish
    assert sum(1 for c in chunks if c.choices and c.choices[0].text) > 1  # streamed in pieces, not at once
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == n_tokens
    assert chunks[-2].model_extra["speculation"]["tau"] >= 1


def test_completion_of_token_ids(client: openai.OpenAI, live: Live) -> None:
    ids = live.reference.encode(PROMPT)
    out = client.completions.create(model=MODEL, prompt=ids, max_tokens=N, temperature=0)
    assert out.choices[0].text == expected(live, ids)[0]


def test_chat_equals_pack_generate_over_the_chat_template(client: openai.OpenAI, live: Live) -> None:
    text, finish, n_tokens = expected(live, chat_ids(live))
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=N, temperature=0)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == text
    assert out.choices[0].finish_reason == finish
    assert out.usage is not None and out.usage.prompt_tokens == len(chat_ids(live))
    assert out.usage.completion_tokens == n_tokens


def test_developer_role_is_the_system_prompt_for_a_template_that_does_not_name_it(client: openai.OpenAI,
                                                                                    live: Live) -> None:
    """OpenAI's "developer" role reaches the model as "system" (the Qwen2.5 template drops roles it does not know)."""
    assert "developer" not in (live.reference.tokenizer.chat_template or "")
    as_developer = [{"role": "developer", "content": MESSAGES[0]["content"]}, *MESSAGES[1:]]
    text, _, _ = expected(live, chat_ids(live))
    out = client.chat.completions.create(model=MODEL, messages=as_developer, max_tokens=N, temperature=0)  # type: ignore[arg-type]
    assert out.usage is not None and out.usage.prompt_tokens == len(chat_ids(live))
    assert out.choices[0].message.content == text


def test_template_roles_keep_developer_where_the_template_names_it() -> None:
    from specpack.serve.app import _template_roles
    from tests.runtime.test_chat_template import QWEN25_TEMPLATE

    assert _template_roles(QWEN25_TEMPLATE) == {"developer": "system"}
    assert _template_roles("{% if message.role == 'developer' %}{% endif %}") == {}


def test_chat_stream_equals_pack_generate(client: openai.OpenAI, live: Live) -> None:
    text, finish, _ = expected(live, chat_ids(live))
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=N, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == finish


def test_stream_is_server_sent_events_ending_with_done(live: Live) -> None:
    url = urlparse(live.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type", "").startswith("text/event-stream")
    events = [line for line in resp.read().decode().split("\n\n") if line]
    conn.close()
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")
    assert all("usage" not in json.loads(e[6:]) for e in events[:-1])  # no include_usage: no usage key


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_include_usage_gives_null_usage_on_every_chunk_but_the_last(live: Live, path: str) -> None:
    """OpenAI's stream_options.include_usage: the extra last chunk has usage and empty choices; every other chunk
    carries "usage": null."""
    url = urlparse(live.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    body = {"model": MODEL, "max_tokens": 6, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            **({"prompt": PROMPT} if path == "/v1/completions" else {"messages": MESSAGES})}
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    events = [line for line in conn.getresponse().read().decode().split("\n\n") if line]
    conn.close()
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert events[-1] == "data: [DONE]" and len(chunks) >= 2
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1]), chunks


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_ends_the_output_before_it_and_the_decode_within_one_step(client: openai.OpenAI, live: Live,
                                                                              stream: bool) -> None:
    full = live.reference.generate(PROMPT, 48)
    assert len(full.text) > 12, "the tiny model should produce some text"
    stop = full.text[8:11]
    want = full.text[: full.text.find(stop)]
    # the fewest tokens whose text holds the stop string: the decode may end at most one step (k + 1 tokens) later
    n_stop = next(n for n in range(1, len(full.tokens) + 1) if stop in live.reference.tokenizer.decode(full.tokens[:n]))
    if stream:
        chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=48, temperature=0,
                                                stop=[stop, "never-there"], stream=True,
                                                stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = chunks[-2].choices[0].finish_reason
        usage = chunks[-1].usage
        speculation = chunks[-2].model_extra["speculation"]
    else:
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=48, temperature=0, stop=stop)
        text, finish, usage = out.choices[0].text, out.choices[0].finish_reason, out.usage
        speculation = out.model_extra["speculation"]
    assert text == want
    assert finish == "stop"
    k_max = live.reference.manifest.k_max
    assert usage is not None and n_stop <= usage.completion_tokens <= n_stop + k_max
    assert usage.completion_tokens < len(full.tokens)
    assert speculation["tau"] >= 1  # the runtime returned its statistics


def test_a_stop_string_that_never_comes_changes_nothing(client: openai.OpenAI, live: Live) -> None:
    text, finish, _ = expected(live, PROMPT)
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0, stop=["\x00never\x00"])
    assert (out.choices[0].text, out.choices[0].finish_reason) == (text, finish)


def test_sampling_with_a_seed_is_reproducible_and_matches_the_pack(client: openai.OpenAI, live: Live) -> None:
    options = {"temperature": 0.8, "top_p": 0.9, "seed": 7}
    want = live.reference.generate(PROMPT, N, top_k=20, **options).text
    outs = [client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, extra_body={"top_k": 20}, **options)
            for _ in range(2)]
    assert [o.choices[0].text for o in outs] == [want, want]


def test_health(live: Live) -> None:
    url = urlparse(live.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.request("GET", "/health")
    resp = conn.getresponse()
    assert (resp.status, json.loads(resp.read())) == (200, {"status": "ok"})
    conn.close()
