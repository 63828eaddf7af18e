"""Runtime from torchrun's variables; device choice; gpulayer stays torch-free."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpulayer.pytorch import Runtime, select_device


def test_a_world_of_one_without_launcher_variables() -> None:
    runtime = Runtime.from_env(devices="cpu", env={})
    assert (runtime.rank, runtime.world_size, runtime.is_main, runtime.is_distributed) == (
        0, 1, True, False,
    )  # fmt: skip
    assert runtime.backend == "gloo" and runtime.init() is False
    t = torch.tensor([3.0])
    assert runtime.all_reduce(t, "mean") is t and t.item() == 3.0
    assert runtime.any(True) is True and runtime.any(False) is False


def test_torchrun_variables() -> None:
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
           "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}  # fmt: skip
    runtime = Runtime.from_env(devices="cpu", env=env)
    assert (runtime.rank, runtime.local_rank, runtime.world_size, runtime.node_rank) == (3, 1, 4, 1)
    assert (runtime.master_addr, runtime.master_port, runtime.is_main) == ("10.0.0.1", 29500, False)


def test_inconsistent_variables_and_unknown_devices_are_refused() -> None:
    with pytest.raises(ValueError, match="outside WORLD_SIZE"):
        Runtime.from_env(devices="cpu", env={"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="unknown device"):
        select_device("tpu")


def test_auto_falls_back_to_the_cpu_without_accelerators() -> None:
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("this machine has an accelerator")
    assert select_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="no CUDA device"):
        select_device("cuda")


def test_import_gpulayer_does_not_import_torch_but_the_subpackage_does() -> None:
    probe = (
        "import sys, gpulayer; before = 'torch' in sys.modules; import gpulayer.pytorch; "
        "print(before, 'torch' in sys.modules)"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60, env=env).stdout.split()  # fmt: skip
    assert out == ["False", "True"]
