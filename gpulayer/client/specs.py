"""The one list of job and resource options, derived from the wire models.

``gl.submit``, ``@gl.remote``, ``gpulayer submit``, ``%%gpulayer`` and sessions
take their options from here: the resource options are the fields of
:class:`~gpulayer.contracts.Resources` and the job options fields of
:class:`~gpulayer.contracts.JobSpec`, so what they mean, accept and default to is
the model's. :func:`argument` derives a command-line flag (type, choices,
default, help) from the same fields, for the CLI and the magics.
"""

import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from gpulayer import contracts, errors

if TYPE_CHECKING:
    import argparse  # only the command line parses flags; `import gpulayer.client` stays light
    import os

    from gpulayer.client.environments import Env, Uploads

#: What one task needs (every field of ``Resources``).
RESOURCE_OPTIONS: tuple[str, ...] = tuple(contracts.Resources.model_fields)
#: The job fields a caller sets beside the program.
JOB_OPTIONS: tuple[str, ...] = (
    "name", "env", "labels", "priority", "timeout", "retries", "api_access", "queue_timeout",
    "secrets",
)  # fmt: skip
#: A distributed job (a gang of ``nodes`` x ``nproc_per_node``).
GANG_OPTIONS: tuple[str, ...] = ("nodes", "nproc_per_node", "launcher")
#: The Python environment a job runs in (docs/environments.md): requirements, a
#: requirements file, or a reusable ``gl.Env`` (the two first add to the third).
ENV_OPTIONS: tuple[str, ...] = ("pip", "requirements", "environment")

_M = TypeVar("_M", bound=BaseModel)
_RESOURCE_DEFAULTS = {k: contracts.Resources.model_fields[k].default for k in ("gpus", "cpus")}
_MAPPINGS = frozenset({"selector", "env", "labels"})
_LISTS = frozenset({"secrets"})
#: Options whose repeatable flag is singular (``--secret A --secret B``).
_SINGULAR = {"secrets": "--secret"}


class ResourceOptions(TypedDict, total=False):
    """The resource options as keyword arguments (the fields of ``Resources``)."""

    profile: str | None
    gpus: int
    cpus: float
    memory: str | int | None
    gpu_memory: str | int | None
    gpu_model: str | None
    accelerator: str | None
    min_compute_capability: str | None
    gpu_memory_kind: str | None
    selector: Mapping[str, str] | None
    worker: str | None


class JobOptions(ResourceOptions, total=False):
    """The resource, job, gang and environment options of ``gl.submit``."""

    timeout: str | float | None
    retries: int
    name: str | None
    env: Mapping[str, str] | None
    labels: Mapping[str, str] | None
    priority: int
    api_access: bool
    queue_timeout: str | float | None
    secrets: typing.Sequence[str] | None
    nodes: int
    nproc_per_node: int
    launcher: str
    pip: Sequence[str] | str | None
    requirements: "str | os.PathLike[str] | None"
    environment: "Env | contracts.EnvSpec | Mapping[str, Any] | None"


def pydantic_to_gpulayer(e: PydanticValidationError) -> errors.ValidationError:
    """A gpulayer ``ValidationError`` naming the first offending field of ``e``."""
    first = e.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or None
    msg = first["msg"].removeprefix("Value error, ")
    more = e.error_count() - 1
    text = f"{field}: {msg}" if field else msg
    if more:
        text += f" (and {more} more problem{'s' if more > 1 else ''})"
    return errors.ValidationError(text, field=field)


def check(options: Mapping[str, Any], known: typing.Collection[str], where: str) -> None:
    """Raise ``TypeError`` for an option ``where`` does not take."""
    unknown = set(options) - set(known)
    if unknown:
        raise TypeError(
            f"unknown option {sorted(unknown)[0]!r} for {where}; known: {', '.join(sorted(known))}"
        )


def resources(options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``resources`` body of the resource options among ``options``.

    Unset ones (None, ``{}``) are left out; next to a ``profile``, ``gpus`` and
    ``cpus`` at their defaults do not override the profile's values.
    """
    given = {
        k: dict(v) if k in _MAPPINGS else v
        for k in RESOURCE_OPTIONS
        if (v := options.get(k)) is not None and v != {}
    }
    if given.get("profile") is None:
        return {**_RESOURCE_DEFAULTS, **given}
    return {k: v for k, v in given.items() if _RESOURCE_DEFAULTS.get(k, object()) != v}


def gang(options: Mapping[str, Any], *, by_presence: bool = False) -> dict[str, Any]:
    """The ``kind``/gang fields of a distributed job, or ``{}`` for a single task.

    A job is distributed when a gang option differs from its default (with
    ``by_presence``: when one is given at all, as ``@gl.remote(nodes=1)`` is).
    """
    fields = contracts.JobSpec.model_fields
    given = {k: options[k] for k in GANG_OPTIONS if options.get(k) is not None}
    wanted = given if by_presence else {k: v for k, v in given.items() if v != fields[k].default}
    return {"kind": contracts.JobKind.distributed, **given} if wanted else {}


def job_fields(options: Mapping[str, Any]) -> dict[str, Any]:
    """The job options among ``options`` as ``JobSpec`` fields (mappings copied)."""
    out: dict[str, Any] = {}
    for k in JOB_OPTIONS:
        v = options.get(k)
        if k in _MAPPINGS:
            out[k] = dict(v or {})
        elif k in _LISTS:
            out[k] = list(v or [])
        elif v is not None:
            out[k] = v
    return out


def environment(options: Mapping[str, Any]) -> "Env | None":
    """The :class:`~gpulayer.client.environments.Env` of the env options among
    ``options`` (``pip`` and ``requirements`` add to ``environment``), or None.

    Raises
    ------
    ValidationError
        Naming the field of a malformed requirement or an unreadable file.
    """
    from gpulayer.client.environments import Env

    pip, req, env = (options.get(k) for k in ENV_OPTIONS)
    if env is None and not pip and req is None:
        return None
    if isinstance(env, contracts.EnvSpec):
        env = Env(env.pip, index_url=env.index_url, extra_index_urls=env.extra_index_urls,
                  find_links=env.find_links, isolated=env.isolated, python=env.python,
                  wheels=env.wheels)  # fmt: skip
    elif isinstance(env, Mapping):
        env = Env(**env)
    elif env is not None and not isinstance(env, Env):
        raise TypeError(f"environment takes a gl.Env, not a {type(env).__name__}")
    extra = [pip] if isinstance(pip, str) else list(pip or [])
    if env is None:
        return Env(extra, requirements=req)
    return env.merged(extra, req) if extra or req is not None else env


def with_environment(
    spec: contracts.JobSpec, options: Mapping[str, Any], conn: "Uploads"
) -> contracts.JobSpec:
    """``spec`` with its env's local packages uploaded through ``conn`` (when it has any)."""
    env = environment(options)
    if env is None or not env.needs_upload:
        return spec
    return spec.model_copy(update={"environment": env.spec(conn)})


def validated(model: type[_M], **fields: Any) -> _M:
    """``model(**fields)``, a malformed field raised as a gpulayer ``ValidationError``."""
    try:
        return model(**fields)
    except PydanticValidationError as e:
        raise pydantic_to_gpulayer(e) from e


def job_spec(
    options: Mapping[str, Any], *, by_presence: bool = False, **fields: Any
) -> contracts.JobSpec:
    """The ``JobSpec`` of ``fields`` (the program, the kind) and ``options``; gang
    options make it ``distributed`` whatever kind ``fields`` gives."""
    env = environment(options)
    if env is not None:
        fields["environment"] = env.spec()
    return validated(
        contracts.JobSpec,
        **{**fields, **gang(options, by_presence=by_presence)},
        **job_fields(options),
        resources=resources(options),
    )


# ------------------------------------------------------------ command line


def key_value(text: str) -> tuple[str, str]:
    """An argparse type: ``KEY=VALUE``."""
    import argparse

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def duration(text: str) -> float:
    """An argparse type: seconds or ``90s``, ``10m``, ``2h``, ``1h30m``."""
    import argparse

    try:
        return contracts.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


#: What a flag adds to its field: a metavar, a type, help where the field has no
#: description (and help that reads better on a command line than the field's).
_FLAGS: dict[str, dict[str, Any]] = {
    "profile": {"choices": list(contracts.PROFILES), "help": "a shorthand requirement set"},
    "gpus": {"metavar": "N", "help": "whole GPUs per task (default 0)"},
    "cpus": {"metavar": "N", "help": "CPU cores per task, for placement (default 1)"},
    "memory": {"metavar": "SIZE", "help": "host memory, e.g. 8GiB"},
    "gpu_memory": {"metavar": "SIZE"},
    "gpu_model": {"metavar": "REGEX", "help": "GPU name pattern, e.g. 'A100|H100'"},
    "accelerator": {"help": "the kind of GPU each task needs"},
    "min_compute_capability": {"metavar": "X.Y", "help": "e.g. 8.0"},
    "gpu_memory_kind": {"help": "GPU memory of its own, or shared with the CPU (Apple)"},
    "selector": {"metavar": "K=V", "help": "worker label that must match (repeatable)"},
    "worker": {"metavar": "NAME", "help": "run only on this worker"},
    "name": {"metavar": "NAME", "help": "a name to list and find the job by"},
    "env": {"metavar": "K=V", "help": "environment variable of the task (repeatable)"},
    "labels": {"metavar": "K=V", "help": "label of the job, for people and filters (repeatable)"},
    "priority": {"metavar": "N", "help": "higher runs first, -1000 to 1000 (default 0)"},
    "timeout": {"type": duration, "metavar": "DURATION",
                "help": "longest run, e.g. 90s, 10m, 1h30m; then it ends timed_out"},
    "queue_timeout": {"type": duration, "metavar": "DURATION",
                      "help": "longest wait for a worker, e.g. 10m; then it ends timed_out"
                      " with the reason it waited (default: no limit)"},
    "retries": {"metavar": "N", "help": "extra attempts after a failure or a lost worker"},
    "nodes": {"metavar": "N", "help": "distributed: nodes, one task per worker, started together"},
    "nproc_per_node": {"metavar": "N"},
    "launcher": {"help": "distributed: torchrun, or gpulayer starting the ranks itself"},
    "secrets": {
        "action": "append", "default": [], "metavar": "NAME",
        "help": "a secret of yours the task gets as environment variable NAME (repeatable;"
        " `gpulayer secret set NAME` stores it)",
    },
    "api_access": {
        "action": "store_true",
        "help": "the task may call gpulayer itself (nested submits): it gets a token of"
        " yours, role submitter at most, valid while it runs",
    },
}  # fmt: skip


def argument(name: str, flag: str | None = None, **override: Any) -> tuple[str, dict[str, Any]]:
    """The flag (``--gpu-memory``) and ``add_argument`` keywords of option ``name``:
    type, choices and default from the model's field, ``override`` on top; the
    parsed value lands under ``name`` (see :func:`given`)."""
    model = contracts.Resources if name in RESOURCE_OPTIONS else contracts.JobSpec
    field = model.model_fields[name]
    kwargs: dict[str, Any] = {"dest": name, "default": field.default, "help": field.description}
    if name in _MAPPINGS:
        kwargs.update(type=key_value, action="append", default=[])
    else:
        args = [
            a
            for a in typing.get_args(field.annotation) or [field.annotation]
            if a is not type(None)
        ]
        literal = [a for a in args if typing.get_origin(a) is typing.Literal]
        plain = [a for a in args if a in (int, float)]
        if literal:
            kwargs["choices"] = list(typing.get_args(literal[0]))
        elif typing.get_origin(field.annotation) is typing.Literal:
            kwargs["choices"] = list(args)
        elif plain:
            kwargs["type"] = plain[0]
    kwargs.update(_FLAGS.get(name, {}))
    kwargs.update(override)
    flag = flag or _SINGULAR.get(name) or "--" + name.replace("_", "-")
    return flag, {k: v for k, v in kwargs.items() if v is not None}


def given(args: "argparse.Namespace", names: typing.Iterable[str]) -> dict[str, Any]:
    """The options ``names`` parsed into ``args`` (``K=V`` lists as dicts)."""
    return {
        n: dict(getattr(args, n)) if n in _MAPPINGS else getattr(args, n)
        for n in names
        if hasattr(args, n)
    }


#: The env flags of ``gpulayer submit`` and ``%%gpulayer`` (``add_argument`` keywords).
ENV_FLAGS: dict[str, dict[str, Any]] = {
    "--pip": {"dest": "pip", "action": "append", "default": [], "metavar": "REQ",
              "help": "a requirement for the job's Python env, e.g. six==1.17.0 (repeatable)"},
    "--requirements": {"dest": "requirements", "metavar": "FILE",
                       "help": "a requirements file for the job's Python env"},
    "--index-url": {"dest": "index_url", "metavar": "URL",
                    "help": "the package index of the env (default: the worker's pip config)"},
    "--find-links": {"dest": "find_links", "action": "append", "default": [], "metavar": "LOC",
                     "help": "a folder (on the worker) or page of wheels (repeatable)"},
    "--local-package": {"dest": "local_packages", "action": "append", "default": [],
                        "metavar": "PATH", "help": "a wheel or project folder here, built"
                        " and shipped with the job into its env (repeatable)"},
    "--isolated-env": {"dest": "isolated_env", "action": "store_true",
                       "help": "a clean env: the worker's own packages are not visible"},
    "--env-from": {"dest": "env_from", "metavar": "JOB_ID",
                   "help": "re-run with the exact versions that job's env had"},
}  # fmt: skip


def env_options(args: "argparse.Namespace", conn: Any = None) -> dict[str, Any]:
    """The env options (``{"environment": Env}``, or ``{}``) of parsed :data:`ENV_FLAGS`;
    ``--env-from`` reads that job through ``conn``."""
    from gpulayer.client.environments import Env

    local = [p for p in getattr(args, "local_packages", []) or []]
    more = bool(args.index_url or args.find_links or local or args.isolated_env)
    if getattr(args, "env_from", None):
        if conn is None:
            raise errors.ValidationError("--env-from needs a connection", field="env_from")
        env = Env.from_job(conn.job(args.env_from))
    elif args.pip or args.requirements or more:
        env = Env(
            requirements=args.requirements,
            index_url=args.index_url,
            find_links=args.find_links,
            local_packages=local,
            isolated=args.isolated_env,
        )
    else:
        return {}
    return {"environment": env.merged(args.pip) if args.pip else env}
