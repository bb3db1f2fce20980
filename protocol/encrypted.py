"""`reasoning.encrypted_content`: the reasoning as the model saw it, in an opaque string;
and a ``compaction`` item's ``encrypted_content`` (the summary `POST /v1/responses/compact`
wrote), in the same form with ``"kind": "compaction"`` in its JSON, so that neither can
pass for the other.

Codex (and any stateless client) asks for ``include: ["reasoning.encrypted_content"]``,
keeps the reasoning item with its ``encrypted_content`` and sends it back with
``content: null`` on the next turn. ignis must then restore the exact reasoning text.

Format (version 1), all ASCII::

    ig1.<payload>            unsigned
    ig1.<payload>.<sig>      signed with a server key

``payload`` is URL-safe base64 (no padding) of zlib-compressed UTF-8 JSON
``{"v": 1, "text": "..."}``; ``sig`` is URL-safe base64 of HMAC-SHA256(key, "ig1." +
payload). It is *encoded*, not encrypted: anyone can read it (the reasoning is
the client's own conversation anyway); the optional key makes it tamper-evident,
so that a client cannot inject "the model's own reasoning".

No global state: the key (bytes, or None) is passed to every call. Rules:

- no key on the server: signed and unsigned tokens are both read (the signature
  cannot be checked and is ignored);
- a key on the server: only tokens signed with that key are read.

`open_reasoning` returns None for anything it cannot read (another server's token,
a bad signature, garbage); the decoder then treats the reasoning as absent, or
refuses it when asked to (see `protocol.decode`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import zlib

__all__ = ["PREFIX", "seal_reasoning", "open_reasoning", "seal_compaction", "open_compaction"]

PREFIX = "ig1."
_MAX_INFLATED = 64 * 1024 * 1024  # refuse zip bombs: 64 MiB of reasoning is plenty


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(key: bytes, signed_part: str) -> str:
    return _b64(hmac.new(key, signed_part.encode("ascii"), hashlib.sha256).digest())


def seal_reasoning(text: str, key: bytes | None = None) -> str:
    """The opaque ``encrypted_content`` string carrying `text`."""
    return _seal({"v": 1, "text": text}, key)


def seal_compaction(text: str, key: bytes | None = None) -> str:
    """A compaction item's ``encrypted_content``: the summary `text`."""
    return _seal({"v": 1, "kind": "compaction", "text": text}, key)


def open_compaction(token: str, key: bytes | None = None) -> str | None:
    """The summary in a compaction token, or None (not one of ours, or not a compaction)."""
    obj = _open(token, key)
    return obj["text"] if obj is not None and obj.get("kind") == "compaction" else None


def _seal(obj: dict[str, object], key: bytes | None) -> str:
    raw = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    body = PREFIX + _b64(zlib.compress(raw.encode("utf-8"), 6))
    if key is None:
        return body
    return f"{body}.{_sign(key, body)}"


def open_reasoning(token: str, key: bytes | None = None) -> str | None:
    """The reasoning text in `token`, or None if it is not a readable ignis token."""
    obj = _open(token, key)
    return obj["text"] if obj is not None and "kind" not in obj else None


def _open(token: str, key: bytes | None) -> dict | None:
    if not isinstance(token, str) or not token.startswith(PREFIX):
        return None
    parts = token.split(".")
    if len(parts) not in (2, 3):
        return None
    body = f"{parts[0]}.{parts[1]}"
    if key is not None:
        if len(parts) != 3 or not hmac.compare_digest(parts[2], _sign(key, body)):
            return None
    try:
        d = zlib.decompressobj()
        raw = d.decompress(_unb64(parts[1]), _MAX_INFLATED)
        if d.unconsumed_tail:
            return None
        obj = json.loads(raw.decode("utf-8"))
    except (ValueError, binascii.Error, zlib.error, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(obj, dict) or obj.get("v") != 1 or not isinstance(obj.get("text"), str):
        return None
    return obj
