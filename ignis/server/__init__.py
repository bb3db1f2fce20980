"""The OpenAI-compatible server: Sanic routes over the engine (see app.py for the map).

    app.py                the Sanic app and its routes: create_app(cfg, loaded, engine)
    context.py            what every route shares (config and its live part, engine, renderer, ...)
    auth.py               API keys: Authorization: Bearer, or the upgrade's subprotocol entry
    websocket_protocol.py Sanic's protocol class with permessage-deflate and subprotocol selection
    prepare.py            a decoded request -> (prompt, SamplingParams): every endpoint and transport
    render.py             conversation -> prompt token ids (one path for both endpoints)
    params.py             sampling fields -> engine SamplingParams: served defaults, context fit
    tool_forcing.py       a demanded tool call's forced opening, the thinking budget
    structured.py         the output grammar of a JSON format, strict and custom tools
    freeform.py           a custom tool's Lark / regex grammar, held inside its JSON string
    grammar_bounds.py     the limits on a request's grammars, checked before anything renders or compiles
    schema_outline.py     a JSON schema's size, depth and satisfiability, read without recursion
    lark_outline.py       the same for a Lark grammar: rules, alternatives, chains, rules that never end
    grammar_graph.py      the two graph questions both ask (weighted depth, productivity), in linear time
    admission.py          engine room for HTTP (else 503), the server-wide FIFO for sockets
    turn.py               one turn, any transport: engine outputs -> parser -> encoder events
    logprobs.py           per-token logprobs, put on the answer text they belong to
    responses_http.py     POST /v1/responses (JSON, SSE)
    compact_http.py       POST /v1/responses/compact (the served model writes the summary)
    chat_http.py          POST /v1/chat/completions (JSON, SSE)
    http_turn.py          one HTTP turn for both: deadline, admission or 503, drive, metrics
    socket_session.py     GET /v1/responses upgraded: lanes, history, queue, cancel, idle close
    socket_intake.py      the socket's frames: size and buffer budgets, UTF-8, inflation bounds
    guard.py              Origin, Host and content-type checks (a browser can reach a local server)
    body_encoding.py      Content-Encoding gzip / zstd request bodies, inflated with a bound
    codex_catalog.py      the Codex model-catalog entries GET /v1/models carries
    connections.py        receive timeouts and the connection limit
    sse.py                server-sent events framing
    metrics.py            Prometheus metrics, a registry per app
    admin.py              GET / PATCH /admin/config (live settings)
    access.py             access logs (no keys, no prompt text)
    errors.py             OpenAI's error envelope for every failure
    shutdown.py           SIGTERM: refuse new work, let running responses finish (grace), cancel, close 1001
    background.py         run a server in a thread of this process (tests, notebooks)
    playground_routes.py  GET / (the Playground page and its files)
"""

from ignis.server.app import create_app
from ignis.server.background import BackgroundServer
from ignis.server.websocket_protocol import IgnisWebSocketProtocol

__all__ = ["create_app", "BackgroundServer", "IgnisWebSocketProtocol"]
