"""The one transfer path: packing bounded in memory and refused while it writes,
downloads written whole or not at all, and storage errors mapped back to the
classes the control plane raised."""

import hashlib
import tarfile
import tempfile
import tracemalloc
from pathlib import Path

import httpx
import pytest

from gpulayer import bundle, contracts, errors, transfer
from gpulayer.client import Connection

GiB = 1024**3


def read_bytes_so_far() -> int:
    """Bytes this process has read through read(2) (``rchar``), sparse files included."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_a_large_workdir_is_refused_while_packing_in_bounded_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "train.py").write_text("print('hi')\n")
    with (work / "data" / "huge.bin").open("wb") as f:
        f.truncate(4 * GiB)  # sparse: costs no disk, reads as zeros
    limit = 256 * 1024
    read_before = read_bytes_so_far()
    tracemalloc.start()
    try:
        with (
            pytest.raises(errors.PayloadTooLarge) as info,
            transfer.pack_workdir(work, max_bytes=limit),
        ):
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    read = read_bytes_so_far() - read_before
    message = info.value.message
    assert "\n" not in message and info.value.field == "workdir"
    assert "more than 256.0 KiB, the limit" in message
    assert "biggest files: data/huge.bin (4.0 GiB), train.py (12 bytes)" in message
    assert peak < 8 * 1024 * 1024, peak  # a few chunks, not the file
    assert read < GiB, read  # stopped as the bundle passed the limit, not at the end
    assert not list((tmp_path / "tmp").iterdir())  # the partial bundle is gone


def test_a_packed_workdir_unpacks_to_the_same_files_and_its_digest_is_its_content(tmp_path):
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    (work / "pkg" / "m.py").write_text("x = 1\n")
    (work / "blob.bin").write_bytes(bytes(range(256)) * 4000)
    (work / ".git").mkdir()
    (work / ".git" / "HEAD").write_text("ref")
    seen: list[int] = []
    with transfer.pack_workdir(work, progress=lambda done, total: seen.append(done)) as packed:
        assert transfer.digest_file(packed.path) == packed.digest
        assert seen[-1] == packed.digest.size
        bundle.unpack(packed.path, tmp_path / "out")
        with tarfile.open(packed.path) as tar:
            assert sorted(tar.getnames()) == ["blob.bin", "pkg/m.py"]
    assert not packed.path.exists()
    assert (tmp_path / "out" / "blob.bin").read_bytes() == (work / "blob.bin").read_bytes()


def test_receive_writes_the_file_only_when_whole_and_matching(tmp_path):
    data = b"abc" * 1000
    good = transfer.Digest(hashlib.sha256(data).hexdigest(), len(data))
    dest = tmp_path / "d" / "out.bin"
    assert transfer.receive([data[:10], data[10:]], dest, expected=good) == good
    assert dest.read_bytes() == data
    corrupt = data[:-1] + b"x"
    with pytest.raises(errors.TransferError, match="arrived corrupt"):
        transfer.receive([corrupt], tmp_path / "bad.bin", expected=good)
    with pytest.raises(errors.TransferError, match="larger than the 3000 bytes"):
        transfer.receive([data, b"more"], tmp_path / "long.bin", expected=good)
    with pytest.raises(errors.TransferError, match="arrived corrupt"):  # cut short
        transfer.receive([data[:100]], dest, expected=good)
    assert dest.read_bytes() == data  # a failed download leaves the old file alone
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["out.bin"]


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [(507, "storage_full", errors.StorageFull), (503, "storage_unavailable", errors.StorageError)],
)
def test_storage_errors_come_back_as_their_classes(status, code, cls):
    message = "the control plane's disk is full (/srv/gpulayer/blobs); free space there and retry"

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"code": code, "message": message})

    conn = Connection("http://cp.example/", "gl_x", transport=httpx.MockTransport(answer))
    with pytest.raises(cls) as info:
        conn.submit(contracts.JobSpec(command=["true"]))
    assert type(info.value) is cls and info.value.message == message
    with pytest.raises(cls):
        conn.upload_blob(b"bundle")
