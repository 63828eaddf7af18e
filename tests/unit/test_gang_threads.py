"""A node of a gang sets ``OMP_NUM_THREADS=1`` for its ranks the way torchrun would,
so torchrun prints no untagged banner into the node's log (a real torchrun, on CPU)."""

import asyncio
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from gpulayer.cli.cluster import free_port
from gpulayer.contracts import Assignment, Gang, JobSpec
from gpulayer.worker.torchrun import GangRun

PRINT_THREADS = "import os; print('threads', os.environ.get('OMP_NUM_THREADS'))"


def node(launcher: str, env: dict[str, str] | None = None, *, tmp_path: Path):
    spec = JobSpec(kind="distributed", nproc_per_node=2, launcher=launcher,
                   command=["python", "-c", PRINT_THREADS])  # fmt: skip
    gang = Gang(node_rank=0, nnodes=1, nproc_per_node=2, master_addr="127.0.0.1",
                master_port=free_port())  # fmt: skip
    job = Assignment(task_id="t", job_id="j", attempt=1, spec=spec, gang=gang)
    lines: list[tuple[int | None, str]] = []
    run = GangRun(job, cwd=tmp_path, env={**(env or {}), "PATH": _path()},
                  on_line=lambda stream, text, ts, rank: lines.append((rank, text)))  # fmt: skip
    out = asyncio.run(run.run())
    return out, lines


def _path() -> str:
    return os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_torchrun_ranks_get_one_thread_and_no_banner(tmp_path: Path) -> None:
    out, lines = node("torchrun", tmp_path=tmp_path)
    assert out.state == "succeeded", (out, lines)
    assert sorted(lines) == [(0, "threads 1"), (1, "threads 1")], lines


def test_direct_ranks_get_one_thread_unless_the_job_sets_it(tmp_path: Path) -> None:
    _, lines = node("direct", tmp_path=tmp_path)
    assert sorted(lines) == [(0, "threads 1"), (1, "threads 1")]
    _, lines = node("direct", {"OMP_NUM_THREADS": "3"}, tmp_path=tmp_path)
    assert sorted(lines) == [(0, "threads 3"), (1, "threads 3")]
