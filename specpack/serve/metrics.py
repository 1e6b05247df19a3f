"""Prometheus metrics of one server (its own registry, so several apps can live in one process).

    specpack_requests_total{endpoint, status}        every HTTP answer, by route and status code
    specpack_requests_cancelled_total{reason}        requests stopped early: disconnect, timeout, shutdown
    specpack_prompt_tokens_total, specpack_generated_tokens_total
    specpack_draft_tokens_proposed_total, ..._accepted_total   their ratio over any window is alpha
    specpack_request_alpha, specpack_request_tau     per-request acceptance rate and tokens per verify step
    specpack_time_to_first_token_seconds             request arrival (queue wait included) -> first token
    specpack_inter_token_latency_seconds             gap between consecutive text pieces of a request
                                                     (the drafts accepted in one step arrive together)
    specpack_queue_depth, specpack_running_requests
    specpack_batch_rows                              requests in each step of the batch (--max-batch > 1)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0)
ALPHA_BUCKETS = tuple(i / 10 for i in range(11))
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TAU_BUCKETS = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 10.0, 17.0)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("specpack_requests", "HTTP answers by route and status", ["endpoint", "status"], registry=r)
        self.cancelled = Counter("specpack_requests_cancelled", "Requests stopped early, by reason", ["reason"], registry=r)
        self.prompt_tokens = Counter("specpack_prompt_tokens", "Prompt tokens of decoded requests", registry=r)
        self.generated_tokens = Counter("specpack_generated_tokens", "Tokens generated", registry=r)
        self.proposed = Counter("specpack_draft_tokens_proposed", "Draft tokens verified by the target", registry=r)
        self.accepted = Counter("specpack_draft_tokens_accepted", "Draft tokens the target accepted", registry=r)
        self.alpha = Histogram("specpack_request_alpha", "Acceptance rate per request", buckets=ALPHA_BUCKETS, registry=r)
        self.tau = Histogram("specpack_request_tau", "Tokens per verify step, per request", buckets=TAU_BUCKETS, registry=r)
        self.ttft = Histogram("specpack_time_to_first_token_seconds", "Arrival to first token, queue wait included",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("specpack_inter_token_latency_seconds", "Gap between consecutive text pieces",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("specpack_queue_depth", "Requests waiting for the decoder", registry=r)
        self.running = Gauge("specpack_running_requests", "Requests decoding now (at most --max-batch)", registry=r)
        self.batch_rows = Histogram("specpack_batch_rows", "Requests in each step of the batch (--max-batch > 1)",
                                    buckets=BATCH_BUCKETS, registry=r)

    def observe_stats(self, stats: dict[str, float]) -> None:
        """A finished decode's statistics (the runtime's stats dict)."""
        self.proposed.inc(stats["proposed"])
        self.accepted.inc(stats["accepted"])
        if stats["proposed"]:
            self.alpha.observe(stats["alpha"])
        if stats["steps"]:
            self.tau.observe(stats["tau"])

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class StatusMiddleware:
    """Counts every HTTP answer by route and status code (unknown paths as "other", to bound the labels)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics, routes: frozenset[str]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]  # a route with a parameter (/v1/models/{model_id:path}) is counted under its template
        endpoint = path if path in self.routes else next(
            (r for r in self.routes if "{" in r and path.startswith(r[:r.index("{")])), "other")

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
