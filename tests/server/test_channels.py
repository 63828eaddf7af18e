"""``Channels``: the open live channels by token, and the hook that closes them."""

from gpulayer.contracts import CLOSE_GOING_AWAY, CLOSE_UNAUTHORIZED
from jupyter_ext.channels import Channels


def test_close_for_token_closes_only_that_tokens_channels():
    channels = Channels()
    closed: list[tuple[str, int, str]] = []
    a1 = lambda code, why: closed.append(("a1", code, why))  # noqa: E731
    a2 = lambda code, why: closed.append(("a2", code, why))  # noqa: E731
    b = lambda code, why: closed.append(("b", code, why))  # noqa: E731
    channels.opened("tok-a", a1)
    channels.opened("tok-a", a2)
    channels.opened("tok-b", b)
    assert channels.count() == 3
    assert channels.close_for_token("tok-a", "token 'a' was revoked") == 2
    assert sorted(closed) == [("a1", CLOSE_UNAUTHORIZED, "token 'a' was revoked"),
                              ("a2", CLOSE_UNAUTHORIZED, "token 'a' was revoked")]  # fmt: skip
    assert channels.count() == 1
    assert channels.close_for_token("tok-a") == 0  # nothing left to close


def test_a_closed_channel_is_forgotten_and_close_all_goes_away():
    channels = Channels()
    closed: list[int] = []
    c1 = lambda code, why: closed.append(code)  # noqa: E731
    c2 = lambda code, why: closed.append(code)  # noqa: E731
    channels.opened("t", c1)
    channels.opened("u", c2)
    channels.closed("t", c1)
    assert channels.count() == 1
    channels.close_all("the control plane is stopping")
    assert closed == [CLOSE_GOING_AWAY]
    assert channels.count() == 0
