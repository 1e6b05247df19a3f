"""One decode at a time: a full queue answers 429, a client that leaves frees the decoder, requests time out."""

from __future__ import annotations

import threading
import time

import openai
import pytest
from conftest import MODEL, Live
from serve_harness import metric, wait_until

PROMPT = "def fibonacci(n):\n    "
LONG = 200  # max_tokens of a request meant to be interrupted: greedy (temperature 0), so it runs to its length (a
            # sampled one can draw the end of text within a few tokens and finish before the test acts: a 200 where
            # a 504 was due, once in a CI run, 2026-12-07)


def scrape(client: openai.OpenAI, live: Live, name: str) -> float:
    text = client.with_options(base_url=live.url).get("/metrics", cast_to=str)
    return metric(text, name)


def test_client_that_disconnects_mid_stream_frees_the_server(client: openai.OpenAI, live: Live) -> None:
    before = scrape(client, live, 'specpack_requests_cancelled_total{reason="disconnect"}')
    live.pack.delay = 0.02
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=LONG, temperature=0, stream=True)
    chunks = [next(stream) for _ in range(3)]
    assert "".join(c.choices[0].text for c in chunks)
    stream.close()
    # generation stops within a step and the decoder is free again
    assert wait_until(lambda: scrape(client, live, "specpack_running_requests") == 0, timeout=5)
    assert scrape(client, live, 'specpack_requests_cancelled_total{reason="disconnect"}') == before + 1
    assert live.pack.pieces < 40, f"the decode went on after the client left: {live.pack.pieces} pieces"
    live.pack.delay = 0.0
    want = live.reference.generate(PROMPT, 16).text
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0)
    assert out.choices[0].text == want  # and the pack still decodes correctly


def test_full_queue_answers_429_with_retry_after(client: openai.OpenAI, live: Live) -> None:
    assert live.decoder.max_queue == 1
    live.pack.delay = 0.05
    running = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=LONG, temperature=0, stream=True)
    next(running)  # decoding now
    waiting_result: list[object] = []
    waiter = threading.Thread(target=lambda: waiting_result.append(
        client.completions.create(model=MODEL, prompt="x", max_tokens=2)))
    waiter.start()
    assert wait_until(lambda: scrape(client, live, "specpack_queue_depth") == 1)
    with pytest.raises(openai.RateLimitError) as info:
        client.completions.create(model=MODEL, prompt="y", max_tokens=2)
    assert info.value.status_code == 429 and info.value.code == "queue_full"
    assert int(info.value.response.headers["Retry-After"]) >= 1
    running.close()
    live.pack.delay = 0.0
    waiter.join(timeout=30)
    assert len(waiting_result) == 1  # the waiting request was answered once the decoder was free


def test_request_timeout_cancels_the_decode(client: openai.OpenAI, live: Live) -> None:
    live.pack.delay = 0.05
    live.decoder.timeout_s = 0.5
    try:
        started = time.monotonic()
        with pytest.raises(openai.InternalServerError) as info:  # 504: the client's class for 5xx
            client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=LONG, temperature=0)
        assert info.value.status_code == 504 and info.value.code == "timeout"
        assert time.monotonic() - started < 5
        assert wait_until(lambda: scrape(client, live, "specpack_running_requests") == 0, timeout=5)
    finally:
        live.decoder.timeout_s = 600.0
        live.pack.delay = 0.0


def test_metrics_count_requests_tokens_and_latencies(client: openai.OpenAI, live: Live) -> None:
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    text = client.with_options(base_url=live.url).get("/metrics", cast_to=str)
    assert metric(text, 'specpack_requests_total{endpoint="/v1/completions",status="200"}') >= 1
    for name in ("specpack_generated_tokens_total", "specpack_time_to_first_token_seconds_count",
                 "specpack_inter_token_latency_seconds_count", "specpack_request_tau_count",
                 "specpack_draft_tokens_proposed_total"):
        assert metric(text, name) > 0, name
    assert "specpack_queue_depth" in text and "specpack_request_alpha_bucket" in text


@pytest.mark.parametrize("state", ["waiting", "decoding"])
def test_non_streaming_client_that_gives_up_is_cancelled(client: openai.OpenAI, live: Live, state: str) -> None:
    before = scrape(client, live, 'specpack_requests_cancelled_total{reason="disconnect"}')
    # 0.25 s a step: a decode of LONG tokens takes >= 22 steps (at most k_max + 1 = 9 tokens a step), so >= 5.5 s,
    # past the client's 1 s whatever k adaptive k picks on this machine (0.05 s made it finish in time there)
    live.pack.delay = 0.25
    impatient = client.with_options(timeout=1.0)
    running = None
    if state == "waiting":  # another request holds the decoder
        running = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=LONG, temperature=0, stream=True)
        next(running)
    with pytest.raises(openai.APITimeoutError):
        impatient.completions.create(model=MODEL, prompt=PROMPT, max_tokens=LONG, temperature=0)
    assert wait_until(lambda: scrape(client, live, 'specpack_requests_cancelled_total{reason="disconnect"}')
                      == before + 1, timeout=5)
    assert scrape(client, live, "specpack_queue_depth") == 0
    if running is not None:
        running.close()
    assert wait_until(lambda: scrape(client, live, "specpack_running_requests") == 0, timeout=5)
    if state == "decoding":
        assert live.pack.pieces < 60, f"the decode went on after the client left: {live.pack.pieces} pieces"
