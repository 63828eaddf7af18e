"""A socket option every WebSocket of gpulayer's asyncio ends sets.

Kept apart from :mod:`gpulayer.kernel_relay` so that the worker's channel can use it
without importing ZMQ (~20 ms of every worker's start, ADR 0141).
"""

import contextlib
import socket
from typing import Any


def nodelay(ws: Any) -> None:
    """Small frames go out at once on a WebSocket (no Nagle wait for an ACK)."""
    sock = ws.transport.get_extra_info("socket") if ws.transport is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
