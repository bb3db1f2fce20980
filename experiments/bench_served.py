"""Served throughput: 64 concurrent clients over HTTP/SSE and over sockets, beside the
offline engine on the same prompts.

    .venv/bin/python experiments/bench_served.py [--clients 64] [--max-tokens 128]

SmolLM2-135M (the embedded default). Each client asks one question (distinct chat
prompts, ~40 tokens) with temperature 0 and max_output_tokens --max-tokens, all at once:

- offline: the same prompt ids and sampling params (rendered and built by the server's
  own `prepare`) submitted together to an `LLMEngine` in this process, stepped to the end;
- HTTP/SSE: one POST /v1/responses (stream: true) per client, --clients at once;
- socket: `response.create` frames with one stream_id per client over --sockets
  connections (the protocol allows 16 active lanes per connection, so 64 concurrent
  streams take 4 sockets; with fewer the rest queue in their lane).

The server runs in a child process (experiments/serving.py) with the engine's defaults
(max_num_seqs 64, torch's threads), a fresh one for each run (empty prefix cache, as the
offline engine's); the clients run here, on the same 2-core machine.
tokens/s = output tokens / (last terminal event - first request sent); TTFT = request
sent -> its first output_text delta (offline: all submitted -> the request's first token).
Greedy decoding makes the served answers the offline ones, token for token (checked).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serving import ServerProcess, p50, pct

TOPICS = ["the ocean", "volcanoes", "the moon", "honey bees", "the Roman empire", "jazz", "glaciers", "octopuses",
          "the printing press", "coffee", "black holes", "chess", "rainforests", "trains", "the human heart",
          "origami"]
STYLES = ["Write a long story about {}.", "Explain {} in detail, step by step.", "Write an essay about {}.",
          "Describe {} to a child, at length."]


def questions(n: int) -> list[str]:
    return [STYLES[i // len(TOPICS) % len(STYLES)].format(TOPICS[i % len(TOPICS)]) for i in range(n)]


def body(q: str, max_tokens: int) -> dict:
    return {"model": "smollm2-135m", "input": q, "temperature": 0, "max_output_tokens": max_tokens}


_OFFLINE: dict = {}


def offline(qs: list[str], max_tokens: int, threads: int | None = None) -> dict:
    from ignis.config import EngineConfig
    from ignis.engine import LLMEngine
    from ignis.model import load_model
    from ignis.server.render import Renderer
    from ignis.server.prepare import prepare_response as prepare
    from protocol.decode import decode_request

    if "loaded" not in _OFFLINE:
        _OFFLINE["loaded"] = load_model(progress=False)
    loaded = _OFFLINE["loaded"]
    engine = LLMEngine(loaded, EngineConfig(max_num_seqs=len(qs), cpu_threads=threads))  # fresh: empty prefix cache
    ctx = SimpleNamespace(renderer=Renderer(loaded.tokenizer, loaded.chat_template), max_model_len=engine.max_model_len,
                          loaded=loaded, max_output_tokens=None)
    reqs = [prepare(ctx, decode_request(body(q, max_tokens), transport="http")) for q in qs]
    hi = prepare(ctx, decode_request(body("Say hi.", 4), transport="http"))
    engine.generate([hi[0].ids], hi[1])  # warm-up (a prompt of its own)
    start = time.perf_counter()
    for i, (prompt, params) in enumerate(reqs):
        engine.add_request(f"o{i}", prompt.ids, params)
    first: dict[str, float] = {}
    texts = {f"o{i}": [] for i in range(len(qs))}
    tokens = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.token_ids and out.request_id not in first:
                first[out.request_id] = time.perf_counter() - start
            tokens += len(out.token_ids)
            texts[out.request_id].append(out.text or "")
    wall = time.perf_counter() - start
    return {"tokens": tokens, "wall": wall, "ttft": list(first.values()),
            "texts": ["".join(texts[f"o{i}"]) for i in range(len(qs))]}


async def over_http(url: str, qs: list[str], max_tokens: int) -> dict:
    import httpx2 as httpx

    limits = httpx.Limits(max_connections=len(qs) + 4, max_keepalive_connections=len(qs) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await client.get("/health")

        async def one(q: str) -> tuple[float, float, int, str]:
            sent = time.perf_counter()
            ttft = None
            text = []
            async with client.stream("POST", "/v1/responses", json={**body(q, max_tokens), "stream": True}) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    ev = json.loads(line[6:])
                    if ev["type"] == "response.output_text.delta":
                        ttft = ttft or time.perf_counter() - sent
                        text.append(ev["delta"])
                    elif ev["type"] in ("response.completed", "response.incomplete", "response.failed"):
                        return sent, ttft or float("nan"), ev["response"]["usage"]["output_tokens"], "".join(text)
            raise RuntimeError("no terminal event")

        start = time.perf_counter()
        done = await asyncio.gather(*(one(q) for q in qs))
        wall = time.perf_counter() - start
    return {"tokens": sum(d[2] for d in done), "wall": wall, "ttft": [d[1] for d in done], "texts": [d[3] for d in done]}


async def over_sockets(ws_url: str, qs: list[str], max_tokens: int, sockets: int) -> dict:
    from websockets.asyncio.client import connect

    conns = [await connect(ws_url, max_size=None) for _ in range(sockets)]
    results: dict[str, dict] = {}
    try:
        async def reader(ws, mine: set[str]) -> None:
            while mine - {k for k, v in results.items() if "tokens" in v}:
                ev = json.loads(await ws.recv())
                sid = ev.get("stream_id")
                r = results[sid]
                if ev["type"] == "response.output_text.delta":
                    r.setdefault("ttft", time.perf_counter() - r["sent"])
                    r["text"].append(ev["delta"])
                elif ev["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
                    if ev["type"] == "error":
                        raise RuntimeError(ev)
                    r["tokens"] = ev["response"]["usage"]["output_tokens"]

        start = time.perf_counter()
        readers = []
        for c, ws in enumerate(conns):
            mine = set()
            for i in range(c, len(qs), sockets):
                sid = f"s{i}"
                mine.add(sid)
                results[sid] = {"sent": time.perf_counter(), "text": []}
                await ws.send(json.dumps({"type": "response.create", "stream_id": sid, "stream": True,
                                          **body(qs[i], max_tokens)}))
            readers.append(reader(ws, mine))
        await asyncio.gather(*readers)
        wall = time.perf_counter() - start
    finally:
        for ws in conns:
            await ws.close()
    ordered = [results[f"s{i}"] for i in range(len(qs))]
    return {"tokens": sum(r["tokens"] for r in ordered), "wall": wall,
            "ttft": [r.get("ttft", float("nan")) for r in ordered], "texts": ["".join(r["text"]) for r in ordered]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--sockets", type=int, default=4, help="connections for the socket run (16 active lanes each)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each path; the fastest counts")
    ap.add_argument("--threads", type=int, default=None, help="engine.cpu_threads (default: torch's)")
    args = ap.parse_args()
    qs = questions(args.clients)

    label = f"socket, {args.sockets} connections x {-(-args.clients // args.sockets)} stream_ids"
    offline_label, http_label = "offline engine (this process)", "HTTP/SSE, one request per client"
    runs: dict[str, list[dict]] = {offline_label: [], http_label: [], label: []}
    for _ in range(args.repeat):  # the three take turns, so that all meet the same machine
        runs[offline_label].append(offline(qs, args.max_tokens, args.threads))
        # A fresh server for each run: the prefix cache starts empty, as the offline engine's.
        with ServerProcess(model="smollm2", max_num_seqs=max(64, args.clients), threads=args.threads) as srv:
            asyncio.run(over_http(srv.base_url, ["Say hi."], 4))  # warm-up (a prompt of its own)
            runs[http_label].append(asyncio.run(over_http(srv.base_url, qs, args.max_tokens)))
        with ServerProcess(model="smollm2", max_num_seqs=max(64, args.clients), threads=args.threads) as srv:
            asyncio.run(over_http(srv.base_url, ["Say hi."], 4))
            runs[label].append(asyncio.run(over_sockets(srv.ws_url, qs, args.max_tokens, args.sockets)))
        print(" | ".join(f"{k}: {v[-1]['tokens'] / v[-1]['wall']:.1f} tok/s" for k, v in runs.items()), file=sys.stderr)
    best = {k: max(v, key=lambda r: r["tokens"] / r["wall"]) for k, v in runs.items()}
    ref = best[offline_label]
    base_tps = ref["tokens"] / ref["wall"]
    threads = f"{args.threads} engine thread(s)" if args.threads else "torch's default engine threads"
    print(f"\n{args.clients} concurrent requests, SmolLM2-135M fp32, temperature 0, up to {args.max_tokens} "
          f"output tokens each, {threads}\n")
    print("| path | output tokens | tokens/s | vs offline | TTFT p50 | TTFT p99 | same text as offline |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in best.items():
        tps = r["tokens"] / r["wall"]
        same = sum(a == b for a, b in zip(r["texts"], ref["texts"]))
        print(f"| {name} | {r['tokens']} | {tps:.1f} | {tps / base_tps:.0%} | {p50(r['ttft']) * 1e3:.0f} ms | "
              f"{pct(r['ttft'], 99) * 1e3:.0f} ms | {same}/{len(r['texts'])} |")


if __name__ == "__main__":
    main()
