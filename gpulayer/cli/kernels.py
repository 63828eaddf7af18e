"""``gpulayer kernel install | list | remove``: kernelspecs of gpulayer kernels
(docs/kernels.md).

A gpulayer kernelspec names the ``gpulayer-provisioner`` kernel provisioner
(:mod:`gpulayer.kernel_provisioner`) with its settings in
``metadata.kernel_provisioner.config``. Its ``argv`` is the usual ipykernel one and
is never run on this machine: the provisioner starts the kernel on a worker. It
holds no URL and no token: the provisioner uses the Jupyter server's gpulayer
configuration (``GPULAYER_URL``/``GPULAYER_TOKEN`` or the file ``gpulayer up``
saved).
"""

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from gpulayer import contracts, errors
from gpulayer.cli import output
from gpulayer.cli.options import bounded, examples, output_options

#: The provisioner every gpulayer kernelspec names (the entry point's name).
PROVISIONER = "gpulayer-provisioner"
_NAME = re.compile(r"^[a-z0-9._\-]+$", re.IGNORECASE)  # jupyter_client's rule


def add_parsers(sub: Any, conn: argparse.ArgumentParser) -> None:
    """Add the kernel commands to the ``gpulayer`` parser."""
    kernel = sub.add_parser(
        "kernel",
        help="Jupyter kernels that run on a gpulayer worker",
        epilog=examples(
            "gpulayer kernel install --name gpu1 --gpus 1",
            "gpulayer kernel list",
            "gpulayer kernel remove gpu1",
        ),
    )
    verbs = kernel.add_subparsers(dest="kernel_cmd", required=True, metavar="VERB")
    install = verbs.add_parser(
        "install",
        help="install a kernelspec (it shows in JupyterLab's launcher)",
        epilog=examples(
            "gpulayer kernel install --name gpu1 --gpus 1",
            "gpulayer kernel install --name a100 --gpus 2 --gpu-model 'A100*' --pip transformers",
            "gpulayer kernel install --name cpu --gpus 0 --idle-timeout 30m --sys-prefix",
        ),
    )
    install.add_argument(
        "--name", required=True, help="the kernelspec's name (letters, digits, . _ -)"
    )
    install.add_argument(
        "--gpus", type=bounded(int, 0, 64), default=1, help="GPUs it reserves (default 1)"
    )
    install.add_argument(
        "--gpu-model", default=None, metavar="PATTERN", help="a GPU model pattern, 'A100*'"
    )
    install.add_argument(
        "--pip",
        nargs="+",
        default=[],
        metavar="REQ",
        help="requirements of its Python env, built on the worker",
    )
    install.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable of the kernel (repeatable)",
    )
    install.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME",
        help="a secret of yours the kernel gets in its env (repeatable)",
    )
    install.add_argument(
        "--display-name",
        default=None,
        metavar="TEXT",
        help="what the launcher shows (default: 'Python 3 (gpulayer, N GPUs)')",
    )
    install.add_argument(
        "--sync-workdir",
        action="store_true",
        help="ship the notebook's folder to the kernel at start",
    )
    install.add_argument(
        "--idle-timeout",
        default=None,
        metavar="DURATION",
        help="end it after this long without use, '30m' (default: the server's)",
    )
    install.add_argument(
        "--start-timeout",
        default="5m",
        metavar="DURATION",
        help="give up when no worker takes it within this long (default 5m)",
    )
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for you only (default)")
    where.add_argument("--sys-prefix", action="store_true", help=f"in {sys.prefix}")
    where.add_argument("--prefix", default=None, metavar="PATH", help="under PATH/share/jupyter")
    install.set_defaults(func=_install)

    verbs.add_parser(
        "list",
        parents=[output_options()],
        help="list gpulayer kernelspecs",
        epilog=examples("gpulayer kernel list -o json"),
    ).set_defaults(func=_list)
    remove = verbs.add_parser(
        "remove",
        help="remove a gpulayer kernelspec",
        epilog=examples("gpulayer kernel remove gpu1"),
    )
    remove.add_argument("name", metavar="NAME", help="the kernelspec's name (gpulayer kernel list)")
    remove.set_defaults(func=_remove)


def kernelspec(
    *,
    gpus: int,
    gpu_model: str | None = None,
    pip: list[str] | None = None,
    env: dict[str, str] | None = None,
    secrets: list[str] | None = None,
    display_name: str | None = None,
    sync_workdir: bool = False,
    idle_timeout: str | None = None,
    start_timeout: str = "5m",
) -> dict[str, Any]:
    """The ``kernel.json`` of a gpulayer kernel.

    Raises
    ------
    ValidationError
        A setting the control plane would refuse, named.
    """
    settings: dict[str, Any] = {"gpus": gpus}
    idle = _duration("--idle-timeout", idle_timeout) if idle_timeout is not None else None
    start = _duration("--start-timeout", start_timeout)
    if idle is not None:
        settings["idle_timeout"] = str(idle)
    try:
        resources = contracts.Resources(gpus=gpus, gpu_model=gpu_model)
        if pip:
            contracts.EnvSpec(pip=pip)
        contracts.JobSpec.model_validate({"kind": "session", "session": {"name": "x"},
                                          "env": env or {}, "secrets": secrets or []})  # fmt: skip
    except PydanticValidationError as e:
        raise errors.ValidationError(_first(e)) from None
    settings["start_timeout"] = float(start)
    if resources.gpu_model is not None:
        settings["gpu_model"] = gpu_model
    for key, value in (("pip", pip), ("env", env), ("secrets", secrets)):
        if value:
            settings[key] = value
    if sync_workdir:
        settings["sync_workdir"] = True
    plural = "" if gpus == 1 else "s"
    return {
        "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name or f"Python 3 (gpulayer, {gpus} GPU{plural})",
        "language": "python",
        "interrupt_mode": "message",
        "metadata": {
            "debugger": False,
            "kernel_provisioner": {"provisioner_name": PROVISIONER, "config": settings},
        },
    }


def _duration(option: str, text: str) -> float:
    """A positive duration ('30m', '90'), or an error naming ``option``."""
    try:
        seconds = contracts.parse_duration(text)
    except ValueError as e:
        raise errors.ValidationError(f"{option} {text!r}: {e}") from None
    if seconds is None or seconds <= 0:
        raise errors.ValidationError(f"{option} {text!r}: give a positive duration, '30m'")
    return float(seconds)


def _first(e: PydanticValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else str(err["msg"])


def install(
    name: str, spec: dict[str, Any], *, user: bool = True, prefix: str | None = None
) -> str:
    """Install ``spec`` as kernelspec ``name``; answers where it went."""
    from jupyter_client.kernelspec import KernelSpecManager

    if not _NAME.match(name):
        raise errors.ValidationError(f"--name {name!r}: use letters, digits, '.', '_' and '-' only")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kernel.json").write_text(json.dumps(spec, indent=1))
        where = KernelSpecManager().install_kernel_spec(
            tmp, kernel_name=name, user=user and prefix is None, prefix=prefix
        )
    return str(where)


def installed() -> dict[str, dict[str, Any]]:
    """The gpulayer kernelspecs Jupyter finds: ``{name: {"resource_dir", "spec"}}``."""
    from jupyter_client.kernelspec import KernelSpecManager

    found = KernelSpecManager().get_all_specs()
    return {
        name: info
        for name, info in sorted(found.items())
        if info["spec"].get("metadata", {}).get("kernel_provisioner", {}).get("provisioner_name")
        == PROVISIONER
    }


def _install(args: argparse.Namespace) -> int:
    env = {}
    for pair in args.env:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise errors.ValidationError(f"--env {pair!r}: give NAME=VALUE")
        env[key] = value
    spec = kernelspec(
        gpus=args.gpus, gpu_model=args.gpu_model, pip=args.pip, env=env, secrets=args.secret,
        display_name=args.display_name, sync_workdir=args.sync_workdir,
        idle_timeout=args.idle_timeout, start_timeout=args.start_timeout,
    )  # fmt: skip
    prefix = sys.prefix if args.sys_prefix else args.prefix
    where = install(args.name, spec, user=prefix is None, prefix=prefix)
    print(f"installed kernel {args.name} ({spec['display_name']}) in {where}")
    return 0


def _list(args: argparse.Namespace) -> int:
    specs = installed()
    if args.output == "json":
        print(json.dumps({n: {"resource_dir": i["resource_dir"], "spec": i["spec"]}
                          for n, i in specs.items()}, indent=2))  # fmt: skip
        return 0
    rows = []
    for name, info in specs.items():
        cfg = info["spec"]["metadata"]["kernel_provisioner"].get("config", {})
        rows.append((name, info["spec"].get("display_name", ""), str(cfg.get("gpus", 0)),
                     cfg.get("gpu_model") or "-", info["resource_dir"]))  # fmt: skip
    output.table(("NAME", "DISPLAY NAME", "GPUS", "GPU MODEL", "PATH"), rows)
    return 0


def _remove(args: argparse.Namespace) -> int:
    from jupyter_client.kernelspec import KernelSpecManager

    if args.name not in installed():
        raise errors.NotFound(
            f"no gpulayer kernel named {args.name!r} (see `gpulayer kernel list`)"
        )
    where = KernelSpecManager().remove_kernel_spec(args.name)
    print(f"removed kernel {args.name} from {where}")
    return 0
