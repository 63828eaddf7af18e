"""Hostile input against the real control plane: thousands of malformed requests
(hypothesis) produce no 500 and leave the store as it was; oversized bodies are
413; a worker refuses malicious bundles and writes nothing outside its task dir."""

import io
import json
import sqlite3
import tarfile
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulayer import contracts
from gpulayer.cluster import LocalCluster

from ..support import entries, files, until

#: (method, path template); {job} is the one stored job or a random segment, {x} random.
ROUTES = [
    ("GET", "health"), ("GET", "jobs"), ("POST", "jobs"), ("GET", "jobs/{job}"),
    ("GET", "jobs/{job}/wait"), ("POST", "jobs/{x}/cancel"), ("GET", "jobs/{job}/events"),
    ("GET", "jobs/{job}/logs"), ("GET", "jobs/{job}/artifacts"),
    ("GET", "jobs/{job}/artifacts/{x}"), ("GET", "jobs/{job}/placement"), ("GET", "workers"),
    ("POST", "workers/register"), ("POST", "workers/{x}/heartbeat"),
    ("POST", "workers/{x}/acquire"), ("POST", "tasks/{x}/logs"), ("PUT", "tasks/{x}/artifacts/{x}"),
    ("POST", "tasks/{x}/complete"), ("GET", "blobs/{x}"), ("GET", "tokens"), ("POST", "tokens"),
    ("DELETE", "tokens/{x}"), ("POST", "workers/{x}/drain"), ("GET", "workers/{x}/telemetry"),
]  # fmt: skip
QUERY_KEYS = ["wait", "timeout", "offset", "limit", "state", "x"]
TABLES = ["jobs", "tasks", "events", "logs", "artifacts", "workers", "tokens"]


@pytest.fixture(scope="module")
def quiet(tmp_path_factory) -> Iterator[LocalCluster]:
    """No workers (nothing heartbeats), short holds, no failed-login limit."""
    args = ["--GpulayerApp.long_poll_seconds=0.05", "--GpulayerApp.login_failures_allowed=0",
            "--GpulayerApp.max_body_bytes=4096", "--GpulayerApp.max_blob_bytes=8192",
            "--GpulayerApp.max_batch_bytes=4096"]  # fmt: skip
    with LocalCluster(tmp_path_factory.mktemp("fuzz"), workers=0, server_args=args) as c:
        yield c


def _is_json_object(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data), dict)
    except (ValueError, UnicodeDecodeError):
        return False


segments = st.text(st.characters(codec="utf-8", exclude_characters="/"), max_size=24).filter(
    lambda s: s not in ("admin", "join", "", ".", "..")
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)  # fmt: skip
field_names = st.sampled_from(
    ["command", "shell", "name", "role", "resources", "gpus", "timeout", "expires", "bundle",
     "hostname", "cpus", "memory_bytes", "seq", "lines", "state", "running_tasks", "env"]
)  # fmt: skip
#: Bodies no route accepts: an unknown field, a non-object, or bytes that are not an object.
bad_bodies = st.one_of(
    st.dictionaries(field_names | st.text(max_size=8), json_values, max_size=6).map(
        lambda d: json.dumps({**d, "__fuzz__": 1}).encode()
    ),
    json_values.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=300).filter(lambda b: not _is_json_object(b)),
    st.just(b"x" * 5000),  # over max_body_bytes
)
requests = st.fixed_dictionaries(
    {
        "route": st.sampled_from(ROUTES),
        "method": st.none() | st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
        "auth": st.sampled_from(["admin", "none", "unknown", "garbage", "viewer"]),
        "use_job": st.booleans(),
        "segment": segments,
        "query": st.dictionaries(st.sampled_from(QUERY_KEYS), st.text(max_size=12), max_size=3),
        "body": bad_bodies,
        "content_type": st.sampled_from(["application/json", "text/plain", None]),
    }
)


def snapshot(db) -> dict[str, list[tuple]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {t: sorted(map(tuple, con.execute(f"SELECT * FROM {t}"))) for t in TABLES}
    finally:
        con.close()


def test_random_malformed_requests_never_500_and_change_nothing(quiet):
    admin = quiet.admin_token
    api = quiet.url + contracts.API_PREFIX.lstrip("/") + "/"
    with quiet.connection() as conn:
        job = conn.submit(contracts.JobSpec(command=["true"], resources={"gpus": 8}))
        viewer = conn.create_token(contracts.CreateToken(name="fuzz-viewer", role="viewer"))
    db = quiet.data_dir / "gpulayer.db"
    before = snapshot(db)
    auth = {"admin": f"Bearer {admin}", "none": "", "unknown": "Bearer gl_" + "z" * 43,
            "garbage": "Bearer \u00ff nonsense", "viewer": f"Bearer {viewer.token}"}  # fmt: skip
    seen: dict[int, int] = {}

    with httpx.Client(timeout=10) as http:

        @settings(max_examples=2500, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(req=requests)
        def fuzz(req):
            method, template = req["route"]
            method = req["method"] or method
            seg = quote(req["segment"], safe="")
            path = template.replace("{job}", job.id if req["use_job"] else seg)
            path = path.replace("{x}", seg or "x")
            headers = {"Authorization": auth[req["auth"]].encode("latin-1")}
            if req["content_type"]:
                headers["Content-Type"] = req["content_type"]
            content = req["body"] if method in ("POST", "PUT", "PATCH", "DELETE") else None
            if req["auth"] == "admin" and template == "workers/{x}/drain":
                path = path + "x"  # never drain a real worker (there is none; stay sure)
            resp = http.request(method, api + path, params=req["query"], headers=headers,
                                content=content)  # fmt: skip
            seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
            assert resp.status_code < 500, (method, path, resp.status_code, resp.text[:300])
            if resp.status_code >= 400 and resp.content:
                assert "Traceback" not in resp.text and admin not in resp.text
            if method != "GET" and req["auth"] != "none" and resp.status_code < 400:
                # only reads and empty long polls may succeed
                assert (method, template) in {("POST", "workers/{x}/acquire")}, (method, path)

        fuzz()
    assert snapshot(db) == before
    assert sum(seen.values()) >= 2000
    assert {400, 401, 404} <= set(seen), seen


def test_oversized_bodies_are_413_with_a_message(quiet):
    with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {quiet.admin_token}"}) as h:
        api = quiet.url + contracts.API_PREFIX.lstrip("/") + "/"
        for method, path, size in [("POST", "jobs", 5000), ("POST", "blobs", 9000),
                                   ("PUT", "tasks/t/artifacts/a.bin", 9000),
                                   ("POST", "tasks/t/logs", 5000)]:  # fmt: skip
            resp = h.request(method, api + path, content=b"{" + b" " * size + b"}")
            assert resp.status_code == 413, (path, resp.text)
            err = resp.json()
            assert err["code"] == "too_large" and "at most" in err["message"]


def _evil_bundles() -> dict[str, bytes]:
    def tar(*members):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as t:
            for info, data in members:
                info.size = len(data or b"")
                t.addfile(info, io.BytesIO(data) if data else None)
        return buf.getvalue()

    def member(name, data=b"pwned", kind=tarfile.REGTYPE, target=""):
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, target
        return info, data if kind == tarfile.REGTYPE else None

    def path_max_chain(escape):  # the 2025 trick past the `data` filter (see the unit test)
        comp, steps, path, out = "d" * 247, "abcdefghijklmnop", "", []
        for step in steps:
            out += [member(f"{path}{comp}", kind=tarfile.DIRTYPE),
                    member(f"{path}{step}", kind=tarfile.SYMTYPE, target=comp)]  # fmt: skip
            path += comp + "/"
        chain = "/".join(steps) + "/" + "l" * 254
        return [member(chain, kind=tarfile.SYMTYPE, target="../" * len(steps)),
                member("escape", kind=tarfile.SYMTYPE, target=f"{chain}/{escape}"),
                member("escape/evil-pathmax.txt")]  # fmt: skip

    return {
        "dotdot": tar(member("../../../../evil-dotdot.txt")),
        "path_max": tar(*path_max_chain("../../..")),
        "inside symlink": tar(member("a.txt"), member("b", kind=tarfile.SYMTYPE, target="a.txt")),
        "absolute": tar(member("/tmp/gpulayer-evil-absolute.txt")),
        "symlink": tar(member("up", kind=tarfile.SYMTYPE, target="../../.."),
                       member("up/evil-symlink.txt")),
        "hardlink": tar(member("hl", kind=tarfile.LNKTYPE, target="../../../../gpulayer.db")),
        "device": tar(member("null", kind=tarfile.CHRTYPE)),
        "bomb": tar(member("zeros.bin", b"\0" * (4 * 1024 * 1024))),
    }  # fmt: skip


def test_the_worker_refuses_malicious_bundles_and_writes_nothing_outside(fresh_cluster):
    c = fresh_cluster(workers=1, env={"GPULAYER_MAX_BUNDLE_BYTES": str(1024 * 1024)})
    tasks = c.data_dir / "workers" / "local-1" / "tasks"
    # The worker keeps its credential once registered: let that settle first.
    until(lambda: (tasks.parent / "credential.json").exists(), what="the worker's credential")
    before = files(c.data_dir)
    with c.connection() as conn:
        for case, data in _evil_bundles().items():
            ref = conn.upload_blob(data)
            spec = contracts.JobSpec(command=["true"], bundle=ref.sha256)
            job = conn.submit(spec)
            done = until(lambda j=job: (x := conn.job(j.id)).state.terminal and x, what=case)
            assert done.state == "failed", (case, done.reason)
            assert "bundle" in (done.reason or ""), (case, done.reason)
            if "symlink" in case or case == "path_max":
                assert "is a symlink" in (done.reason or ""), (case, done.reason)
    # A job is reported ended before the worker removes its task folder: wait for
    # the clean-up (it must happen), then compare with nothing still moving.
    until(lambda: not any(entries(tasks)), what="the worker to remove its task dirs")
    new = {p for p in files(c.data_dir) - before if "blobs" not in p.parts and p.suffix != ".log"}
    assert not new, new
    assert not any(p.name.startswith("evil") for p in entries(c.data_dir.parent))
