"""A raw WebSocket client for hostile frames: any opcode, fragment, payload or
compression, several frames in one TCP write, and the server's frames read back
(inflated when permessage-deflate was negotiated)."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import zlib
from typing import Any

from tests.server.server_harness import KEY

TEXT, BINARY, CONT, CLOSE = 0x1, 0x2, 0x0, 0x8
_TAIL = b"\x00\x00\xff\xff"


def deflate(data: bytes) -> bytes:
    """One message's permessage-deflate payload (its own stream: valid with or without
    context takeover)."""
    c = zlib.compressobj(wbits=-15)
    return c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)[: -len(_TAIL)] if data else b"\x00"


def zeros_bomb(size: int, piece: int = 1 << 20) -> bytes:
    """The deflate payload of `size` zero bytes, built without holding them."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    out = [c.compress(bytes(min(piece, size - at))) for at in range(0, size, piece)]
    out.append(c.flush(zlib.Z_SYNC_FLUSH))
    return b"".join(out)[: -len(_TAIL)]


def frame(opcode: int, payload: bytes, *, fin: bool = True, rsv1: bool = False) -> bytes:
    head = bytearray([(0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode])
    n = len(payload)
    if n < 126:
        head.append(0x80 | n)
    elif n < 1 << 16:
        head.append(0x80 | 126)
        head += struct.pack("!H", n)
    else:
        head.append(0x80 | 127)
        head += struct.pack("!Q", n)
    mask = os.urandom(4)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload)) if n < 4096 else _mask(payload, mask)
    return bytes(head) + mask + body


def _mask(payload: bytes, mask: bytes) -> bytes:
    m = int.from_bytes((mask * (len(payload) // 4 + 1))[: len(payload)], "big")
    return (int.from_bytes(payload, "big") ^ m).to_bytes(len(payload), "big")


class RawSocket:
    def __init__(self, srv: Any, *, compress: bool = True, key: str | None = KEY, timeout: float = 60) -> None:
        self.sock = socket.create_connection((srv.host, srv.port), timeout=timeout)
        lines = ["GET /v1/responses HTTP/1.1", f"Host: 127.0.0.1:{srv.port}", "Upgrade: websocket",
                 "Connection: Upgrade", f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}",
                 "Sec-WebSocket-Version: 13"]
        if key:
            lines.append(f"Authorization: Bearer {key}")
        if compress:
            lines.append("Sec-WebSocket-Extensions: permessage-deflate")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, "closed during the handshake"
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        self.deflated = b"permessage-deflate" in head.lower()
        assert self.deflated == compress, head
        self.inflater = zlib.decompressobj(wbits=-15)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def text(self, obj: Any) -> bytes:
        """The frame of one JSON event (compressed when negotiated)."""
        data = json.dumps(obj).encode()
        return frame(TEXT, deflate(data), rsv1=True) if self.deflated else frame(TEXT, data)

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv_frame(self) -> tuple[int, bytes, bool]:
        b0, b1 = self._read(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._read(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._read(8))[0]
        payload = self._read(n)
        if b0 & 0x40:
            payload = self.inflater.decompress(payload + _TAIL)
        return b0 & 0x0F, payload, bool(b0 & 0x80)

    def recv_event(self) -> dict[str, Any]:
        """The next text message as JSON (ping / pong skipped); a close raises ConnectionError."""
        while True:
            op, payload, fin = self.recv_frame()
            if op == CLOSE:
                raise ConnectionError(f"close {payload[:2].hex()}")
            if op == TEXT:
                assert fin
                return json.loads(payload)

    def close(self, how: str = "frame") -> None:
        """'frame' (a close frame, then FIN), 'fin' (TCP close only) or 'rst'."""
        if how == "frame":
            try:
                self.sock.sendall(frame(CLOSE, struct.pack("!H", 1000)))
            except OSError:
                pass
        if how == "rst":
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()
