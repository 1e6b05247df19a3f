"""The ASGI app: OpenAI-compatible routes over one pack (Starlette).

    POST /v1/completions        prompt (text or ids) -> text          stream: true -> server-sent events
    POST /v1/chat/completions   messages -> the model's chat template -> assistant text
    GET  /v1/models             the one model served
    GET  /v1/models/{id}        its model object (404 for any other id)
    GET  /health                200 while serving, 503 while shutting down
    GET  /metrics               Prometheus text (specpack.serve.metrics)

A request's body is read within --max-body-bytes and --read-timeout (body.py) and parsed (400 with an OpenAI
error object); it takes a place in the queue (429 when the queue is full) before its prompt is tokenized (one at a
time) and checked, and is answered from the decoder's events. A client that disconnects, whether waiting or
decoding, aborts its job.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from specpack.errors import SpecpackError
from specpack.runtime.request import DrafterError, GenerateRequest, PreparedRequest
from specpack.serve.api_errors import APIError, bad_request, from_specpack, from_validation, request_param
from specpack.serve.body import read_body
from specpack.serve.config import ServeConfig
from specpack.serve.decoder import Aborted, Decoder, Done, Event, Failed, Job, Piece
from specpack.serve.guard import FramingGuard
from specpack.serve.metrics import ServerMetrics, StatusMiddleware
from specpack.serve.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest, check_unique_keys
from specpack.serve.responses import Shapes, sse
from specpack.validation import ContextTooLong

if TYPE_CHECKING:
    from specpack.runtime.pack import Pack

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions; chat: the rest of the context
R = TypeVar("R", bound=SamplingRequest)


def build_app(pack: Pack, config: ServeConfig) -> Starlette:
    """The app over a loaded pack; its lifespan starts and stops the decoder."""
    metrics = ServerMetrics()
    batcher = None
    if config.max_batch > 1:  # the pack's scheduler decodes up to max_batch at once; the decoder's queue holds the rest
        batcher = pack.start_batching(config.max_batch, max_waiting=0)
        batcher.on_step = metrics.batch_rows.observe
    decoder = Decoder(pack, metrics, max_queue=config.max_queue, timeout_s=config.timeout_s, max_batch=config.max_batch,
                      batcher=batcher)
    api = Api(pack, decoder, metrics, config)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        decoder.start()
        await decoder.ready()  # listening only once the decoding thread's shapes are captured (raises: no server)
        yield
        await decoder.close()

    routes = [
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", api.model_card, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", api.metrics_text, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={APIError: _api_error, HTTPException: _http_error, Exception: _internal_error})
    app.add_middleware(FramingGuard)
    app.add_middleware(StatusMiddleware, metrics=metrics, routes=frozenset(r.path for r in routes))
    app.state.decoder = decoder
    app.state.config = config  # the server reads its connection limits from here
    return app


class Api:
    def __init__(self, pack: Pack, decoder: Decoder, metrics: ServerMetrics, config: ServeConfig) -> None:
        self.pack, self.decoder, self.metrics, self.model = pack, decoder, metrics, config.served_name
        self.max_body_bytes, self.read_timeout_s = config.max_body_bytes, config.read_timeout_s
        self.k = config.k  # `specpack serve --k`, every request's (None: adaptive)
        self.drafter = config.drafter  # `specpack serve --drafter`; None: the pack's own
        self.tree = config.tree  # `specpack serve --tree`, unless a request names its own
        self._tokenizing = asyncio.Lock()

    async def completions(self, request: Request) -> Response:
        req = await self._parse(request, CompletionRequest)
        prompt = req.prompt
        if isinstance(prompt, list) and not isinstance(prompt[0], int):  # a batch: [text] or [[ids]]
            if len(prompt) > 1:
                raise bad_request("batched prompts are not supported: send one prompt per request", param="prompt",
                                  code="unsupported_value")
            prompt = prompt[0]
        with self.decoder.place() as enqueue:  # 429 / 503 before the prompt costs anything
            ids = await self._tokenize("prompt", self.pack.encode, prompt)
            job = enqueue(self._prepare(req, ids, req.max_tokens, param="prompt"))
        return await self._answer(request, req, job, Shapes(self.model, chat=False))

    async def chat_completions(self, request: Request) -> Response:
        req = await self._parse(request, ChatCompletionRequest)
        roles = _template_roles(self.pack.tokenizer.chat_template)
        messages = [{"role": roles.get(m.role, m.role), "content": m.text(), **({"name": m.name} if m.name else {})}
                    for m in req.messages]
        with self.decoder.place() as enqueue:
            ids = await self._tokenize("messages", self.pack.tokenizer.encode_messages, messages,
                                       add_generation_prompt=True)
            if req.max_completion_tokens is not None:
                prepared = self._prepare(req, ids, req.max_completion_tokens, param="messages",
                                         tokens="max_completion_tokens")
            else:
                prepared = self._prepare(req, ids, req.max_tokens, param="messages")
            job = enqueue(prepared)
        return await self._answer(request, req, job, Shapes(self.model, chat=True))

    async def _tokenize(self, param: str, encode: Callable[..., list[int]], *args: Any, **kwargs: Any) -> list[int]:
        """Text -> ids in a worker thread (CPU work: /health and streams stay live meanwhile), one request at a time:
        tokenizing costs about 100 times the text's size in memory at its peak, so concurrent ones would add up."""
        async with self._tokenizing:
            try:
                return await run_in_threadpool(encode, *args, **kwargs)
            except SpecpackError as err:
                raise from_specpack(err, param=param) from err

    async def models(self, _: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def model_card(self, request: Request) -> Response:
        """GET /v1/models/{id} (the openai client's models.retrieve)."""
        self._check_model(request.path_params["model_id"])
        return JSONResponse(self._card())

    def _card(self) -> dict[str, Any]:
        return {"id": self.model, "object": "model", "created": 0, "owned_by": "specpack",
                "max_model_len": self.pack.manifest.max_len}

    def _check_model(self, name: str) -> None:
        if name != self.model:
            raise APIError(404, f"The model '{name}' does not exist; this server serves '{self.model}'",
                           param="model", code="model_not_found")

    async def health(self, _: Request) -> Response:
        if self.decoder.draining:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics_text(self, _: Request) -> Response:
        body, content_type = self.metrics.exposition()
        return Response(body, media_type=content_type)

    async def _parse(self, request: Request, model: type[R]) -> R:
        assert self.decoder.stopping is not None  # the lifespan started the decoder
        body = await read_body(request, self.max_body_bytes, self.read_timeout_s, self.decoder.stopping)
        try:
            req = model.model_validate_json(body)
        except ValidationError as err:
            raise from_validation(err) from err
        check_unique_keys(body)
        self._check_model(req.model)
        req.check_supported()
        return req

    def _prepare(self, req: SamplingRequest, ids: list[int], max_tokens: int | None, param: str,
                 tokens: str = "max_tokens") -> PreparedRequest:
        """The request's GenerateRequest with OpenAI's defaults (temperature 1), prepared by the pack (its limits, the
        drafter, the context length) before the request is queued. Errors name the fields as the request did
        (`tokens`: max_tokens or max_completion_tokens)."""
        names = {"max_new_tokens": tokens}
        m = self.pack.manifest
        if max_tokens is None:
            max_tokens = max(1, m.max_len - len(ids)) if isinstance(req, ChatCompletionRequest) else DEFAULT_COMPLETION_TOKENS
        try:  # the request's drafter (extension), else --drafter, else the pack's own: one the pack has
            return self.pack.prepare(GenerateRequest.of(
                ids, max_tokens, k=self.k, drafter=req.drafter if req.drafter is not None else self.drafter,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_k=0 if req.top_k in (None, -1) else req.top_k, top_p=1.0 if req.top_p is None else req.top_p,
                seed=req.seed, stop=req.stop_strings(), tree=self.tree if req.tree is None else req.tree,
                limits=self.pack.limits))
        except DrafterError as err:
            raise from_specpack(err, param="drafter", code="invalid_value") from err
        except ContextTooLong as err:
            raise bad_request(f"This model's maximum context length is {m.max_len} tokens. However, you requested "
                              f"{len(ids) + max_tokens} tokens ({len(ids)} in the {param}, {max_tokens} for the "
                              f"completion). Please reduce the length of the {param} or {tokens}.",
                              param=param, code="context_length_exceeded") from err
        except SpecpackError as err:
            raise from_specpack(err, param=request_param(err, names), code="invalid_value", names=names) from err

    async def _answer(self, request: Request, req: SamplingRequest, job: Job, shapes: Shapes) -> Response:
        """Answer a queued job with one JSON body, or stream once the first event is in."""
        watcher = _on_disconnect(request, lambda: self.decoder.abort(job, "disconnect"))
        streaming = False
        try:
            if not req.stream:
                return await _collect(job, shapes)
            first = await job.next()
            if isinstance(first, Aborted | Failed):
                raise _event_error(first)
            streaming = True
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return JobStream(_sse_events(shapes, job, first, include_usage), job, self.decoder)
        finally:
            watcher.cancel()
            if not streaming:
                self.decoder.release(job)


def _template_roles(template: str | None) -> dict[str, str]:
    """OpenAI's "developer" role (its newer name for the system prompt) becomes "system" for a chat template that
    does not name it, as llama.cpp and vLLM do: Qwen2.5's template drops a message of a role it does not know,
    silently, and others raise."""
    return {} if template is not None and "developer" in template else {"developer": "system"}


class JobStream(StreamingResponse):
    """Server-sent events of one job; however the response ends (done, client gone, cancelled), the job is released."""

    def __init__(self, content: AsyncIterator[str], job: Job, decoder: Decoder) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job, self.decoder = job, decoder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.decoder.release(self.job)


async def _collect(job: Job, shapes: Shapes) -> Response:
    """The whole answer as one JSON body."""
    text: list[str] = []
    while isinstance(event := await job.next(), Piece):
        text.append(event.text)
    if not isinstance(event, Done):
        raise _event_error(event)
    return JSONResponse(shapes.response("".join(text), event))


async def _sse_events(shapes: Shapes, job: Job, first: Event, include_usage: bool) -> AsyncIterator[str]:
    def chunk_sse(chunk: dict[str, Any]) -> str:
        """With include_usage, every chunk but the usage chunk carries "usage": null (OpenAI's stream_options)."""
        return sse({**chunk, "usage": None} if include_usage and "usage" not in chunk else chunk)

    for chunk in shapes.opening():
        yield chunk_sse(chunk)
    event = first
    while True:
        if isinstance(event, Piece):
            yield chunk_sse(shapes.piece(event.text))
        elif isinstance(event, Done):
            for chunk in shapes.closing(event, include_usage):
                yield chunk_sse(chunk)
            break
        else:  # the status line is sent: the error goes in the stream, as OpenAI's client expects
            yield sse(_event_error(event).body())
            break
        event = await job.next()
    yield sse("[DONE]")


def _event_error(event: Event) -> APIError:
    if isinstance(event, Failed):
        return event.error
    reason = event.reason if isinstance(event, Aborted) else "unexpected event"
    if reason == "timeout":
        return APIError(504, "the request took longer than the server's --timeout and was cancelled",
                        type="timeout_error", code="timeout")
    if reason == "shutdown":
        return APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
    return APIError(499, "the client closed the request", code="client_closed_request")


def _on_disconnect(request: Request, callback: Callable[[], None]) -> asyncio.Task[None]:
    """A task that calls `callback` if the client disconnects (before the response starts; cancel it then)."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        callback()

    return asyncio.get_running_loop().create_task(watch())


async def _api_error(_: Request, err: Exception) -> Response:
    assert isinstance(err, APIError)
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def _http_error(_: Request, err: Exception) -> Response:
    assert isinstance(err, HTTPException)
    return await _api_error(_, APIError(err.status_code, str(err.detail), code=f"http_{err.status_code}"))


async def _internal_error(_: Request, err: Exception) -> Response:
    return await _api_error(_, APIError(500, f"internal error: {type(err).__name__}", type="server_error"))
