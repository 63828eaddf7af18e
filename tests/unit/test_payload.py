"""The payload envelope: header checks before unpickling, outcomes, local modules by value."""

import sys

import pytest

from gpulayer import payload
from gpulayer.errors import PayloadError


def test_round_trip_of_calls_and_outcomes():
    data = payload.pack_calls(lambda x, y=1: x + y, [((1,), {}), ((1,), {"y": 5})])
    assert payload.header(data).kind == "calls"
    packed, summary = payload.run_calls(data)
    assert summary == payload.Summary(calls=2, errors=0, first_error="")
    assert [o.value for o in payload.unpack(packed, "outcomes")] == [2, 6]


def test_an_exception_is_an_outcome_with_its_traceback():
    def fail(x):
        raise ValueError(f"no {x}")

    packed, summary = payload.run_calls(payload.pack_calls(fail, [((3,), {})]))
    assert summary.errors == 1 and summary.first_error == "ValueError: no 3"
    (outcome,) = payload.unpack(packed, "outcomes")
    assert not outcome.ok
    assert isinstance(outcome.error(), ValueError)
    assert "in fail" in outcome.traceback and "run_calls" not in outcome.traceback


def test_another_python_is_refused_before_unpickling(monkeypatch):
    monkeypatch.setattr(payload, "PYTHON", "3.10")
    data = payload.pack("values", {"a": 1})
    monkeypatch.undo()
    with pytest.raises(PayloadError, match=r"made by Python 3\.10 .* runs Python 3\.\d+"):
        payload.unpack(data, "values")


@pytest.mark.parametrize(
    "data, message",
    [
        (b"nope", "not a gpulayer payload"),
        (payload.MAGIC + (10**6).to_bytes(4, "big"), "bad header length"),
        (payload.MAGIC + (7).to_bytes(4, "big") + b"{bad js", "corrupt"),
    ],
)
def test_garbage_is_refused_with_a_clear_message(data, message):
    with pytest.raises(PayloadError, match=message):
        payload.header(data)


def test_a_newer_format_asks_for_an_upgrade(monkeypatch):
    monkeypatch.setattr(payload, "FORMAT", 99)
    data = payload.pack("values", 1)
    monkeypatch.undo()
    with pytest.raises(PayloadError, match="upgrade gpulayer"):
        payload.header(data)


def test_unpicklable_values_are_named():
    import threading

    with pytest.raises(PayloadError, match="cannot send the thing: TypeError"):
        payload.pack("values", threading.Lock(), what="the thing")


def test_a_value_that_cannot_travel_back_becomes_that_calls_error():
    import threading

    _, summary = payload.run_calls(payload.pack_calls(lambda: threading.Lock(), [((), {})]))
    assert summary.errors == 1 and "cannot be sent back" in summary.first_error


def test_local_modules_travel_by_value(tmp_path, monkeypatch):
    (tmp_path / "gl_local_mod_q.py").write_text("def double(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import gl_local_mod_q

    try:
        data = payload.pack_calls(gl_local_mod_q.double, [((4,), {})])
        del sys.modules["gl_local_mod_q"]
        monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
        packed, _ = payload.run_calls(data)  # the module cannot be imported any more
        assert payload.unpack(packed, "outcomes")[0].value == 8
    finally:
        sys.modules.pop("gl_local_mod_q", None)


def test_a_local_module_imported_between_two_calls_travels_by_value(tmp_path, monkeypatch):
    payload.pack_calls(abs, [((-1,), {})])  # the local modules are listed (and kept)
    (tmp_path / "gl_local_mod_r.py").write_text("def triple(x):\n    return 3 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import gl_local_mod_r

    try:
        data = payload.pack_calls(gl_local_mod_r.triple, [((4,), {})])
        del sys.modules["gl_local_mod_r"]
        monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
        packed, _ = payload.run_calls(data)  # the module cannot be imported any more
        assert payload.unpack(packed, "outcomes")[0].value == 12
    finally:
        sys.modules.pop("gl_local_mod_r", None)


def test_links_are_followed_to_judge_whether_a_module_is_local(tmp_path, monkeypatch):
    """A folder linked to an installed place holds installed modules (sent by
    name); a file linked from an installed place to the user's own is local (sent
    by value)."""
    installed = tmp_path / "env" / "site-packages"
    installed.mkdir(parents=True)
    (installed / "gl_linked_installed.py").write_text("X = 1\n")
    (tmp_path / "to-installed").symlink_to(installed)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "gl_linked_mine.py").write_text("Y = 2\n")
    shelf = tmp_path / "shelf" / "site-packages"
    shelf.mkdir(parents=True)
    (shelf / "gl_linked_mine.py").symlink_to(mine / "gl_linked_mine.py")
    monkeypatch.syspath_prepend(str(shelf))
    monkeypatch.syspath_prepend(str(tmp_path / "to-installed"))
    import gl_linked_installed  # noqa: F401
    import gl_linked_mine  # noqa: F401

    try:
        names = {m.__name__ for m in payload.local_modules()}
        assert "gl_linked_mine" in names
        assert "gl_linked_installed" not in names
    finally:
        sys.modules.pop("gl_linked_installed", None)
        sys.modules.pop("gl_linked_mine", None)
