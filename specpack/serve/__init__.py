"""OpenAI-compatible HTTP serving of a pack (`specpack serve`; the `serve` extra: starlette, uvicorn, prometheus-client).

Nothing is imported here: the CLI imports specpack.serve.config alone, the web libraries only when serving.
"""
