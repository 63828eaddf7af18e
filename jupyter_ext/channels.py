"""The open live channels (WebSockets) of clients and workers, by token.

Each channel handler registers a way to close it; :meth:`Channels.close_for_token`
closes every channel a token opened. The channel handlers call it themselves when
:meth:`~jupyter_ext.auth.TokenService.until_invalid` says the token was revoked or
expired; it is also the one hook an auth layer with its own view of tokens (a
cache) calls when it learns a token is no longer good. Closing is the channel's
401: the peer reconnects, and its handshake is refused.
"""

import logging
from collections import defaultdict
from collections.abc import Callable

from gpulayer.contracts import CLOSE_GOING_AWAY, CLOSE_UNAUTHORIZED

log = logging.getLogger(__name__)

#: Closes one channel with a close code and the reason its peer reads.
Closer = Callable[[int, str], None]


class Channels:
    """Open channels by the id of the token that opened them."""

    def __init__(self) -> None:
        self._open: dict[str, set[Closer]] = defaultdict(set)

    def opened(self, token_id: str, close: Closer) -> None:
        """A channel authenticated with ``token_id`` is open; ``close`` closes it."""
        self._open[token_id].add(close)

    def closed(self, token_id: str, close: Closer) -> None:
        """That channel has closed (any way)."""
        closers = self._open.get(token_id)
        if closers is not None:
            closers.discard(close)
            if not closers:
                del self._open[token_id]

    def close_for_token(self, token_id: str, why: str = "the token is no longer valid") -> int:
        """Close every channel ``token_id`` opened; returns how many."""
        closers = list(self._open.pop(token_id, ()))
        for close in closers:
            close(CLOSE_UNAUTHORIZED, why)
        if closers:
            log.info("closed %d channel(s) of token %s: %s", len(closers), token_id, why)
        return len(closers)

    def close_all(self, why: str) -> None:
        """Close every channel with 1001 (the control plane stops; peers reconnect)."""
        for closers in self._open.values():
            for close in list(closers):
                close(CLOSE_GOING_AWAY, why)
        self._open.clear()

    def count(self) -> int:
        """How many channels are open."""
        return sum(len(c) for c in self._open.values())
