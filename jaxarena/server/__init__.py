"""`jaxarena serve`: an OpenAI-compatible HTTP server on the engine (FastAPI + uvicorn).

Modules, one concern each: `protocol` (request bodies, the OpenAI error shape), `tokenizer`
(HF tokenizer, chat template, incremental detokenizer with stop strings), `metrics`
(Prometheus), `outputs` (engine events -> text pieces), `app` (the routes), `run` (serving,
in a thread for tests), `options` (the CLI subcommand; imports nothing heavy).

This package's `__init__` imports nothing: `jaxarena.cli` reaches `options` through it
without loading a web framework. Use `from jaxarena.server.app import create_app`,
`from jaxarena.server.run import start_in_thread`.
"""

__all__: list[str] = []
