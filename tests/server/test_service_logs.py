"""The services' log lines reach the Jupyter server's log at the level it shows
(``jupyter_ext.service.route_service_logs``), and no line is built below that level."""

import logging

import pytest

from jupyter_ext.service import route_service_logs


class Kept(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def server_log(request):
    """A server logger as traitlets leaves it: the logger at DEBUG, its one handler
    at the server's ``--log-level``; ``jupyter_ext``'s logger restored after."""
    ours = logging.getLogger("jupyter_ext")
    saved = (ours.level, list(ours.handlers))
    target = logging.getLogger(f"test-server-{request.node.name}")
    target.setLevel(logging.DEBUG)
    target.propagate = False
    yield target
    for h in list(target.handlers):
        target.removeHandler(h)
    ours.setLevel(saved[0])
    ours.handlers[:] = saved[1]


@pytest.mark.parametrize("shown", [logging.INFO, logging.DEBUG])
def test_service_lines_reach_the_server_log_at_the_level_it_shows(server_log, shown):
    kept = Kept(shown)
    server_log.handlers[:] = [kept]  # only it: pytest's capture handlers show everything
    route_service_logs(server_log)
    service = logging.getLogger("jupyter_ext.tasks")
    service.info("task t1 failed")
    service.debug("task t2 succeeded")
    if shown == logging.INFO:
        assert kept.lines == ["task t1 failed"]
        # A warm call's debug line is not even built when the server does not show it.
        assert not service.isEnabledFor(logging.DEBUG)
    else:
        assert kept.lines == ["task t1 failed", "task t2 succeeded"]
