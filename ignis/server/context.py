"""What every route shares: config (with its live part), model, engine, renderer,
admission, metrics, keys. One `ServerContext` per app, at ``app.ctx.ignis``."""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ignis.config import ServerConfig
from ignis.engine import AsyncEngine
from ignis.model.loader import LoadedModel
from ignis.server.admission import Admission
from ignis.server.auth import resolve_api_key
from ignis.server.errors import model_not_found
from ignis.server.metrics import Metrics
from ignis.server.chat_formats import chat_format
from ignis.server.render import Renderer
from ignis.server.params import RequestDefaults

__all__ = ["LiveSettings", "ServerContext", "LIVE_KEYS"]

log = logging.getLogger("ignis.server")

R = TypeVar("R")  # a decoded request: protocol's ResponsesRequest or ChatRequest

# Keys PATCH /admin/config may change while the server runs (seconds, >= 0; 0 = off).
LIVE_KEYS = ("request_timeout", "stream_timeout", "socket_idle_close")


@dataclass
class LiveSettings:
    request_timeout: float
    stream_timeout: float
    socket_idle_close: float

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in LIVE_KEYS}


@dataclass
class ServerContext:
    cfg: ServerConfig
    loaded: LoadedModel
    engine: AsyncEngine
    live: LiveSettings
    api_key: str | None
    reasoning_key: bytes
    renderer: Renderer  # or another chat format's renderer (ignis/server/chat_formats)
    admission: Admission
    metrics: Metrics
    model_names: tuple[str, ...]
    # What a request gets for the sampling fields it omits (the model's defaults).
    defaults: RequestDefaults = field(default_factory=RequestDefaults.resolve)
    started: int = field(default_factory=lambda: int(time.time()))
    sockets: set[Any] = field(default_factory=set)
    # Engine streams of the HTTP turns running now, and whether the server is shutting
    # down (refusing new work; see shutdown.py).
    http_streams: set[Any] = field(default_factory=set)
    draining: bool = False

    @classmethod
    def build(cls, cfg: ServerConfig, loaded: LoadedModel, engine: AsyncEngine, *,
              sampling: Any = None) -> ServerContext:
        """`sampling`: the `model.sampling` config block (ignis.config.SamplingDefaults)."""
        if cfg.max_output_tokens is not None and cfg.max_output_tokens < 1:
            raise ValueError(f"server.max_output_tokens must be null or at least 1, got {cfg.max_output_tokens}")
        if cfg.reasoning_key:
            reasoning_key = hashlib.sha256(cfg.reasoning_key.encode("utf-8")).digest()
        else:
            reasoning_key = secrets.token_bytes(32)
        admission = Admission(engine)
        sockets: set[Any] = set()
        # The model family's chat format renders the prompts (Hermes: Renderer).
        fmt = chat_format(getattr(loaded.chat_template, "chat_format", None))
        log.info("chat format: %s", fmt.name)
        renderer = fmt.renderer(loaded.tokenizer, loaded.chat_template, reasoning=loaded.reasoning)
        metrics = Metrics(engine, queued=lambda: admission.queued, sockets=lambda: len(sockets),
                          token_cache=renderer.token_cache)
        names = tuple(dict.fromkeys([loaded.name, *cfg.model_aliases]))
        defaults = RequestDefaults.resolve(sampling, getattr(loaded, "generation_defaults", None), server_cap=cfg.max_output_tokens)
        log.info("sampling defaults: %s", defaults.describe())
        return cls(
            cfg=cfg,
            loaded=loaded,
            engine=engine,
            live=LiveSettings(float(cfg.request_timeout), float(cfg.stream_timeout), float(cfg.socket_idle_close)),
            api_key=resolve_api_key(cfg.api_key),
            reasoning_key=reasoning_key,
            renderer=renderer,
            admission=admission,
            metrics=metrics,
            model_names=names,
            defaults=defaults,
            sockets=sockets,
        )

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def accept(self, request: R) -> R:
        """A decoded request (Responses or chat) this server serves: its model checked
        (404 ``model_not_found``), the model's sampling defaults in the fields it omits."""
        if request.model not in self.model_names:
            raise model_not_found(request.model, self.model_names)
        filled = self.defaults.fill(request.sampling)
        return request if filled is request.sampling else replace(request, sampling=filled)

    @staticmethod
    def seconds(value: float) -> float | None:
        """A live timeout as the engine takes it (None = no limit)."""
        return value if value and value > 0 else None
