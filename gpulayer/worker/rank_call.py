"""One rank of a distributed function: ``python -m gpulayer.worker.rank_call PAYLOAD``.

``@gl.remote(nodes=..., nproc_per_node=...)`` sends one pickled call; the
worker writes it to a file and starts this module on every rank of the gang
(through torchrun or the direct launcher), so each rank makes the same call
with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ... set. Global rank 0 writes the
packed outcome to ``$GPULAYER_CALL_DIR/outcome``: its return value is the call's
answer. A rank whose call raised prints the remote traceback (its last line
names the error, which the gang's failure reason quotes), writes its outcome to
``$GPULAYER_CALL_DIR/raised.<rank>`` (the worker sends the failing rank's one
back, so the caller gets that exception, and knows it is the function's answer,
not a crash to retry) and exits 1, which stops the gang.
"""

import linecache
import os
import sys
from pathlib import Path
from typing import Any

from gpulayer import payload

OUTCOME_FILE = "outcome"
RAISED_PREFIX = "raised."


def raised_file(folder: Path, rank: int) -> Path:
    """Where ``rank`` leaves its outcome when its call raised."""
    return folder / f"{RAISED_PREFIX}{rank}"


def main(argv: list[str] | None = None) -> int:
    """Make the call in the payload file ``argv[0]``; answers the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gpulayer.worker.rank_call PAYLOAD_FILE", file=sys.stderr)
        return 2
    data = Path(args[0]).read_bytes()
    packed, summary = payload.run_calls(data)
    sys.stdout.flush()
    folder = os.environ.get("GPULAYER_CALL_DIR")
    rank = os.environ.get("RANK", "0")
    if summary.errors == 0:
        if folder and rank == "0":
            _write(Path(folder) / OUTCOME_FILE, packed)
        return 0
    if folder:  # before exiting: the exit is what stops the peers
        _write(raised_file(Path(folder), int(rank)), packed)
    (outcome,) = payload.unpack(packed, "outcomes")
    sys.stderr.write(outcome.traceback)
    sys.stderr.flush()
    return 1


CELL_FILENAME = "<gpulayer-cell>"


def run_source(source: str, values: dict[str, Any], pull: list[str]) -> dict[str, Any]:
    """Run a notebook cell's source as a script on this rank (``%%gpulayer --nodes``).

    The code runs with ``__name__ == "__main__"`` in a fresh namespace holding
    ``values`` (the pushed variables); answers the variables named in ``pull``.
    Its lines show in tracebacks.
    """
    lines = source.splitlines(keepends=True)
    linecache.cache[CELL_FILENAME] = (len(source), None, lines, CELL_FILENAME)
    namespace: dict[str, Any] = {"__name__": "__main__", **values}
    exec(compile(source, CELL_FILENAME, "exec"), namespace)  # the user's own cell
    missing = [n for n in pull if n not in namespace]
    if missing:
        raise NameError(f"--pull: the cell did not define {missing[0]!r}")
    return {n: namespace[n] for n in pull}


def _write(path: Path, data: bytes) -> None:
    """Write whole or not at all: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
