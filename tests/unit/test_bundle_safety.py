"""Hostile source bundles: every malicious tar is refused before anything is written.

Each archive is built with :mod:`tarfile` as an attacker would; the worker's
:class:`~gpulayer.worker.workspace.TaskDir` unpacks it. Nothing may appear outside
the task directory, and (since every member is checked first) nothing inside it.
"""

import io
import os
import tarfile
from pathlib import Path

import pytest

from gpulayer import bundle
from gpulayer.errors import PayloadTooLarge, ValidationError
from gpulayer.worker.workspace import TaskDir


def tar_gz(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def link(name: str, target: str, kind: bytes) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def device(name: str, kind: bytes) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.devmajor, info.devminor = 1, 3  # /dev/null's numbers
    return info, None


@pytest.fixture
def layout(tmp_path: Path):
    """A tasks root inside a sandbox; the sandbox must not change outside it."""
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    (sandbox / "secret.txt").write_text("keep me")
    task = TaskDir.create(sandbox / "tasks", "t1")
    return sandbox, task


def snapshot(root: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            rel = str(p.relative_to(root))
            out[rel] = os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "d"
    return out


def path_max_escape(escape: str) -> bytes:
    """The 2025 PATH_MAX trick: a chain of symlinks whose resolved path is too long
    for ``os.path.realpath`` to follow, so the ``data`` filter of a Python without the
    fix sees a harmless path, then a file is written through it (``escape``, relative
    to the task's work dir, is where it lands)."""
    comp, steps, path = "d" * 247, "abcdefghijklmnop", ""
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for step in steps:
        members.append(dir_(os.path.join(path, comp)))
        members.append(link(os.path.join(path, step), comp, tarfile.SYMTYPE))
        path = os.path.join(path, comp)
    chain = os.path.join(*steps, "l" * 254)
    members.append(link(chain, "../" * len(steps), tarfile.SYMTYPE))
    members.append(link("escape", f"{chain}/{escape}", tarfile.SYMTYPE))
    members.append(file("escape/evil.txt", b"pwned"))
    return tar_gz(*members)


def dir_(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info, None


def outside(escape: str) -> str:
    """A path relative to the task's work dir that lands in the sandbox."""
    return "../../../" + escape


MALICIOUS = {
    "absolute path": tar_gz(file("/tmp/gpulayer-evil-abs")),
    "dot-dot path": tar_gz(file("ok.txt"), file(outside("evil.txt"))),
    "dot-dot in the middle": tar_gz(file("a/../../../../evil.txt")),
    "symlink to an absolute path": tar_gz(link("etc", "/etc", tarfile.SYMTYPE)),
    "symlink leaving the dir": tar_gz(link("up", outside(""), tarfile.SYMTYPE)),
    "symlink then a file through it": tar_gz(
        link("up", outside(""), tarfile.SYMTYPE), file("up/evil.txt")
    ),
    "hardlink to an outside file": tar_gz(link("hl", outside("secret.txt"), tarfile.LNKTYPE)),
    "hardlink to an absolute path": tar_gz(link("hl", "/etc/passwd", tarfile.LNKTYPE)),
    "character device": tar_gz(device("null", tarfile.CHRTYPE)),
    "block device": tar_gz(device("disk", tarfile.BLKTYPE)),
    "fifo": tar_gz(device("pipe", tarfile.FIFOTYPE)),
    "not a tar at all": b"\x1f\x8b\x08\x00garbage",
    "PATH_MAX symlink chain": path_max_escape("../../.."),
    # links that stay inside are refused too: the packer never makes one
    "symlink inside the dir": tar_gz(file("a.txt"), link("b.txt", "a.txt", tarfile.SYMTYPE)),
    "hardlink inside the dir": tar_gz(file("a.txt"), link("b.txt", "a.txt", tarfile.LNKTYPE)),
}


@pytest.mark.parametrize("case", list(MALICIOUS))
def test_malicious_bundles_are_refused_and_write_nothing(layout, case):
    sandbox, task = layout
    before = snapshot(sandbox)
    with pytest.raises(ValidationError) as info:
        task.unpack(MALICIOUS[case])
    assert info.value.field == "bundle"
    assert "bundle" in info.value.message
    assert snapshot(sandbox) == before
    assert not Path("/tmp/gpulayer-evil-abs").exists()


@pytest.mark.parametrize(
    ("kind", "member", "words"),
    [
        ("symlink", link("s", "t", tarfile.SYMTYPE), "'s' is a symlink"),
        ("hardlink", link("h", "t", tarfile.LNKTYPE), "'h' is a hardlink"),
        ("fifo", device("p", tarfile.FIFOTYPE), "'p' is a device or FIFO"),
    ],
)
def test_the_refusal_names_the_member_and_its_kind(layout, kind, member, words):
    _sandbox, task = layout
    with pytest.raises(ValidationError) as info:
        task.unpack(tar_gz(file("t"), member))
    assert words in info.value.message, kind
    assert "only regular files and directories" in info.value.message


def test_a_decompression_bomb_is_refused_before_anything_is_written(layout):
    sandbox, task = layout
    bomb = tar_gz(file("ok.txt"), file("zeros.bin", b"\0" * (8 * 1024 * 1024)))
    assert len(bomb) < 64 * 1024  # tiny on the wire
    before = snapshot(sandbox)
    with pytest.raises(PayloadTooLarge) as info:
        bundle.unpack(bomb, task.work, max_bytes=1024 * 1024)
    assert "more than 1048576 bytes" in info.value.message
    assert snapshot(sandbox) == before


def test_too_many_members_are_refused(layout, monkeypatch):
    _sandbox, task = layout
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_FILES", "10")
    many = tar_gz(*(file(f"f{i}") for i in range(11)))
    with pytest.raises(PayloadTooLarge, match="more than 10 files"):
        task.unpack(many)
    assert list(task.work.iterdir()) == []
    monkeypatch.setenv("GPULAYER_MAX_BUNDLE_FILES", "lots")
    with pytest.raises(ValidationError, match="GPULAYER_MAX_BUNDLE_FILES"):
        task.unpack(many)


def test_a_packed_directory_with_links_unpacks_without_them(layout, tmp_path):
    _sandbox, task = layout
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "train.py").write_text("print('hi')\n")
    (src / "alias.py").symlink_to("train.py")  # the packer skips links, so it unpacks
    task.unpack(bundle.pack(src))
    assert (task.work / "pkg" / "mod.py").read_text() == "X = 1\n"
    assert (task.work / "train.py").read_text() == "print('hi')\n"
    assert not (task.work / "alias.py").exists()
    dirs = tar_gz(dir_("empty"), dir_("data"), file("data/a.txt", b"A"))
    task.unpack(dirs)
    assert (task.work / "empty").is_dir() and (task.work / "data/a.txt").read_text() == "A"
