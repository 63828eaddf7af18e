"""A control plane with providers (``--GpulayerApp.providers_file``), started the way
``gpulayer up --providers FILE`` starts it, and no local worker."""

import contextlib
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer.cluster import LocalCluster

FAST = {"heartbeat_seconds": 0.5, "lease_seconds": 4.0}


def toml(providers: dict[str, dict[str, Any]]) -> str:
    """``[providers.NAME]`` tables for ``providers`` (values as TOML literals)."""
    lines = []
    for name, table in providers.items():
        lines.append(f"[providers.{name}]")
        offers = table.pop("offers", [])
        for key, value in table.items():
            lines.append(f"{key} = {json.dumps(value)}")
        for offer in offers:
            lines.append(f"[[providers.{name}.offers]]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in offer.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture
def gl_provider_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """``make(providers, **kw)``: a started cluster whose control plane has ``providers``
    (a dict of tables) and no local workers; stopped (instances terminated) at the end."""
    made: list[LocalCluster] = []

    def make(providers: dict[str, dict[str, Any]], *, start: bool = True, **kw: Any) -> Any:
        path = tmp_path / f"providers-{len(made)}.toml"
        path.write_text(toml(providers))
        args = [f"--GpulayerApp.providers_file={path}", "--GpulayerApp.autoscale_seconds=0.2"]
        c = LocalCluster(tmp_path / f"c{len(made)}", workers=0, server_args=args, **{**FAST, **kw})
        made.append(c)
        return c.start() if start else c

    yield make
    for c in made:
        c.stop()
        stop_instances(c.data_dir)


def stop_instances(data_dir: Path) -> None:
    """Kill what simulated and local providers left running (by the PIDs they recorded)."""
    for state in (data_dir / "providers").glob("*/instances.json"):
        try:
            entries = json.loads(state.read_text())
        except (OSError, ValueError):
            continue
        for entry in entries.values():
            for pid in entry["pids"]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
