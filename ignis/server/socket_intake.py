"""WebSocket messages from the wire to the session, with bounded memory.

websockets' parser decodes every frame of a TCP read at once (inflating compressed ones
up to the transport's size limit), and Sanic's frame assembler then keeps the message:
a 64 KB compressed frame can pin 63 MiB per socket, an invalid UTF-8 frame raises inside
Sanic's event task (losing every later frame of that read), and a bad fragmented message
leaves its first fragment behind. Here instead:

- `Intake` (one per socket) takes each data frame as the parser decodes it, as the last
  step of the decoding chain (a non-negotiated `IntakeHook` "extension"), and hands the
  parser an empty frame: the payload lives only in the message being assembled, never in
  the parser, its event list or its stored errors.
- A message over ``server.max_request_bytes``, or a frame that would take the
  server-wide `SocketBuffers` past ``server.socket_buffer_bytes``, is refused at once:
  what it had buffered is dropped, the rest of its frames are discarded as they come,
  and the reader gets a `RefusedMessage` (an ``error`` event for the client).
- `BudgetedDeflate` inflates a compressed frame in bounded pieces and keeps only up to
  what the message may still take; past it, the rest of the frame is inflated and thrown
  away (the zlib stream must stay in step for the next message), so a zip bomb costs
  CPU, not memory.
- Invalid UTF-8 in a text message: the message is refused with an ``error`` event
  (``invalid_frame``), and the socket stays open. RFC 6455 (8.1) says to fail the
  connection, but the framing itself is intact, so nothing after it is misread; an error
  event names the problem (a 1007 close would not) and keeps the socket's other running
  responses alive, as every other bad frame here does.
- A message's bytes count against the budget from its first frame until the reader asks
  for the next message (by then it has been decoded and answered, or turned into a queued
  request), or the socket closes. A closed socket (close frame, FIN, RST) drops
  everything at once.
"""

from __future__ import annotations

import asyncio
import codecs
from collections import deque
from dataclasses import dataclass
from typing import Any

from websockets.extensions.base import Extension
from websockets.extensions.permessage_deflate import PerMessageDeflate, ServerPerMessageDeflateFactory
from websockets.frames import Frame, Opcode
from websockets.typing import ExtensionName

from protocol.errors import Refusal

__all__ = ["SocketBuffers", "RefusedMessage", "Intake", "IntakeHook", "BudgetedDeflate", "BudgetedDeflateFactory",
           "DATA_OPCODES"]

DATA_OPCODES = (Opcode.TEXT, Opcode.BINARY, Opcode.CONT)
_IN_PIECE = 64 * 1024  # compressed bytes fed to zlib at a time (its unconsumed tail is copied each call)
_OUT_PIECE = 1 << 20  # inflated bytes asked of zlib at a time


class SocketBuffers:
    """The server-wide budget of socket message bytes held (inflated, not yet answered)."""

    def __init__(self, limit: int) -> None:
        self.limit = int(limit)
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used = max(0, self.used - n)

    @property
    def free(self) -> int:
        return max(0, self.limit - self.used)


@dataclass(frozen=True)
class RefusedMessage:
    """Stands in for a message that was not kept: the reader answers it with `refusal`."""

    refusal: Refusal


def _too_large(limit: int) -> Refusal:
    return Refusal(f"The message is too large: at most {limit} bytes (server.max_request_bytes).",
                   code="request_too_large", status=413)


def _buffers_full() -> Refusal:
    return Refusal("The server holds too many unanswered socket messages right now (server.socket_buffer_bytes); "
                   "send this one again shortly.", code="socket_buffer_full", type="server_error", status=503)


def _not_utf8(exc: UnicodeDecodeError) -> Refusal:
    return Refusal(f"The text message is not valid UTF-8 ({exc.reason}); send each event as a UTF-8 JSON text frame.",
                   code="invalid_frame")


class Intake:
    """One socket's message assembly (see the module docstring)."""

    def __init__(self, buffers: SocketBuffers, max_message: int) -> None:
        self.buffers = buffers
        self.max_message = int(max_message)
        self.ready: deque[tuple[str | bytes | RefusedMessage, int]] = deque()  # (message, bytes charged)
        self.held = 0  # the charge of the message the reader has now
        self.arrived = asyncio.Event()
        self.closed = False
        # The message being received.
        self._chunks: list[Any] = []
        self._size = 0
        self._decoder: codecs.IncrementalDecoder | None = None
        self._skipping = False
        # Set by BudgetedDeflate for the frame it just shrank to nothing.
        self.pending_refusal: Refusal | None = None

    def allowance(self) -> int:
        """How many inflated bytes the next frame of this message may have (none once the
        message is refused: its frames are only inflated to be thrown away)."""
        if self._skipping:
            return 0
        return max(0, min(self.max_message - self._size, self.buffers.free))

    def refusal_for(self, size: int) -> Refusal:
        """Why a frame of `size` inflated bytes cannot be kept."""
        return _too_large(self.max_message) if self._size + size > self.max_message else _buffers_full()

    def take(self, frame: Frame) -> None:
        """A data frame, decoded: keep its payload in the message, or refuse the message."""
        if self.closed:
            return
        if frame.opcode is not Opcode.CONT:  # a new message
            self._drop()
            self._skipping = False
            self._decoder = codecs.getincrementaldecoder("utf-8")("strict") if frame.opcode is Opcode.TEXT else None
        refusal, self.pending_refusal = self.pending_refusal, None
        if not self._skipping and refusal is None:
            n = len(frame.data)
            if self._size + n > self.max_message or not self.buffers.take(n):
                refusal = self.refusal_for(n)
            else:
                self._size += n
                try:
                    piece = self._decoder.decode(frame.data, frame.fin) if self._decoder else bytes(frame.data)
                except UnicodeDecodeError as exc:
                    refusal = _not_utf8(exc)
                else:
                    self._chunks.append(piece)
        if refusal is not None and not self._skipping:
            self._drop()
            self._skipping = True
            self._push(RefusedMessage(refusal), 0)
        if frame.fin:
            if not self._skipping:
                message = "".join(self._chunks) if self._decoder is not None else b"".join(self._chunks)
                self._chunks = []
                self._push(message, self._size)
                self._size = 0
            self._skipping = False
            self._decoder = None

    def _push(self, message: str | bytes | RefusedMessage, charge: int) -> None:
        self.ready.append((message, charge))
        self.arrived.set()

    def _drop(self) -> None:
        """Forget the message being received (and give its bytes back)."""
        self._chunks = []
        self.buffers.give(self._size)
        self._size = 0

    def next(self) -> str | bytes | RefusedMessage | None:
        """The next complete message, or None; the one before it is answered by now."""
        self.release()
        if not self.ready:
            self.arrived.clear()
            return None
        message, self.held = self.ready.popleft()
        if not self.ready:
            self.arrived.clear()
        return message

    def release(self) -> None:
        self.buffers.give(self.held)
        self.held = 0

    def close(self) -> None:
        """The socket is gone: give everything back at once."""
        self.closed = True
        self.release()
        self._drop()
        self._decoder = None
        while self.ready:
            self.buffers.give(self.ready.popleft()[1])
        self.arrived.set()  # wake a reader: it finds the socket closed


class IntakeHook(Extension):
    """The last step of the socket's decoding chain (first in its extension list, which
    websockets applies in reverse): data frames go to the `Intake`, the parser keeps an
    empty frame. Never negotiated, so it changes nothing on the wire."""

    name = ExtensionName("x-ignis-intake")

    def __init__(self, intake: Intake) -> None:
        self.intake = intake

    def decode(self, frame: Frame, *, max_size: int | None = None) -> Frame:
        if frame.opcode not in DATA_OPCODES:
            return frame
        self.intake.take(frame)
        return Frame(frame.opcode, b"", frame.fin)

    def encode(self, frame: Frame) -> Frame:
        return frame


class _BoundedInflater:
    """Stands in for the zlib decompressor `PerMessageDeflate.decode` calls: inflates all the
    input it is given, in pieces, and returns at most `limit` bytes of it; past that it
    keeps nothing and records the overflow. It never leaves input unconsumed (so zlib stays
    in step with the sender's stream, and the parent never sees a tail to refuse)."""

    unconsumed_tail = b""

    def __init__(self, real: Any, owner: BudgetedDeflate) -> None:
        self.real = real
        self.owner = owner  # holds this frame's limit, and where the overflow is recorded

    def decompress(self, data: Any, max_length: int = 0) -> bytes:
        del max_length  # the parent's limit: ours is `limit`
        view = memoryview(data)
        owner = self.owner
        keep: list[bytes] = []
        kept = 0
        for at in range(0, max(len(view), 1), _IN_PIECE):
            pending: Any = view[at : at + _IN_PIECE]
            while True:
                chunk = self.real.decompress(pending, _OUT_PIECE)
                if not owner.overflow:
                    if kept + len(chunk) <= owner.limit:
                        keep.append(chunk)
                        kept += len(chunk)
                    else:
                        owner.overflow = True
                        keep = []
                pending = self.real.unconsumed_tail
                if not pending and len(chunk) < _OUT_PIECE:
                    break
        return b"".join(keep)


class BudgetedDeflate(PerMessageDeflate):
    """permessage-deflate that keeps at most what the message may still take (websockets'
    own decode, over a `_BoundedInflater`)."""

    intake: Intake
    _inflater: _BoundedInflater | None = None
    limit = 0  # inflated bytes the frame being decoded may keep
    overflow = False  # whether it had more

    # The parent assigns, replaces (no context takeover) and deletes `self.decoder`.
    @property  # type: ignore[override]
    def decoder(self) -> _BoundedInflater | None:
        return self._inflater

    @decoder.setter
    def decoder(self, real: Any) -> None:
        self._inflater = _BoundedInflater(real, self)

    @decoder.deleter
    def decoder(self) -> None:
        self._inflater = None

    def decode(self, frame: Frame, *, max_size: int | None = None) -> Frame:
        if frame.opcode not in DATA_OPCODES:
            return frame
        allowed = self.intake.allowance()
        if max_size is not None:
            allowed = min(allowed, max_size)
        self.limit, self.overflow = allowed, False
        out = super().decode(frame, max_size=None)
        if self.overflow:
            self.intake.pending_refusal = self.intake.refusal_for(allowed + 1)
            return Frame(frame.opcode, b"", frame.fin)
        return out


class BudgetedDeflateFactory(ServerPerMessageDeflateFactory):
    """Negotiates permessage-deflate as websockets does, with `BudgetedDeflate` bound to
    one socket's `Intake`."""

    def __init__(self, intake: Intake) -> None:
        super().__init__()
        self.intake = intake

    def process_request_params(self, params: Any, accepted_extensions: Any) -> tuple[Any, PerMessageDeflate]:
        response, ext = super().process_request_params(params, accepted_extensions)
        budgeted = BudgetedDeflate(ext.remote_no_context_takeover, ext.local_no_context_takeover,
                                   ext.remote_max_window_bits, ext.local_max_window_bits, self.compress_settings)
        budgeted.intake = self.intake
        return response, budgeted
