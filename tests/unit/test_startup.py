"""The garbage collector through a process's start-up (ADR 0147), in fresh
interpreters: the collector's state is the whole process's."""

import subprocess
import sys

from ..support import fake_pydantic_plugin

SCRIPT = """
import gc
from gpulayer.startup import hold_gc, release_gc
{before}
hold_gc()
held = gc.isenabled()
junk = [[] for _ in range(1000)]
release_gc()
release_gc()
print(held, gc.isenabled(), gc.get_freeze_count() > 0)
"""


def run(before: str = "") -> str:
    code = SCRIPT.format(before=before)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()  # fmt: skip


def test_release_turns_the_collector_back_on_and_freezes_the_start() -> None:
    assert run() == "False True True"


def test_a_process_that_turned_the_collector_off_itself_keeps_it_off() -> None:
    assert run("gc.disable()") == "False False False"


def test_the_entry_points_release_what_they_hold() -> None:
    """`gpulayer` commands other than `join` release it once parsed; a worker
    releases it once registered, the headless control plane once ready."""
    code = (
        "import gc, sys; sys.argv = ['gpulayer', 'completion', 'bash'];"
        "import gpulayer.__main__ as m; m.main(); print(gc.isenabled(), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr.strip().endswith("True")


MODEL = "import pydantic\nclass M(pydantic.BaseModel):\n    a: int\nM(a=1)\n"


def test_a_gpulayer_command_loads_no_pydantic_plugin_and_a_notebook_keeps_them(tmp_path) -> None:
    env = fake_pydantic_plugin(tmp_path)

    def stderr(code: str) -> str:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, timeout=60, check=True)  # fmt: skip
        return done.stderr

    assert "plugin loaded" in stderr("import gpulayer\n" + MODEL)  # a notebook's process
    command = (
        "import sys; sys.argv = ['gpulayer', 'completion', 'bash'];"
        "import gpulayer.__main__ as m; m.main()\n"
    )
    assert "plugin loaded" not in stderr(command + MODEL)  # the `gpulayer` command's
