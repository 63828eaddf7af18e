"""Owner-only folders and files (``gpulayer.private``), whatever the umask."""

import os
import pwd
import stat

import pytest

from gpulayer.private import open_private, private_dir, tighten, write_private


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def loose_umask():
    old = os.umask(0)
    yield
    os.umask(old)


def test_folders_and_files_are_owner_only_even_under_umask_0(tmp_path, loose_umask):
    folder = private_dir(tmp_path / "a" / "b")
    assert mode(tmp_path / "a") == mode(folder) == 0o700
    os.close(open_private(folder / "log", os.O_WRONLY | os.O_APPEND))
    write_private(folder / "token", b"secret")
    assert mode(folder / "log") == mode(folder / "token") == 0o600
    assert (folder / "token").read_bytes() == b"secret"


def test_tighten_takes_group_and_other_bits_off_a_whole_tree(tmp_path, loose_umask):
    (tmp_path / "d" / "e").mkdir(parents=True, mode=0o755)
    (tmp_path / "d" / "e" / "f").write_text("x")
    os.chmod(tmp_path / "d" / "e" / "f", 0o644)
    (tmp_path / "d" / "link").symlink_to("/etc/hostname")
    assert tighten(tmp_path / "d") == 3
    assert {mode(p) for p in (tmp_path / "d", tmp_path / "d" / "e")} == {0o700}
    assert mode(tmp_path / "d" / "e" / "f") == 0o600
    assert mode("/etc/hostname") & 0o004  # a link's target is left alone


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's folder")
def test_a_folder_or_link_that_another_user_made_in_advance_is_refused(tmp_path):
    nobody = pwd.getpwnam("nobody").pw_uid
    planted = tmp_path / "planted"
    planted.mkdir()
    os.chown(planted, nobody, -1)
    with pytest.raises(PermissionError, match="not this user's folder"):
        private_dir(planted)
    mine = private_dir(tmp_path / "mine")
    link = tmp_path / "link"
    link.symlink_to(mine)
    os.lchown(link, nobody, -1)
    with pytest.raises(PermissionError, match="not this user's folder"):
        private_dir(link)
