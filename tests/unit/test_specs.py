"""The one option list (gpulayer.client.specs) and the old module paths that stay importable."""

import argparse
import importlib
import subprocess
import sys

import pytest

from gpulayer import contracts, errors
from gpulayer.client import specs


def test_the_resource_options_are_the_fields_of_the_resources_model() -> None:
    assert set(specs.RESOURCE_OPTIONS) == set(contracts.Resources.model_fields)
    assert set(specs.ResourceOptions.__annotations__) == set(contracts.Resources.model_fields)
    fields = set(contracts.JobSpec.model_fields)
    assert set(specs.JOB_OPTIONS) | set(specs.GANG_OPTIONS) <= fields
    keys = set(specs.JobOptions.__annotations__)
    assert keys == {
        *specs.RESOURCE_OPTIONS, *specs.JOB_OPTIONS, *specs.GANG_OPTIONS, *specs.ENV_OPTIONS
    }  # fmt: skip


def test_every_front_end_takes_the_same_resource_options() -> None:
    from gpulayer.cli import build_parser
    from gpulayer.functions.decorator import remote

    args = build_parser().parse_args(["submit", "--", "true"])
    assert set(specs.RESOURCE_OPTIONS) <= set(vars(args))
    for name in specs.RESOURCE_OPTIONS:
        remote(**{name: None})(len)  # known to @gl.remote (None: not set)
    with pytest.raises(TypeError, match="unknown option 'gpu'"):
        remote(gpu=1)


def test_api_access_is_a_flag_everywhere_and_off_by_default() -> None:
    from gpulayer.cli import build_parser
    from gpulayer.functions.decorator import remote

    parser = build_parser()
    assert parser.parse_args(["submit", "--", "true"]).api_access is False
    args = parser.parse_args(["submit", "--api-access", "--", "true"])
    assert specs.job_spec(specs.given(args, specs.JOB_OPTIONS), command=["true"]).api_access
    assert not specs.job_spec({}, command=["true"]).api_access
    assert remote(api_access=True)(len)._base_spec().api_access


def test_resources_leave_out_unset_options_and_let_a_profile_keep_its_values() -> None:
    assert specs.resources({"gpus": 2, "memory": None, "selector": {}}) == {"gpus": 2, "cpus": 1.0}
    assert specs.resources({"profile": "pytorch-cuda", "gpus": 0, "cpus": 1}) == {
        "profile": "pytorch-cuda"
    }
    assert specs.resources({"profile": "pytorch-cuda", "gpus": 2}) == {
        "profile": "pytorch-cuda",
        "gpus": 2,
    }


def test_a_job_is_distributed_when_a_gang_option_is_not_its_default() -> None:
    assert specs.gang({"nodes": 1, "nproc_per_node": 1, "launcher": "torchrun"}) == {}
    assert specs.gang({"nodes": 2})["kind"] == contracts.JobKind.distributed
    assert specs.gang({"nodes": 1}, by_presence=True)["kind"] == contracts.JobKind.distributed


def test_a_flag_is_derived_from_its_field() -> None:
    flag, kwargs = specs.argument("accelerator")
    assert flag == "--accelerator"
    assert kwargs["choices"] == ["cuda", "rocm", "mps", "cpu"]
    flag, kwargs = specs.argument("gpus", help="whole GPUs")
    assert (kwargs["type"], kwargs["default"], kwargs["help"]) == (int, 0, "whole GPUs")
    flag, kwargs = specs.argument("labels", "--label")
    parser = argparse.ArgumentParser()
    parser.add_argument(flag, **kwargs)
    assert specs.given(parser.parse_args(["--label", "a=1"]), ["labels"]) == {"labels": {"a": "1"}}


def test_a_malformed_option_names_its_field() -> None:
    with pytest.raises(errors.ValidationError) as info:
        specs.job_spec({"gpus": -1}, command=["true"])
    assert info.value.field == "resources.gpus"


@pytest.mark.parametrize(
    ("old", "names"),
    [
        ("gpulayer.remote_functions", ["remote", "RemoteFunction", "Call", "MapRun", "wait"]),
        ("gpulayer.jobs", ["Job", "failure_of"]),
        ("gpulayer.cells", ["submit", "MessageDecoder", "CellRun", "strip_ansi"]),
        ("gpulayer.variables", ["pack", "unpack", "push", "pull"]),
        ("gpulayer.config", ["resolve", "save", "load", "ConnectionConfig"]),
        ("gpulayer.cluster", ["LocalCluster", "free_port", "log_tail"]),
        ("gpulayer.magics", ["GpulayerMagics", "load", "Renderer"]),
        ("gpulayer.widgets", ["JobMonitor", "WorkersTable", "JobsProgress", "svg_chart"]),
        ("gpulayer.progress", ["Progress", "bar"]),
        ("gpulayer.token_cli", ["add_parsers"]),
        ("gpulayer.demo", ["main"]),
        ("gpulayer.client", ["Connection", "Job", "submit", "connect", "LONG_POLL_SECONDS"]),
        ("gpulayer.cli", ["main", "build_parser"]),
    ],
)
def test_old_module_paths_stay_importable(old: str, names: list[str]) -> None:
    module = importlib.import_module(old)
    for name in names:
        assert getattr(module, name) is not None


def test_a_function_pickled_by_its_old_path_still_loads() -> None:
    import cloudpickle

    from gpulayer import remote_functions
    from gpulayer.functions import RemoteFunction

    assert remote_functions.RemoteFunction is RemoteFunction
    assert cloudpickle.loads(cloudpickle.dumps(remote_functions.wait)) is remote_functions.wait


def test_the_console_script_and_python_m_resolve() -> None:
    from gpulayer.cli import main

    assert callable(main)
    proc = subprocess.run(
        [sys.executable, "-m", "gpulayer", "--version"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and proc.stdout.startswith("gpulayer "), proc.stderr
