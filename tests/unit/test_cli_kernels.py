"""``gpulayer kernel install | list | remove``: kernelspecs Jupyter itself reads back
(jupyter_client's KernelSpecManager, in a private Jupyter data dir)."""

import json
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager

from gpulayer import cli


@pytest.fixture(autouse=True)
def jupyter_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path / "jupyter"
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(data))
    monkeypatch.setenv("JUPYTER_PATH", str(data))
    return data


def test_install_writes_a_kernelspec_jupyter_lists_with_no_credentials(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULAYER_TOKEN", "gl_secret_never_written")
    argv = ["kernel", "install", "--name", "a100", "--gpus", "2", "--gpu-model", "A100*",
            "--pip", "rich", "--env", "MODE=fast", "--idle-timeout", "30m",
            "--sync-workdir"]  # fmt: skip
    assert cli.main(argv) == 0
    spec = KernelSpecManager().get_kernel_spec("a100")
    assert spec.display_name == "Python 3 (gpulayer, 2 GPUs)"
    assert spec.interrupt_mode == "message"
    provisioner = spec.metadata["kernel_provisioner"]
    assert provisioner["provisioner_name"] == "gpulayer-provisioner"
    assert provisioner["config"] == {
        "gpus": 2, "gpu_model": "A100*", "pip": ["rich"], "env": {"MODE": "fast"},
        "idle_timeout": "1800.0", "start_timeout": 300.0, "sync_workdir": True,
    }  # fmt: skip
    written = Path(KernelSpecManager().find_kernel_specs()["a100"], "kernel.json").read_text()
    assert "gl_secret" not in written and "GPULAYER" not in written

    assert cli.main(["kernel", "install", "--name", "one", "--gpus", "1"]) == 0
    assert KernelSpecManager().get_kernel_spec("one").display_name == "Python 3 (gpulayer, 1 GPU)"
    capsys.readouterr()
    assert cli.main(["kernel", "list"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [r.split()[0] for r in rows] == ["NAME", "a100", "one"]
    assert cli.main(["kernel", "list", "-o", "json"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"a100", "one"}

    assert cli.main(["kernel", "remove", "a100"]) == 0
    assert set(KernelSpecManager().find_kernel_specs()) >= {"one"}
    assert "a100" not in KernelSpecManager().find_kernel_specs()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--name", "bad name!", "--gpus", "1"], "--name 'bad name!'"),
        (["--name", "k", "--gpus", "-1"], "--gpus"),
        (["--name", "k", "--gpus", "1", "--idle-timeout", "soon"], "soon"),
        (["--name", "k", "--gpus", "1", "--start-timeout", "0"], "--start-timeout"),
        (["--name", "k", "--gpus", "1", "--env", "NOEQUALS"], "--env 'NOEQUALS'"),
        (["--name", "k", "--gpus", "1", "--pip", "not a requirement!!"], "pip"),
    ],
)
def test_bad_input_is_one_line_naming_the_option(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["kernel", "install", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpulayer: error: ") and says in err, err
    assert KernelSpecManager().find_kernel_specs().get("k") is None


def test_remove_refuses_a_kernelspec_that_is_not_gpulayers(
    capsys: pytest.CaptureFixture[str], jupyter_dirs: Path
) -> None:
    folder = jupyter_dirs / "kernels" / "local"
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps({"argv": ["python"], "display_name": "local",
                                                    "language": "python"}))  # fmt: skip
    assert cli.main(["kernel", "remove", "local"]) == 1
    assert "no gpulayer kernel named 'local'" in capsys.readouterr().err
    assert folder.exists()
