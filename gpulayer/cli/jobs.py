"""``gpulayer submit | jobs | job ID | cancel ID | explain ID | artifacts ID | delete ID | gc``."""

import argparse
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pydantic

from gpulayer import contracts, errors
from gpulayer.cli import output
from gpulayer.cli.logs import RAW_HELP, follow
from gpulayer.cli.options import bounded, connect, examples, output_options, progress_options
from gpulayer.client import pending, specs, submit
from gpulayer.notebook.progress import transfer_progress

#: ``gpulayer submit``'s options: every resource, job and gang option.
SUBMIT_OPTIONS = (*specs.RESOURCE_OPTIONS, *specs.JOB_OPTIONS, *specs.GANG_OPTIONS)
_FLAGS = {"labels": "--label", "secrets": "--secret"}


def add_parsers(sub: Any, conn: argparse.ArgumentParser) -> None:
    """Add the job commands to the ``gpulayer`` parser."""
    out, bar = output_options(), progress_options()
    s = sub.add_parser("submit", parents=[conn, out, bar], help="submit a command",
                       usage="gpulayer submit [options] -- CMD [ARG ...]",
                       epilog=_SUBMIT_EXAMPLES)  # fmt: skip
    for name in SUBMIT_OPTIONS:
        flag, kwargs = specs.argument(name, _FLAGS.get(name))
        s.add_argument(flag, **kwargs)
    s.add_argument(
        "--workdir", type=Path, metavar="DIR", help="directory shipped as the task's cwd"
    )
    for flag, kwargs in specs.ENV_FLAGS.items():
        s.add_argument(flag, **kwargs)
    s.add_argument("--shell", metavar="'CMD | CMD'", help="run a string with /bin/sh -c")
    s.add_argument("-f", "--follow", action="store_true", help="stream output, exit like it")
    s.add_argument("--raw", action="store_true", help=f"with --follow: {RAW_HELP}")
    s.add_argument("command", nargs="*", metavar="CMD", help="argv, after `--`")
    s.set_defaults(func=_submit)

    jobs = sub.add_parser("jobs", parents=[conn, out], help="list jobs", epilog=examples(
        "gpulayer jobs", "gpulayer jobs --state queued --limit 10",
        "gpulayer jobs -o json | jq -r '.jobs[].id'"))  # fmt: skip
    jobs.add_argument("--state", choices=[str(s) for s in contracts.JobState],
                      help="only jobs in this state")  # fmt: skip
    jobs.add_argument("--limit", type=bounded(int, 1, 10000), default=50, metavar="N",
                      help="the newest N jobs (default 50)")  # fmt: skip
    jobs.set_defaults(func=_jobs)

    for name, func, text in (
        ("job", _job, "show one job, its tasks and events"),
        ("cancel", _cancel, "cancel a job"),
        ("explain", _explain, "why a job runs where it does, or waits (exit 1: it never can)"),
    ):
        p = sub.add_parser(name, parents=[conn, out], help=text,
                           epilog=examples(f"gpulayer {name} 3f2a9c81d0e4",
                                           f"gpulayer {name} 3f2a9c81d0e4 -o json"))  # fmt: skip
        p.add_argument("job_id", metavar="ID", help="the job's id (gpulayer jobs lists them)")
        p.set_defaults(func=func)

    delete = sub.add_parser(
        "delete", parents=[conn], help="delete finished jobs with their logs and artifacts",
        epilog=examples("gpulayer delete 3f2a9c81d0e4",
                        "gpulayer delete 3f2a9c81d0e4 9b1e07c2aa41"),
    )  # fmt: skip
    delete.add_argument("job_ids", nargs="+", metavar="ID",
                        help="finished jobs' ids (a queued or running job is refused)")  # fmt: skip
    delete.set_defaults(func=_delete)

    gc = sub.add_parser(
        "gc", parents=[conn], help="delete old finished jobs and unused blobs now (admin)",
        epilog=examples("gpulayer gc                      # unused blobs only, unless configured",
                        "gpulayer gc --older-than 30d", "gpulayer gc --keep-jobs 1000",
                        "gpulayer gc --max-bytes 50GiB"),
    )  # fmt: skip
    gc.add_argument(
        "--older-than", metavar="DURATION", help="finished jobs that ended longer ago, e.g. 30d"
    )
    gc.add_argument(
        "--keep-jobs", type=int, metavar="N", help="keep only the newest N finished jobs"
    )
    gc.add_argument(
        "--max-bytes",
        metavar="SIZE",
        help="delete the oldest finished jobs while blobs take more, e.g. 50GiB",
    )
    gc.set_defaults(func=_gc)

    arts = sub.add_parser(
        "artifacts", parents=[conn, out, bar], help="list or download artifacts",
        epilog=examples("gpulayer artifacts 3f2a9c81d0e4",
                        "gpulayer artifacts 3f2a9c81d0e4 --download results/"),
    )  # fmt: skip
    arts.add_argument("job_id", metavar="ID", help="the job's id")
    arts.add_argument("--download", type=Path, metavar="DIR",
                      help="write them below DIR (never outside it)")  # fmt: skip
    arts.set_defaults(func=_artifacts)


_SUBMIT_EXAMPLES = examples(
    "gpulayer submit -- python -c 'print(1)'          # prints the job id",
    "gpulayer submit --gpus 1 --timeout 1h30m -f -- python train.py",
    "gpulayer submit --workdir . --shell 'pip list | grep torch' -f",
    "gpulayer submit --gpus 8 --queue-timeout 10m -- python big.py",
    "gpulayer submit --nodes 2 --nproc-per-node 2 --workdir . -- python ddp_train.py",
    "JOB=$(gpulayer submit -- sleep 60) && gpulayer cancel $JOB",
)


def _submit(args: argparse.Namespace) -> int:
    if bool(args.command) == bool(args.shell):
        raise errors.ValidationError(
            "give a command after `--` (gpulayer submit -- python train.py)"
            " or a shell string with --shell 'cmd | cmd', not both"
            if args.command
            else "no command given; put it after `--` (gpulayer submit -- python train.py)"
            " or use --shell 'cmd | cmd'"
        )
    if len(args.command) == 1 and " " in args.command[0]:
        output.note(
            f"note: running {args.command[0]!r} as one program; use --shell for shell syntax"
        )
    with connect(args) as conn:
        job = submit(
            args.shell if args.shell else args.command,
            workdir=args.workdir,
            connection=conn,
            progress=args.progress,
            **specs.given(args, SUBMIT_OPTIONS),
            **specs.env_options(args, conn),
        )
        if args.output == "json" and not args.follow:
            output.document(job.info)
        elif not args.follow:
            print(job.id, flush=True)
        if not args.follow:
            if job.info.unsatisfiable:  # it would wait for ever: say so at once
                output.note(f"gpulayer: warning: job {job.id} {pending.why_queued(job.info)}")
            return 0
        output.note(f"job {job.id} submitted")
        return follow(conn, job.id, raw=args.raw)


def environment_lines(asked: contracts.EnvSpec, env: contracts.TaskEnvironment | None) -> list[str]:
    """What ``gpulayer job`` says about a job's Python env: what it asked for, then
    preparing (with the time so far), the exact versions, or why it failed."""
    kind = "isolated" if asked.isolated else "layered on the worker's packages"
    wanted = [*asked.pip, *(w.filename for w in asked.wheels)]
    lines = [f"asked:     {' '.join(wanted) or '(no packages)'} ({kind})"]
    if env is None:
        return [*lines, "state:     not prepared yet"]
    if env.phase == "preparing":
        since = (datetime.now(UTC) - env.started_at).total_seconds()
        return [*lines, f"state:     preparing environment ({contracts.format_duration(since)})"]
    if env.phase == "failed":
        return [*lines, f"state:     failed: {env.error}"]
    took = "cache hit" if env.cached else f"built in {contracts.format_duration(env.build_seconds)}"
    lines.append(f"state:     ready ({took}), Python {env.python}, key {env.key[:12]}")
    lines += [f"  {p}" for p in env.packages]
    lines += [f"  {p} (the worker's)" for p in env.from_worker]
    return lines


def _jobs(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        jobs = conn.jobs(state=args.state, limit=args.limit)
    if args.output == "json":
        output.document(contracts.JobList(jobs=jobs))
        return 0
    output.table(("ID", "NAME", "STATE", "WORKER", "EXIT", "AGE", "DURATION"), [
        (j.id, j.spec.name or "-", str(j.state), j.worker_name or "-",
         output.exit_code(j.exit_code), output.age(j.created_at),
         contracts.format_duration(j.duration))
        for j in jobs
    ])  # fmt: skip
    return 0


def _job(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        job = conn.job(args.job_id)
        if args.output == "json":
            output.document(job)
            return 0
        events = conn.events(args.job_id)
    spec = job.spec
    program = spec.shell if spec.shell is not None else shlex.join(spec.command or [])
    res = spec.resources
    when = output.when
    fields = [
        ("id", job.id), ("name", spec.name or "-"), ("state", str(job.state)),
        ("reason", job.reason or "-"), ("owner", job.owner), ("worker", where(job)),
        ("exit", output.exit_code(job.exit_code)),
        ("attempts", str(job.attempts)), ("command", program),
        ("resources", f"gpus={res.gpus} cpus={res.cpus:g}"
                      + (f" memory={res.memory.human_readable()}" if res.memory else "")),
        ("timeout", contracts.format_duration(spec.timeout)), ("retries", str(spec.retries)),
        ("created", when(job.created_at)), ("started", when(job.started_at)),
        ("ended", when(job.ended_at)), ("duration", contracts.format_duration(job.duration)),
    ]  # fmt: skip
    if job.provisioning is not None:
        p = job.provisioning
        fields.append(("provisioning", f"instance {p.instance_id} on {p.provider} ({p.state}):"
                                       f" {p.detail}"))  # fmt: skip
    if job.cost is not None:
        fields.append(("cost", f"${job.cost:.4f} (its share of provider instances)"))
    for key, value in fields:
        output.say(f"{key + ':':<11}{value}")
    if spec.environment is not None:
        print("\nenvironment:")
        for line in environment_lines(spec.environment, job.environment):
            output.say(f"  {line}")
    if job.pending_reasons:
        print("\nwhy it is waiting:")
        for reason in job.pending_reasons:
            output.say(f"  {reason}")
        if job.unsatisfiable:
            output.say(f"  (no worker could ever run it: {pending.hint(job)})")
    if job.tasks:
        print("\ntasks:")
        output.table(("TASK", "ATTEMPT", "STATE", "WORKER", "GPUS", "EXIT", "REASON"), [
            (t.id, str(t.attempt), str(t.state), t.worker_name or "-",
             ",".join(map(str, t.gpu_indices)) or "-", output.exit_code(t.exit_code),
             t.reason or "")
            for t in job.tasks
        ], indent="  ")  # fmt: skip
    if events:
        print("\nevents:")
        output.table(("TIME", "STATE", "TASK", "REASON"), [
            (when(e.ts), e.state, e.task_id or "", e.reason or "") for e in events
        ], indent="  ")  # fmt: skip
    return 0


def where(job: contracts.Job) -> str:
    """The worker of a job, or of every node of a distributed job's latest attempt:
    ``local-1 (node 0), local-2 (node 1)``."""
    nodes = sorted(
        (t.node_rank, t.worker_name or "?")
        for t in job.tasks
        if t.attempt == job.attempts and t.node_rank is not None
    )
    if len(nodes) > 1:
        return ", ".join(f"{name} (node {rank})" for rank, name in nodes)
    return job.worker_name or "-"


def _cancel(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        job = conn.cancel(args.job_id)
    if args.output == "json":
        output.document(job)
        return 0
    output.say(f"{job.id} {job.state}")
    return 0


def _explain(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        p = conn.placement(args.job_id)
        job = conn.job(args.job_id) if args.output != "json" else None
    if args.output == "json":
        output.document(p)
        return 0 if p.satisfiable else 1
    output.say(f"job {p.job_id} is {p.state}: {p.summary}")
    if job is not None and job.spec.environment is not None and not job.state.terminal:
        state = environment_lines(job.spec.environment, job.environment)[1]
        output.say(f"its environment: {state.split(':', 1)[1].strip()}")
    rows = [(w.worker, "yes" if w.fits else "no", "yes" if w.could_ever_fit else "never",
             w.reason) for w in p.workers]  # fmt: skip
    if rows:
        output.table(("WORKER", "FITS NOW", "COULD FIT", "WHY"), rows)
    return 0 if p.satisfiable else 1


def _artifacts(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        if args.download is not None:
            desc = f"downloading job {args.job_id}'s artifacts"
            with transfer_progress(args.progress, desc) as shown:
                paths = conn.download(args.job_id, args.download, progress=shown)
            for path in paths:
                output.say(str(path))
            return 0
        arts = conn.artifacts(args.job_id)
    if args.output == "json":
        output.document(contracts.ArtifactList(artifacts=arts))
        return 0
    output.table(
        ("NAME", "SIZE", "SHA256"), [(a.name, output.size(a.size), a.sha256[:12]) for a in arts]
    )
    return 0


def _delete(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        for job_id in args.job_ids:
            conn.delete_job(job_id)
            print(f"{job_id} deleted")
    return 0


def _gc(args: argparse.Namespace) -> int:
    limits: dict[str, object] = {"max_jobs": args.keep_jobs, "max_bytes": args.max_bytes}
    if args.older_than is not None:
        try:
            limits["max_age_seconds"] = contracts.parse_duration(args.older_than)
        except ValueError as e:
            raise errors.ValidationError(f"--older-than: {e}", field="older_than") from e
    try:
        req = contracts.GcRequest.model_validate({k: v for k, v in limits.items() if v is not None})
    except pydantic.ValidationError as e:
        raise specs.pydantic_to_gpulayer(e) from e
    with connect(args) as conn:
        report = conn.gc(req)
    print(
        f"deleted {report.jobs_deleted} job(s) and {report.blobs_deleted} blob(s),"
        f" freed {output.size(report.bytes_freed)}; blobs take {output.size(report.blob_bytes)}"
    )
    return 0
