"""One default data dir for `gpulayer up` and the extension, the client's config dir,
and an older gpulayer's ~/.local/share/gpulayer moved into place, private."""

import os
import stat
from pathlib import Path

import pytest

from gpulayer import paths
from gpulayer.cli.up import default_data_dir
from gpulayer.client.config import config_path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh home: no gpulayer or Jupyter variable, XDG defaults, Linux layout."""
    for var in ("GPULAYER_DATA_DIR", "GPULAYER_CONFIG", "JUPYTER_DATA_DIR", "XDG_DATA_HOME",
                "XDG_CONFIG_HOME", "JUPYTER_PLATFORM_DIRS"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def old_gpulayer_data(home: Path) -> Path:
    """What `gpulayer up` of an older version left: tokens, a database, a blob and a
    job's executable artifact, created with a permissive umask."""
    legacy = home / ".local" / "share" / "gpulayer"
    (legacy / "blobs" / "ab").mkdir(parents=True)
    (legacy / "admin.token").write_text("gl_old\n")
    (legacy / "admin.token").chmod(0o644)
    (legacy / "gpulayer.db").write_bytes(b"SQLite format 3\x00")
    (legacy / "blobs" / "ab" / "abcd").write_bytes(b"blob")
    (legacy / "blobs" / "ab" / "abcd").chmod(0o644)
    (legacy / "blobs").chmod(0o755)
    script = legacy / "workers" / "local-1" / "tasks" / "t1" / "artifacts" / "run.sh"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    return legacy


def test_up_the_extension_and_the_client_share_one_default(home: Path, monkeypatch) -> None:
    from jupyter_ext.app import GpulayerApp

    expected = home / ".local" / "share" / "jupyter" / "gpulayer"
    assert paths.data_dir() == default_data_dir() == expected
    assert Path(GpulayerApp().data_dir) == expected
    assert config_path() == home / ".config" / "gpulayer" / "connection.json"

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(home / "jupyter-data"))  # Jupyter's own knob
    assert default_data_dir() == home / "jupyter-data" / "gpulayer"
    assert Path(GpulayerApp().data_dir) == home / "jupyter-data" / "gpulayer"
    monkeypatch.setenv("GPULAYER_DATA_DIR", str(home / "mine"))  # gpulayer's wins
    assert default_data_dir() == home / "mine" == Path(GpulayerApp().data_dir)


def test_an_older_gpulayers_data_moves_into_place_private(home: Path) -> None:
    legacy = old_gpulayer_data(home)
    target = paths.data_dir()

    notes = paths.prepare_data_dir(target)

    assert notes == [f"moved the gpulayer data from {legacy} to {target}"]
    assert (target / "admin.token").read_text() == "gl_old\n"
    assert (target / "blobs" / "ab" / "abcd").read_bytes() == b"blob"
    assert legacy.is_symlink() and legacy.resolve() == target.resolve()
    assert (legacy / "admin.token").read_text() == "gl_old\n"  # old scripts still read it
    assert mode(target) == 0o700
    assert mode(target / "admin.token") == 0o600
    assert mode(target / "blobs") == 0o700 and mode(target / "blobs" / "ab" / "abcd") == 0o600
    script = target / "workers" / "local-1" / "tasks" / "t1" / "artifacts" / "run.sh"
    assert mode(script) == 0o700  # the owner keeps x; nobody else gets anything
    # Once moved, a second start finds the link and moves nothing.
    assert paths.prepare_data_dir(target) == []


def test_data_in_both_places_leaves_the_old_one_and_says_so(home: Path) -> None:
    legacy = old_gpulayer_data(home)
    target = paths.data_dir()
    target.mkdir(parents=True)
    (target / "gpulayer.db").write_bytes(b"the extension's own")

    notes = paths.prepare_data_dir(target)

    assert len(notes) == 1 and str(legacy) in notes[0] and f"--data-dir {legacy}" in notes[0]
    assert not legacy.is_symlink() and (legacy / "admin.token").is_file()
    assert (target / "gpulayer.db").read_bytes() == b"the extension's own"
    assert mode(target) == 0o700


def test_an_explicit_data_dir_moves_nothing(home: Path, monkeypatch) -> None:
    legacy = old_gpulayer_data(home)
    monkeypatch.setenv("GPULAYER_DATA_DIR", str(home / "elsewhere"))
    assert paths.prepare_data_dir(paths.data_dir()) == []
    assert paths.prepare_data_dir(home / "another") == []
    assert (legacy / "admin.token").is_file() and not legacy.is_symlink()
    assert mode(home / "elsewhere") == mode(home / "another") == 0o700


def test_a_fresh_machine_gets_a_private_empty_folder(home: Path) -> None:
    target = paths.data_dir()
    assert paths.prepare_data_dir(target) == []
    assert target.is_dir() and mode(target) == 0o700
    assert not paths.legacy_data_dir().exists()


def test_one_control_plane_holds_a_data_dir_at_a_time(home: Path) -> None:
    target = paths.data_dir()
    paths.prepare_data_dir(target)
    first = paths.lock_data_dir(target)
    assert mode(target / paths.LOCK_FILE) == 0o600  # private from the start, as the rest
    try:
        with pytest.raises(paths.DataDirInUse, match=rf"pid {os.getpid()}\) uses {target}"):
            paths.lock_data_dir(target)
    finally:
        first.close()
    paths.lock_data_dir(target).close()  # released with its holder


def test_the_lock_names_the_port_its_holder_listens_on_once_it_does(home: Path) -> None:
    """What `gpulayer up` reads to know that the server on its port is the one it
    started; a control plane that takes the folder over starts without a port."""
    target = paths.data_dir()
    paths.prepare_data_dir(target)
    assert paths.lock_holder(target) == (None, None)  # nobody has held it
    lock = paths.lock_data_dir(target)
    assert paths.lock_holder(target) == (os.getpid(), None)  # not listening yet
    paths.note_port(lock, 8765)
    assert paths.lock_holder(target) == (os.getpid(), 8765)
    lock.close()
    again = paths.lock_data_dir(target)
    try:
        assert paths.lock_holder(target) == (os.getpid(), None)  # the old port is gone
    finally:
        again.close()
