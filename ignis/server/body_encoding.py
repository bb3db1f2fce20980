"""Compressed request bodies: ``Content-Encoding: zstd`` (Codex) or ``gzip`` (others).

The body is inflated once, before the route reads it, under the same bound as every
body and socket message: at most ``server.max_request_bytes`` inflated bytes are kept
(the compressed body is already held to that size by Sanic). Past it the request is
refused (413 ``request_too_large``) after inflating at most one byte more, so a small
compressed body that would inflate to gigabytes costs bounded memory and time.

- ``identity`` (or no header) passes the body through; ``gzip`` / ``x-gzip`` and
  ``zstd`` are inflated (several concatenated gzip members or zstd frames are one body,
  as RFC 9110 reads a coding); a list of codings (``gzip, zstd``) is undone in reverse
  order. Any other coding: 415 ``unsupported_content_encoding``.
- A body that is not valid data for its coding (truncated, corrupt): 400
  ``invalid_content_encoding``.
- zstd frames may ask for a large decoding window: it is held to 8 MiB (what
  compressors use up to level 19) or the inflated limit, whichever is larger, and
  128 MiB at most.
"""

from __future__ import annotations

import io
import zlib

import zstandard

from protocol.errors import Refusal

__all__ = ["inflate_body", "ENCODINGS"]

ENCODINGS = ("gzip", "zstd")
_GZIP = 16 + zlib.MAX_WBITS  # zlib's wbits for a gzip wrapper
_PIECE = 1 << 20  # inflated bytes asked for at a time
_MIN_WINDOW = 1 << 23  # what compressors use by default up to level 19 (8 MiB)


def _too_large(limit: int) -> Refusal:
    return Refusal(f"The request body is too large once decompressed: at most {limit} bytes "
                   "(server.max_request_bytes).", code="request_too_large", status=413)


def _invalid(coding: str, why: str) -> Refusal:
    return Refusal(f"The request body is not valid {coding} data ({why}).", code="invalid_content_encoding")


def _gunzip(data: bytes, limit: int) -> bytes:
    out: list[bytes] = []
    size = 0
    pending = data
    while pending:
        d = zlib.decompressobj(_GZIP)
        chunk_in = pending
        try:
            while True:
                piece = d.decompress(chunk_in, min(_PIECE, limit + 1 - size))
                size += len(piece)
                out.append(piece)
                if size > limit:
                    raise _too_large(limit)
                chunk_in = d.unconsumed_tail
                if d.eof or not chunk_in:
                    break
        except zlib.error as exc:
            raise _invalid("gzip", str(exc)) from None
        if not d.eof:
            raise _invalid("gzip", "the data ends before the stream does")
        pending = d.unused_data
    return b"".join(out)


def _unzstd(data: bytes, limit: int) -> bytes:
    window = max(_MIN_WINDOW, 1 << max(0, limit - 1).bit_length())
    decompressor = zstandard.ZstdDecompressor(max_window_size=min(window, 1 << 27))
    reader = decompressor.stream_reader(io.BytesIO(data), read_across_frames=True)
    out: list[bytes] = []
    size = 0
    try:
        while True:
            piece = reader.read(min(_PIECE, limit + 1 - size))
            if not piece:
                break
            size += len(piece)
            out.append(piece)
            if size > limit:
                raise _too_large(limit)
    except zstandard.ZstdError as exc:
        raise _invalid("zstd", str(exc)) from None
    if data and not out and not _is_empty_frame(data):
        raise _invalid("zstd", "no frame in it")
    return b"".join(out)


def _is_empty_frame(data: bytes) -> bool:
    """A valid frame that holds no bytes (zstandard reads it as b'' like garbage)."""
    try:
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=1) == b""
    except zstandard.ZstdError:
        return False


def inflate_body(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """`body` with its content codings undone (the module docstring), or a `Refusal`."""
    if not content_encoding:
        return body
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    unknown = [c for c in codings if c not in ("identity", "gzip", "x-gzip", "zstd")]
    if unknown:
        raise Refusal(f"Content-Encoding {unknown[0]!r} is not supported: send the body as is, or compressed with "
                      "gzip or zstd.", param=None, code="unsupported_content_encoding", status=415)
    for coding in reversed(codings):  # the last one applied is undone first
        if coding in ("gzip", "x-gzip"):
            body = _gunzip(body, limit)
        elif coding == "zstd":
            body = _unzstd(body, limit)
    return body
