"""The judge ↔ runner wire: length-prefixed JSON messages over a Unix socket, with file descriptors.

Only JSON crosses, in both directions: the judge never unpickles anything the untrusted runner
sends, and every message from the runner is size-capped and validated by the judge before use.
File descriptors (the shared-memory input arena) travel with a message as ``SCM_RIGHTS``.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import time
from typing import Any

from kfoundry.core.errors import KfError

#: Largest message either side accepts (a runner cannot make the judge allocate more).
MAX_MESSAGE = 4 << 20
_HEADER = struct.Struct("!I")


class ChannelClosed(KfError):
    """The other side closed the channel (or died)."""


class ChannelTimeout(KfError):
    """No message arrived within the deadline."""


class Channel:
    """One end of a socket pair; ``send``/``recv`` whole JSON objects."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        data = json.dumps(message, separators=(",", ":"), allow_nan=True).encode()
        if len(data) > MAX_MESSAGE:
            raise KfError(f"message of {len(data)} bytes exceeds the channel limit")
        frame = _HEADER.pack(len(data)) + data
        try:
            if fds:
                sent = socket.send_fds(self.sock, [frame], fds)
                if sent < len(frame):
                    self.sock.sendall(frame[sent:])
            else:
                self.sock.sendall(frame)
        except OSError as exc:
            raise ChannelClosed(f"channel closed while sending: {exc}") from None

    def _read_exact(self, n: int, deadline: float | None, fds: list[int] | None) -> bytes:
        chunks: list[bytes] = []
        got = 0
        while got < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                    raise ChannelTimeout("no answer within the deadline")
            try:
                if fds is not None:
                    data, new_fds, _, _ = socket.recv_fds(self.sock, n - got, 8)
                    fds.extend(new_fds)
                else:
                    data = self.sock.recv(n - got)
            except OSError as exc:
                raise ChannelClosed(f"channel closed: {exc}") from None
            if not data:
                raise ChannelClosed("the other side closed the channel")
            chunks.append(data)
            got += len(data)
        return b"".join(chunks)

    def recv(self, timeout: float | None = None, fds: list[int] | None = None) -> dict[str, Any]:
        """The next message (a dict). ``fds`` collects any descriptors sent with it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        (size,) = _HEADER.unpack(self._read_exact(_HEADER.size, deadline, fds))
        if size > MAX_MESSAGE:
            raise ChannelClosed(f"message of {size} bytes exceeds the channel limit")
        try:
            message = json.loads(self._read_exact(size, deadline, fds))
        except ValueError:
            raise ChannelClosed("malformed message on the channel") from None
        if not isinstance(message, dict):
            raise ChannelClosed("malformed message on the channel")
        return message

    def close(self) -> None:
        self.sock.close()


def channel_pair() -> tuple[Channel, Channel]:
    """(judge end, runner end)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return Channel(a), Channel(b)
