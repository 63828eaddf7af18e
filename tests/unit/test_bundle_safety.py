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


def test_a_good_bundle_with_inside_links_unpacks(layout, tmp_path):
    _sandbox, task = layout
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "train.py").write_text("print('hi')\n")
    task.unpack(bundle.pack(src))
    assert (task.work / "pkg" / "mod.py").read_text() == "X = 1\n"
    inside = tar_gz(file("data/a.txt", b"A"), link("b.txt", "data/a.txt", tarfile.SYMTYPE))
    task.unpack(inside)
    assert (task.work / "b.txt").read_text() == "A"
