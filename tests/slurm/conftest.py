"""Fixtures for tests against real Slurm daemons (``daemons.py``): a one-node cluster on
this machine with fake GPUs, and a control plane whose only capacity is a ``slurm``
provider (``gpulayer up --local-workers 0 --providers slurm.toml``, as
``docs/providers.md`` shows on a login node).

Every test here is skipped, with the reason, where Slurm is not installed or we are not
root (CI installs Slurm and runs as root).
"""

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer.cluster import LocalCluster

from ..providers.conftest import FAST, toml
from ..support import skip_folder
from .daemons import SlurmCluster, missing, one_node

#: The node's GPUs, as its worker sees them (Slurm hands out /dev-like fake devices;
#: the worker keeps those in its CUDA_VISIBLE_DEVICES, see devices.allocated).
NODE_GPUS = "2xA100-80GB"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip every test here, with the reason, where Slurm cannot run."""
    skip_folder(items, Path(__file__).parent, missing())


@pytest.fixture(scope="module")
def gl_slurm() -> Iterator[SlurmCluster]:
    """One slurmd (``gl1``, 2 fake GPUs, 4 CPUs) and its slurmctld on this machine, in
    partition ``gpu`` (one node at most, 60 minutes at most)."""
    with one_node(gpus=2, max_nodes=1) as slurm:
        yield slurm


def slurm_table(slurm: SlurmCluster, **options: Any) -> dict[str, Any]:
    """A ``[providers.hpc]`` table for ``slurm``: partition ``gpu``, the node's GPUs
    set up by the preamble (as ``module load`` would), short timeouts."""
    return {
        "kind": "slurm",
        "partition": slurm.partition,
        "gres": "gpu",
        "gpus_per_node": 2,
        "gpu_model": "A100",
        "gpu_memory": 80,
        "time_limit": "30m",
        "idle_timeout": 2,
        "boot_timeout": 90,
        "preamble": f"#SBATCH --comment=gpulayer-test\nexport GPULAYER_SIMULATED_GPUS={NODE_GPUS}",
        **options,
    }


@pytest.fixture
def gl_slurm_plane(gl_slurm: SlurmCluster, tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """``make(**options)``: a started control plane with one slurm provider ``hpc`` (its
    table from :func:`slurm_table` with ``options``) and no local worker; stopped, and
    its Slurm jobs cancelled, at the end."""
    made: list[LocalCluster] = []

    def make(**options: Any) -> LocalCluster:
        path = tmp_path / f"slurm-{len(made)}.toml"
        path.write_text(toml({"hpc": slurm_table(gl_slurm, **options)}))
        args = [f"--GpulayerApp.providers_file={path}", "--GpulayerApp.autoscale_seconds=0.5"]
        c = LocalCluster(tmp_path / f"c{len(made)}", workers=0, server_args=args,
                         env=gl_slurm.env, **FAST)  # fmt: skip
        made.append(c)
        return c.start()

    yield make
    for c in made:
        c.stop()
    gl_slurm.run("scancel", "--partition", gl_slurm.partition, check=False)
