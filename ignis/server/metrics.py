"""Prometheus metrics (prometheus-client), one registry per app (tests run several apps).

Server: ``ignis_responses_sockets`` (open WebSocket connections),
``ignis_responses_sockets_opened_total`` (connections ever opened),
``ignis_responses_queued_requests`` (socket requests waiting for the engine),
``ignis_requests_total{endpoint,transport,status}``, token counters, and the latency
histograms ``ignis_time_to_first_token_seconds`` and
``ignis_e2e_request_latency_seconds`` (both by endpoint; end to end = arrival to the
terminal event, queueing included). ``ignis_prompt_tokens_tokenized_total`` and
``ignis_prompt_tokens_reused_total``: prompt tokens tokenized, and taken from the
renderer's token cache instead (ignis/model/token_cache.py).

Engine (read from `AsyncEngine.stats` at scrape time): running / waiting / in-flight
requests, free and total KV blocks, prefix-cache hit and query tokens, preemptions,
steps, generated tokens, and ``ignis_engine_healthy``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ignis.server.turn import Outcome

__all__ = ["Metrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class _EngineCollector(Collector):
    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self.engine.stats
        if callable(stats):
            stats = stats()
        gauges = {
            "ignis_engine_running_requests": ("Sequences in the running batch.", stats.num_running),
            "ignis_engine_waiting_requests": ("Sequences waiting in the engine's scheduler.", stats.num_waiting),
            "ignis_engine_in_flight_requests": ("Requests submitted and not finished.", stats.num_in_flight),
            "ignis_engine_free_blocks": ("Free KV-cache blocks (evictable prefix-cache blocks included).",
                                         stats.num_free_blocks),
            "ignis_engine_blocks": ("KV-cache blocks in all.", stats.num_blocks),
            "ignis_engine_healthy": ("1 while the engine thread runs.", 1 if self.engine.healthy else 0),
            "ignis_engine_draft_acceptance_rate": (
                "Speculative draft tokens kept / checked, since start (0 before any).",
                stats.num_accepted_draft_tokens / stats.num_draft_tokens if stats.num_draft_tokens else 0.0),
        }
        for name, (doc, value) in gauges.items():
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(value))
            yield g
        counters = {
            "ignis_engine_prefix_cache_hit_tokens": ("Prompt tokens served from the prefix cache.",
                                                     stats.prefix_cache_hit_tokens),
            "ignis_engine_prefix_cache_query_tokens": ("Prompt tokens looked up in the prefix cache.",
                                                       stats.prefix_cache_query_tokens),
            "ignis_engine_preemptions": ("Sequences preempted for lack of KV blocks.", stats.num_preemptions),
            "ignis_engine_steps": ("Engine steps run.", stats.num_steps),
            "ignis_engine_generated_tokens": ("Tokens sampled by the engine.", stats.num_generated_tokens),
            "ignis_engine_draft_tokens": ("Speculative draft tokens checked (engine.speculative).",
                                          stats.num_draft_tokens),
            "ignis_engine_accepted_draft_tokens": ("Speculative draft tokens kept: sampling chose them.",
                                                   stats.num_accepted_draft_tokens),
        }
        for name, (doc, value) in counters.items():
            c = CounterMetricFamily(name, doc)
            c.add_metric([], float(value))
            yield c


class _TokenCacheCollector(Collector):
    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        for name, doc, value in (
            ("ignis_prompt_tokens_tokenized", "Prompt tokens the tokenizer ran over.", self.cache.tokenized),
            ("ignis_prompt_tokens_reused", "Prompt tokens taken from the token cache instead (text seen before).",
             self.cache.reused),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], float(value))
            yield c


class Metrics:
    def __init__(self, engine: Any, *, queued: Callable[[], int], sockets: Callable[[], int],
                 token_cache: Any = None) -> None:
        disable_created_metrics()  # no `*_created` series next to every counter (process-wide)
        self.registry = r = CollectorRegistry(auto_describe=True)
        Gauge("ignis_responses_sockets", "Open Responses WebSocket connections.", registry=r).set_function(
            lambda: float(sockets())
        )
        # Beside the gauge: whether clients multiplex streams over one socket or open many.
        self.sockets_opened = Counter("ignis_responses_sockets_opened", "Responses WebSocket connections opened.",
                                      registry=r)
        Gauge("ignis_responses_queued_requests", "Socket requests waiting for room in the engine (server-wide FIFO).",
              registry=r).set_function(lambda: float(queued()))
        self.requests = Counter("ignis_requests", "Finished generation requests.", ["endpoint", "transport", "status"],
                                registry=r)
        self.refusals = Counter("ignis_refusals", "Requests refused (4xx / 5xx / socket error events).",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("ignis_prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.cached_tokens = Counter("ignis_cached_prompt_tokens", "Prompt tokens served from the prefix cache.",
                                     registry=r)
        self.output_tokens = Counter("ignis_output_tokens", "Output tokens of finished requests.", registry=r)
        self.ttft = Histogram("ignis_time_to_first_token_seconds", "Admission-or-arrival to the first output token.",
                              ["endpoint"], buckets=_LATENCY, registry=r)
        self.e2e = Histogram("ignis_e2e_request_latency_seconds", "Arrival to the terminal event.", ["endpoint"],
                             buckets=_LATENCY, registry=r)
        r.register(_EngineCollector(engine))
        if token_cache is not None:
            r.register(_TokenCacheCollector(token_cache))

    def finished(self, endpoint: str, transport: str, outcome: Outcome, e2e: float) -> None:
        self.requests.labels(endpoint, transport, outcome.status).inc()
        self.prompt_tokens.inc(outcome.usage.input_tokens)
        self.cached_tokens.inc(outcome.usage.cached_tokens)
        self.output_tokens.inc(outcome.usage.output_tokens)
        if outcome.ttft is not None:
            self.ttft.labels(endpoint).observe(outcome.ttft)
        self.e2e.labels(endpoint).observe(e2e)

    def refused(self, endpoint: str, status: int) -> None:
        self.refusals.labels(endpoint, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
