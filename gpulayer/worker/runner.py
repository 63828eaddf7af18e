"""The warm function runner: a Python process that makes pickled calls, one at a time.

Started by :class:`gpulayer.worker.functions.RunnerPool` as
``python -m gpulayer.worker.runner``; it imports only :mod:`gpulayer.payload`
(and what the user's functions import) so it starts fast and stays small.

Frames on its stdin/stdout (8-byte big-endian length, then the body)::

    worker -> runner   pickle ("call", call_id, payload, env, cwd, skip, parts)
    runner -> worker   JSON   ["ready", pid]
                       JSON   ["out", "stdout" | "stderr", text]   what the call printed, by line
                       JSON   ["part", call_id, index], then that one call's outcome as a
                       raw frame (only with ``parts``: as each call of a chunk returns)
                       JSON   ["done", call_id, calls, errors, first_error], then the
                       outcomes as one raw frame

``skip`` lists the calls of the payload not to make (an earlier attempt finished
them, docs/adr/0096).

The runner runs user code, so the worker never unpickles what it sends: only JSON
and the outcomes' bytes, which go to the job's client as they are.

``sys.stdout``/``sys.stderr`` are replaced by writers that send ``out`` frames, so
a call's prints arrive in order and before its ``done``. File descriptor 1 is
pointed at 2, which the worker reads too: output of C code lands there.
"""

import json
import os
import pickle
import struct
import sys
import threading
from typing import Any, BinaryIO

from gpulayer import payload

_LEN = struct.Struct(">Q")
#: The largest result part sent (``CreateResultPart.outcome``'s limit, INLINE_BYTES).
PART_MAX_BYTES = 256 * 1024
#: Bound now: a call that replaces ``json.dumps`` must not break the runner's frames.
_encode = json.JSONEncoder().encode


class Channel:
    """Length-prefixed frames over two binary files: pickles in, JSON (and raw
    outcomes) out."""

    def __init__(self, rfile: BinaryIO, wfile: BinaryIO) -> None:
        self._r = rfile
        self._w = wfile
        self._lock = threading.Lock()

    def send(self, *msg: Any, raw: bytes | None = None) -> None:
        """Send ``msg`` as a JSON frame, followed by ``raw`` as a frame of its own."""
        data = _encode(msg).encode()
        with self._lock:
            self._w.write(_LEN.pack(len(data)))
            self._w.write(data)
            if raw is not None:
                self._w.write(_LEN.pack(len(raw)))
                self._w.write(raw)
            self._w.flush()

    def recv(self) -> tuple[Any, ...] | None:
        """The next frame, or None at end of file."""
        head = self._read(_LEN.size)
        if head is None:
            return None
        data = self._read(_LEN.unpack(head)[0])
        return None if data is None else pickle.loads(data)

    def _read(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._r.read(min(n - len(buf), 1 << 20))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)


class _FrameStream:
    """A text stream that sends each complete line (and, on flush, the rest) as a frame."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, channel: Channel, name: str) -> None:
        self._channel = channel
        self.name = name
        self._buf = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            self._buf += text
            if "\n" in self._buf:
                head, _, self._buf = self._buf.rpartition("\n")
                for line in head.split("\n"):
                    self._channel.send("out", self.name, line)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._buf:
                self._channel.send("out", self.name, self._buf)
                self._buf = ""

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return 2  # C-level writers (faulthandler, subprocess) get the real stderr pipe


def main() -> None:
    """Serve calls until the worker closes stdin."""
    rfile = os.fdopen(os.dup(0), "rb", buffering=0)
    wfile = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # a call that reads stdin gets EOF, not our frames
    os.close(devnull)
    os.dup2(2, 1)  # C-level stdout joins stderr, which the worker reads line by line
    channel = Channel(rfile, wfile)
    out, err = _FrameStream(channel, "stdout"), _FrameStream(channel, "stderr")
    sys.stdout, sys.stderr = out, err
    sys.stdin = open(os.devnull)  # noqa: SIM115 - lives as long as the process
    channel.send("ready", os.getpid())
    per_call: set[str] = set()
    while (msg := channel.recv()) is not None:
        _, call_id, data, env, cwd, skip, parts = msg
        for key in per_call - env.keys():
            os.environ.pop(key, None)
        os.environ.update(env)
        per_call = set(env)
        os.chdir(cwd)
        sys.path[0] = cwd
        on_outcome = None
        if parts:

            def on_outcome(index: int, outcome: payload.Outcome, call_id: str = call_id) -> None:
                out.flush()  # its prints before its part
                err.flush()
                part = payload.pack_outcome(outcome)
                if len(part) <= PART_MAX_BYTES:  # a larger one travels with the result only
                    channel.send("part", call_id, index, raw=part)

        result, summary = payload.run_calls(data, skip=skip, on_outcome=on_outcome)
        out.flush()
        err.flush()
        channel.send(
            "done", call_id, summary.calls, summary.errors, summary.first_error, raw=result
        )


if __name__ == "__main__":
    main()
