"""``kind = "slurm"``: an sbatch allocation that runs ``gpulayer join``.

One instance is one Slurm job: ``sbatch`` of a script that runs one ``gpulayer
join`` per node (``srun`` for several nodes: a gang is one ``-N`` allocation, so
it gets all its nodes or none). GPUs are asked with ``--gres`` (exactly the
job's, for offers sized to the job); partition, account, QoS, time limit, a user
preamble (``module load ...``, extra ``#SBATCH`` lines) and extra sbatch options
come from the configuration. ``scancel`` terminates; ``squeue`` says the state,
the pending reason and the end time. The job is named
``gpulayer-<tag>-<instance id>``, so ``squeue`` tells this control plane's
instances from everyone else's.

The script holds the instance's single-use join tokens (one per node); it is
written 0600 under ``workdir`` and slurmctld keeps a copy readable by its owner
and the Slurm administrators only (``scontrol write batch_script``).
"""

import asyncio
import math
import os
import shlex
import sys
from datetime import datetime
from pathlib import Path

from gpulayer.contracts import Offer
from gpulayer.contracts.providers import GIB, SlurmConfig

from ..data_dir import private_dir
from .base import CapacityError, Launch, Provider, Refused, Seen

#: Words in sbatch's refusal that mean the request can never be met as asked.
_NEVER = ("not available", "invalid", "exceed", "limit", "denied", "not permitted", "unknown")
#: Slurm states of a job that still holds (or waits for) its allocation.
_PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED"}
_RUNNING = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"}
#: The worker gets SIGTERM this long before Slurm's end (it releases its tasks as
#: lost, so they are retried elsewhere, rather than being killed mid-write).
STOP_BEFORE_END_SECONDS = 60
#: Time an allocation sized to a job's timeout gets on top of it: its worker's start
#: and join, before the job can be placed.
JOIN_MARGIN_SECONDS = 300
#: The control plane's own credentials: sbatch copies its environment into the job
#: (``--export=ALL``, which keeps the login node's venv and PYTHONPATH for the
#: workers), and slurmctld stores it; these never go there.
_PRIVATE_ENV = ("GPULAYER_TOKEN", "GPULAYER_JOIN_TOKEN", "GPULAYER_WORKER_TOKEN", "JUPYTER_TOKEN",
                "JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN")  # fmt: skip


async def run(*argv: str, timeout: float = 30.0) -> tuple[int, str, str]:
    """Run a Slurm command (without the control plane's credentials in its
    environment); ``(exit code, stdout, stderr)``."""
    env = {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return 124, "", f"{argv[0]} did not answer within {timeout:g}s"
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


class SlurmProvider(Provider):
    """See the module docstring."""

    kind = "slurm"
    config: SlurmConfig

    def folder(self) -> Path:
        """Where scripts and the allocations' output go."""
        return private_dir(Path(self.config.workdir or self.data_dir / "providers" / self.name))

    def job_name(self, instance_id: str) -> str:
        """The Slurm job name of an instance."""
        return f"gpulayer-{self.tag}-{instance_id}"

    def offers(self) -> list[Offer]:
        c = self.config
        return [
            Offer(
                provider=self.name,
                name=c.partition or "default",
                gpus=c.gpus_per_node,
                gpu_model=c.gpu_model,
                gpu_memory_bytes=int(c.gpu_memory * GIB),
                cpus=c.cpus_per_node,
                memory_bytes=int(c.memory_per_node * GIB),
                price_per_hour=c.price_per_hour,
                region=c.partition,
                max_nodes=c.max_nodes,
                sized_to_job=True,
            )
        ]

    def minutes(self, launch: Launch) -> int:
        """The allocation's ``--time``: ``time_limit``, or the job's timeout and
        :data:`JOIN_MARGIN_SECONDS` when that is longer (a job is never placed on an
        allocation that ends before its timeout would); Slurm refuses more than the
        partition allows, in its own words."""
        seconds = max(c if (c := self.config.time_limit) else 3600.0,
                      (launch.seconds or 0) + JOIN_MARGIN_SECONDS)  # fmt: skip
        return max(1, math.ceil(seconds / 60))

    def script(self, launch: Launch) -> str:
        """The sbatch script of an instance."""
        c = self.config
        out = self.folder() / f"{launch.instance_id}.out"
        lines = ["#!/bin/bash", f"#SBATCH --job-name={self.job_name(launch.instance_id)}",
                 f"#SBATCH --nodes={launch.nodes}", "#SBATCH --ntasks-per-node=1",
                 f"#SBATCH --output={out}", f"#SBATCH --chdir={self.folder()}",
                 f"#SBATCH --cpus-per-task={max(1, launch.cpus)}",
                 f"#SBATCH --time={self.minutes(launch)}"]  # fmt: skip
        if launch.gpus:
            gres = c.gres if ":" in c.gres else f"{c.gres}:{launch.gpus}"
            lines.append(f"#SBATCH --gres={gres}")
        if launch.memory_bytes:
            lines.append(f"#SBATCH --mem={max(1, launch.memory_bytes // (1024 * 1024))}M")
        for flag, value in (("partition", c.partition), ("account", c.account), ("qos", c.qos)):
            if value:
                lines.append(f"#SBATCH --{flag}={value}")
        lines.append(f"#SBATCH --signal=B:TERM@{STOP_BEFORE_END_SECONDS}")
        lines += [line for line in c.preamble.splitlines() if line.startswith("#SBATCH")]
        lines += [line for line in c.preamble.splitlines() if not line.startswith("#SBATCH")]
        python = c.python or sys.executable
        join = [python, "-m", "gpulayer", "join", launch.url, "--slots", str(launch.slots),
                "--register-timeout", "0"]  # fmt: skip
        for key, value in {**c.labels, "slurm_job": "$SLURM_JOB_ID"}.items():
            join += ["--label", f"{key}={value}"]
        if launch.fingerprint:
            join += ["--fingerprint", launch.fingerprint]
        cmd = " ".join(shlex.quote(a) if "$SLURM" not in a else f'"{a}"' for a in join)
        for i, token in enumerate(launch.tokens):
            lines.append(f"export GL_JOIN_TOKEN_{i}={shlex.quote(token)}")
        data = shlex.quote(str(self.folder()))
        if launch.nodes == 1:
            name = shlex.quote(launch.workers[0])
            lines += [
                'export GPULAYER_JOIN_TOKEN="$GL_JOIN_TOKEN_0"; unset GL_JOIN_TOKEN_0',
                f'{cmd} --name {name} --data-dir {data}/{name}-"$SLURM_JOB_ID" &',
            ]
        else:
            prefix = shlex.quote(launch.workers[0].rsplit("-", 1)[0])
            inner = (
                'tok=GL_JOIN_TOKEN_$SLURM_NODEID; export GPULAYER_JOIN_TOKEN="${!tok}";'
                f' exec {cmd} --name {prefix}-"$SLURM_NODEID"'
                f' --data-dir {data}/{prefix}-"$SLURM_NODEID"-"$SLURM_JOB_ID"'
            )
            lines.append(f"srun --kill-on-bad-exit=0 bash -c {shlex.quote(inner)} &")
        lines += [
            "pid=$!",
            # the signal before the end (and scancel's) reaches the worker (srun forwards
            # it to every node's), which releases its tasks; the script then waits for it.
            "trap 'kill -TERM \"$pid\" 2>/dev/null' TERM",
            'wait "$pid"; wait "$pid"',
        ]
        return "\n".join(lines) + "\n"

    async def create(self, launch: Launch) -> str:
        path = self.folder() / f"{launch.instance_id}.sbatch"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.script(launch))
        try:
            code, out, err = await run("sbatch", "--parsable", str(path))
        finally:
            path.unlink(missing_ok=True)  # slurmctld keeps its own copy
        if code == 0 and out.strip():
            return out.strip().split(";")[0]
        message = (err.strip() or out.strip() or f"sbatch exited with {code}").splitlines()[-1]
        if any(word in message.lower() for word in _NEVER):
            raise Refused(f"slurm: {message}")
        raise CapacityError(f"slurm: {message}")

    async def terminate(self, external_id: str) -> None:
        code, _, err = await run("scancel", external_id)
        if code != 0 and "invalid job id" not in err.lower():
            raise RuntimeError(f"scancel {external_id}: {err.strip()}")

    async def list(self) -> list[Seen]:
        prefix = f"gpulayer-{self.tag}-"
        code, out, err = await run("squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%r|%P|%e")
        if code != 0:
            raise RuntimeError(f"squeue: {err.strip()}")
        seen = []
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) != 6 or not parts[1].startswith(prefix):
                continue
            job_id, name, state, reason, partition, end = parts
            instance_id = name[len(prefix) :]
            if state in _PENDING:
                detail = f"slurm job {job_id} pending ({reason}) in partition {partition}"
                seen.append(Seen(instance_id, job_id, "pending", detail))
            elif state in _RUNNING:
                detail = f"slurm job {job_id} running in partition {partition}"
                seen.append(Seen(instance_id, job_id, "running", detail, _end_time(end)))
            else:
                reason_text = f" ({reason})" if reason and reason != "None" else ""
                detail = f"slurm job {job_id} {state}{reason_text}"
                seen.append(Seen(instance_id, job_id, "ended", detail))
        return seen


def _end_time(text: str) -> float | None:
    """squeue's ``%e`` (local time, or N/A / Unknown)."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None
