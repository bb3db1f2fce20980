"""`--server-KEY VALUE` flags for `python -m ignis.serve`, as aliases of Hydra overrides.

    --server-socket-idle-close 5      ->  server.socket_idle_close=5
    --server-stream-timeout=60        ->  server.stream_timeout=60

Every `server.*` key has one (dashes for underscores). An unknown `--server-...` flag,
or one without a value, is an error naming the closest key; anything else is left to
Hydra. Hydra overrides keep working beside them.
"""

from __future__ import annotations

import dataclasses
import difflib

from ignis.config import ServerConfig

__all__ = ["FlagError", "expand_server_flags", "default_model"]

_PREFIX = "--server-"
EMBEDDED_MODEL_OVERRIDE = "+model=smollm2-135m"


class FlagError(ValueError):
    pass


def _keys() -> list[str]:
    return [f.name for f in dataclasses.fields(ServerConfig)]


def expand_server_flags(argv: list[str]) -> list[str]:
    """`argv` (without the program name) with each `--server-...` flag as its override."""
    keys = _keys()
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith(_PREFIX):
            out.append(arg)
            continue
        flag, has_value, value = arg.partition("=")
        key = flag[len(_PREFIX):].replace("-", "_")
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f"; did you mean --server-{close[0].replace('_', '-')}?" if close else ""
            raise FlagError(f"unknown flag {flag}{hint} (each server.* key has a --server-KEY flag)")
        if not has_value:
            if i >= len(argv):
                raise FlagError(f"{flag} needs a value ({flag} VALUE or {flag}=VALUE)")
            value = argv[i]
            i += 1
        out.append(f"server.{key}={value}")
    return out


def default_model(argv: list[str]) -> list[str]:
    """`argv` with the embedded model's group (`+model=smollm2-135m`, its sampling
    defaults included) when it names no model at all: `python -m ignis.serve` alone
    serves exactly what `+model=smollm2-135m` does."""
    names_model = any(a.lstrip("+~").startswith(("model=", "model.")) for a in argv)
    return argv if names_model else [EMBEDDED_MODEL_OVERRIDE, *argv]
