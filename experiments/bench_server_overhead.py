"""Server overhead per request: a 20-item Codex-shaped input answered with one token.

    .venv/bin/python experiments/bench_server_overhead.py [--requests 200]

What the server does around the engine for one /v1/responses request, timed phase by
phase in this process with the server's own functions (no network, no engine):

- decode: body bytes -> JSON -> `ResponsesRequest` (`protocol.decode`); over the socket
  the `response.create` frame, which holds only the new items, plus the lookup of the
  stored history;
- prepare: the conversation -> prompt token ids -> sampling params
  (`responses_http.prepare`: to_conversation, template adaptation, chat template
  render, tokenize);
- encode: the response events of a one-token answer (created, in_progress, the output
  item and its text, completed with usage) as SSE text or socket frames.

The input: Codex CLI 0.171's recorded tool-case request (its developer instructions,
environment, question, 9 function tools) grown to 20 items with 8 exec_command calls
whose outputs are ~1,000 tokens each (~14k prompt tokens with SmolLM2's tokenizer and
template, those of the default model and of the scripted model). Scenarios, by what the
renderer's token cache (ignis/model/token_cache.py) has seen:

- new conversation: nothing (cache cleared before each request);
- next turn: the same conversation without its last call and output (an agent's turn
  over HTTP: the client resends the history plus the new items);
- same input again: all of it (a retry, or the turn after a prewarm);
- socket continuation: next turn over the socket (previous_response_id + the new items);
- token cache off: next turn with every prompt tokenized whole (ignis before the cache).

p50 and p99 over --requests requests each (wall clock, this process, one thread).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serving import codex_body, codex_history, p50, pct


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    import gguf

    from ignis.model.chat_template import ChatTemplate
    from ignis.model.embedded import smollm2_gguf_path
    from ignis.model.tokenizer import Tokenizer
    from ignis.server.render import Renderer
    from ignis.server.prepare import prepare_response as prepare
    from ignis.server.sse import responses_text
    from protocol.decode import decode_item, decode_json, decode_request
    from protocol.deltas import TextDelta
    from protocol.events import dumps
    from protocol.response import Usage
    from protocol.socket_events import decode_frame
    from protocol.stream import ResponseStream

    reader = gguf.GGUFReader(smollm2_gguf_path())
    tokenizer, template = Tokenizer.from_gguf(reader), ChatTemplate.from_gguf(reader)
    key = b"k" * 32
    # What `prepare` reads of the server's context (ignis.server.context.ServerContext).
    loaded = SimpleNamespace(tokenizer=tokenizer, config=SimpleNamespace(vocab_size=tokenizer.vocab_size))
    ctx = SimpleNamespace(renderer=Renderer(tokenizer, template), max_model_len=65536, loaded=loaded,
                          max_output_tokens=None)
    cache = ctx.renderer.token_cache

    items = codex_history(8)
    assert len(items) == 20
    body = json.dumps(codex_body(items, stream=True, max_output_tokens=1)).encode()
    prior = json.dumps(codex_body(items[:-2], stream=True, max_output_tokens=1)).encode()
    stored = tuple(decode_item(it, f"input[{i}]", reasoning_key=key) for i, it in enumerate(items[:-2]))
    frame = json.dumps({"type": "response.create", **codex_body(items[-2:], max_output_tokens=1),
                        "previous_response_id": "resp_prior"})

    def http_request(raw: bytes) -> tuple[float, float, float, int]:
        t0 = time.perf_counter()
        req = decode_request(decode_json(raw), transport="http", reasoning_key=key)
        t1 = time.perf_counter()
        prompt, _params = prepare(ctx, req)
        t2 = time.perf_counter()
        enc = ResponseStream(req, reasoning_key=key, emit=True)
        events = enc.start() + enc.feed(TextDelta("ok")) + enc.finish("stop", Usage(len(prompt.ids), 1))
        responses_text(events)
        t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2, prompt.tokenized

    def socket_request() -> tuple[float, float, float, int]:
        from dataclasses import replace

        t0 = time.perf_counter()
        ev = decode_frame(frame, reasoning_key=key)
        req = ev.request
        req = replace(req, input=stored + tuple(req.input))
        t1 = time.perf_counter()
        prompt, _params = prepare(ctx, req)
        t2 = time.perf_counter()
        enc = ResponseStream(req, response_id="resp_x", reasoning_key=key)
        events = enc.start() + enc.admitted() + enc.feed(TextDelta("ok")) + enc.finish("stop", Usage(len(prompt.ids), 1))
        for e in events:
            dumps(e)
        t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2, prompt.tokenized

    def warm_prior() -> None:
        cache.clear()
        ctx.renderer.token_cache = cache
        prepare(ctx, decode_request(decode_json(prior), transport="http", reasoning_key=key))

    scenarios = {
        "HTTP, new conversation": (lambda: cache.clear(), lambda: http_request(body)),
        "HTTP, next turn": (warm_prior, lambda: http_request(body)),
        "HTTP, same input again": (lambda: None, lambda: http_request(body)),
        "socket continuation": (warm_prior, socket_request),
        "HTTP, next turn, token cache off": (lambda: setattr(ctx.renderer, "token_cache", None),
                                             lambda: http_request(body)),
    }
    rows = []
    tokens = len(prepare(ctx, decode_request(decode_json(body), transport="http", reasoning_key=key))[0].ids)
    for name, (setup, run) in scenarios.items():
        samples = []
        gc.collect()
        for i in range(args.requests + 5):
            setup()
            out = run()
            if i >= 5:  # warm-up
                samples.append(out)
        ctx.renderer.token_cache = cache
        cols = list(zip(*samples))
        totals = [sum(s[:3]) for s in samples]
        ms = [[v * 1e3 for v in c] for c in cols[:3]] + [[v * 1e3 for v in totals]]
        rows.append((name, ms, p50(cols[3])))
        print(f"{name}: total p50 {p50(ms[3]):.3f} ms", file=sys.stderr)

    print(f"\n{len(items)} items, {len(body):,} bytes, {tokens:,} prompt tokens (SmolLM2 tokenizer and template); "
          f"{args.requests} requests each, p50 / p99 in ms\n")
    print("| scenario | decode | prepare (render + tokenize) | encode (1 token) | total | tokens tokenized |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, ms, tok in rows:
        cells = " | ".join(f"{p50(c):.3f} / {pct(c, 99):.3f}" for c in ms)
        print(f"| {name} | {cells} | {tok:,.0f} |")


if __name__ == "__main__":
    main()
