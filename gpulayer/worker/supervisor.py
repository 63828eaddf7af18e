"""The task supervisor: kills a worker's task processes when the agent no longer can.

Started by :class:`gpulayer.worker.spawning.Fence` as
``python -m gpulayer.worker.supervisor FENCE_ID AGENT_PID``, in a session of its
own, with the read end of the fence's pipe as stdin. Lines on the pipe::

    pid N      a process that runs user code started; its process group is N
    until T    the agent's lease holds until T (``time.monotonic()``)
    stop       kill every task process now
    clean P    a folder of the agent's (its tasks root, a kernel's connection
               files): removed once the agent is gone
    forget P   the agent removed that folder itself

It kills (SIGKILL) the recorded process groups and every process whose
environment carries ``GPULAYER_FENCE=FENCE_ID`` (descendants that left their
group too):

* at end of file: every write end is closed, so the agent is gone (``kill -9``
  included); then it exits;
* when T passes with no newer ``until``: the agent is frozen (SIGSTOP) or cut off
  from the control plane, which will soon hand its tasks to another worker;
* on ``stop``.

At end of file, once the tasks are dead, it removes the folders it was given with
``clean``: an agent killed with SIGKILL (or by a closed terminal's SIGHUP) leaves no
task folders behind in the temp dir. An agent that stops on its own removes them
itself first.

It reads ``/proc`` (Linux) and imports only the standard library, so it starts
in tens of milliseconds and stays small.
"""

import contextlib
import os
import select
import shutil
import signal
import sys
import time

_HOUSEKEEPING_SECONDS = 1.0  # how often groups whose processes are all gone are forgotten
_KILL_DEADLINE_SECONDS = 10.0  # keep killing (forks racing the kill) at most this long
_KILL_POLL_SECONDS = 0.05


class Supervisor:
    """What the supervisor knows: the task process groups, the lease, the mark."""

    def __init__(self, fence_id: str, agent_pid: int) -> None:
        self.mark = f"GPULAYER_FENCE={fence_id}".encode()
        self.spared = {os.getpid(), agent_pid}
        self.groups: set[int] = set()
        self.deadline: float | None = None
        self.folders: set[str] = set()  # to remove once the agent is gone
        self._partial = b""

    def feed(self, data: bytes) -> None:
        """Take in what arrived on the pipe (whole lines; a partial one waits)."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            what, _, arg = line.decode(errors="replace").partition(" ")
            try:
                if what == "pid":
                    self.groups.add(int(arg))
                elif what == "until":
                    self.deadline = float(arg)
                elif what == "stop":
                    self.kill_all("the agent asked")
                elif what == "clean" and os.path.isabs(arg):
                    self.folders.add(arg)
                elif what == "forget":
                    self.folders.discard(arg)
            except ValueError:
                _say(f"ignoring a malformed line: {line!r}")

    def serve(self, fd: int) -> None:
        """Read the pipe until end of file, killing the tasks when it is time."""
        housekeeping = time.monotonic() + _HOUSEKEEPING_SECONDS
        while True:
            now = time.monotonic()
            wake = housekeeping if self.deadline is None else min(housekeeping, self.deadline)
            readable, _, _ = select.select([fd], [], [], max(0.0, wake - now))
            if readable:
                data = os.read(fd, 65536)
                if not data:
                    self.kill_all("the agent is gone")
                    self.clean()
                    return
                self.feed(data)
            now = time.monotonic()
            if self.deadline is not None and now >= self.deadline:
                self.deadline = None
                self.kill_all("the agent's lease ran out unrenewed")
            if now >= housekeeping:
                self.groups = {g for g in self.groups if _group_exists(g)}
                housekeeping = now + _HOUSEKEEPING_SECONDS

    def kill_all(self, why: str) -> int:
        """SIGKILL every task process until none is left (or a deadline); how many."""
        give_up = time.monotonic() + _KILL_DEADLINE_SECONDS
        killed: set[int] = set()
        while True:
            targets = self.targets()
            if not targets:
                break
            for pid in targets:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            for group in self.groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, signal.SIGKILL)
            killed |= targets
            if time.monotonic() > give_up:
                _say(f"{why}: {len(targets)} process(es) would not die: {sorted(targets)}")
                break
            time.sleep(_KILL_POLL_SECONDS)
        if killed:
            _say(f"{why}: killed {len(killed)} task process(es)")
        return len(killed)

    def clean(self) -> None:
        """Remove the agent's folders (what its tasks left in them included)."""
        for folder in sorted(self.folders):
            if os.path.lexists(folder):
                shutil.rmtree(folder, ignore_errors=True)
                _say(f"the agent is gone: removed {folder}")

    def targets(self) -> set[int]:
        """Live processes in a recorded group or carrying the fence's mark."""
        found = set()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in self.spared:
                continue
            pid = int(name)
            stat = _stat(pid)
            if stat is None or stat[0] == "Z":  # gone, or a zombie: holds nothing
                continue
            if stat[1] in self.groups or self._marked(pid):
                found.add(pid)
        return found

    def _marked(self, pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                return self.mark in f.read().split(b"\0")
        except OSError:  # gone, or another user's process we may not read
            return False


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, process group)`` of ``pid`` from ``/proc/PID/stat``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[2])


def _group_exists(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _say(text: str) -> None:
    print(f"gpulayer task supervisor {os.getpid()}: {text}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> None:
    """``python -m gpulayer.worker.supervisor FENCE_ID AGENT_PID`` (the pipe on stdin)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the agent
    fence_id, agent_pid = argv[0], int(argv[1])
    Supervisor(fence_id, agent_pid).serve(sys.stdin.fileno())


if __name__ == "__main__":
    main(sys.argv[1:])
