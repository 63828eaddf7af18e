"""Partitions between hosts, with the session's short timings (heartbeat 0.5 s, lease
5 s: a cut-off worker stops its tasks at 4 s, the control plane retries them at 5 s).

* A worker host's link down, or everything it sends and receives silently dropped
  (iptables in its namespace), for longer than the lease: its task is retried on the
  other host, the first attempt is stopped before the retry starts (no overlap), the
  job's side effect (a request to a service on the laptop, which the worker host can
  still reach while only its link to ctl is dropped) happens once, and the worker
  rejoins when the network heals.
* The same faults for a moment: no retry, the task finishes, every line is in its log.
* The control plane's host cut off from everything for a while: when it is back,
  workers and clients carry on within 30 s, and nothing acknowledged is lost.

The partitions' durations are the scenario itself (``time.sleep`` while the fault
lasts); everything else waits on a deadline poll.
"""

import json
import time
from collections.abc import Iterator

import pytest

from ..support import until
from .conftest import LEASE_SECONDS, WORKERS, Laptop
from .harness import Host, Hosts

EFFECTS_PORT = 9000

SERVICE = """
import http.server, os, sys
log = os.path.join(os.environ["TMPDIR"], "effects.log")
class Effects(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log, "a") as f:
            f.write(self.path + "\\n")
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Effects).serve_forever()
"""

#: The job: ticks into its host's own temp dir while it runs (the test reads them to
#: see when each attempt ran), prints numbered lines, then makes its side effect.
JOB = """
import os, socket, sys, time, urllib.request
job, attempt = os.environ["GPULAYER_JOB_ID"], os.environ["GPULAYER_ATTEMPT"]
host = socket.gethostname()
ticks = open(os.path.join(os.environ["HOST_TMP"], f"ticks-{job}-{attempt}"), "a")
for i in range(int(sys.argv[1])):
    ticks.write(f"{time.time()}\\n"); ticks.flush()
    print("line", i, flush=True)
    time.sleep(0.2)
ticks.write(f"{time.time()}\\n"); ticks.flush()
urllib.request.urlopen(f"http://{sys.argv[2]}/effect/{job}/{attempt}/{host}", timeout=10).read()
print("done", flush=True)
"""

RESULT = """
import json, sys
import gpulayer as gl
conn = gl.connect()
info = conn.wait(sys.argv[1], timeout=float(sys.argv[2]))
json.dump({"state": info.state, "attempts": info.attempts, "reason": info.reason,
           "tasks": [[t.attempt, t.worker_name, t.state, t.reason] for t in info.tasks],
           "lines": [line.text for line in conn.follow_logs(info.id) if line.stream != "system"]},
          sys.stdout)
"""


@pytest.fixture(scope="module")
def effects(gl_hosts: Hosts, gl_laptop: Laptop) -> Iterator[str]:
    """A service on the laptop that records each request (the jobs' side effect)."""
    laptop = gl_hosts["laptop"]
    addr = f"{laptop.address}:{EFFECTS_PORT}"
    proc = laptop.spawn(["python", "-c", SERVICE, laptop.address, str(EFFECTS_PORT)],
                        label="effects")  # fmt: skip
    probe = f"import urllib.request; urllib.request.urlopen('http://{addr}/probe', timeout=2)"
    until(lambda: laptop.run(["python", "-c", probe], check=False).returncode == 0, 30,
          "the effects service")  # fmt: skip
    yield addr
    laptop.stop(proc)


def effects_of(laptop: Host, job: str) -> list[str]:
    path = laptop.outside(laptop.tmp / "effects.log")
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if line.startswith(f"/effect/{job}/")]


def ticks(host: Host, job: str, attempt: int) -> list[float]:
    path = host.outside(host.tmp / f"ticks-{job}-{attempt}")
    return [float(t) for t in path.read_text().split()] if path.exists() else []


def submit(laptop: Laptop, hosts: Hosts, effects: str, lines: int) -> tuple[str, Host]:
    """Submit the job with one retry; its id and the host it runs on, once it ticks."""
    host_tmp = str(laptop.host.tmp)  # the same path on every host, each its own folder
    argv = ["submit", "--retries", "1", "--env", f"HOST_TMP={host_tmp}", "-o", "json",
            "--", "python", "-c", JOB, str(lines), effects]  # fmt: skip
    job = json.loads(laptop.cli(*argv))["id"]

    def running_on() -> Host | None:
        return next((hosts[n] for n in WORKERS if ticks(hosts[n], job, 1)), None)

    return job, until(running_on, 60, f"job {job} to start")


def result(laptop: Laptop, job: str, timeout: float = 90) -> dict:
    code = RESULT
    out = laptop.host.run(["python", "-c", code, job, str(timeout)], env=laptop.env,
                          timeout=timeout + 30).stdout  # fmt: skip
    return json.loads(out)


def fault(host: Host, kind: str, on: bool) -> None:
    """``link``: the host's cable out; ``drop``: every packet between it and ctl dropped
    silently (the rest of the network still reachable)."""
    if kind == "link":
        host.link(not on)
        return
    ctl = "10.200.0.10"
    for rule in (["OUTPUT", "-d", ctl, "-j", "DROP"], ["INPUT", "-s", ctl, "-j", "DROP"]):
        host.iptables("-A" if on else "-D", *rule)


@pytest.fixture
def laptop(gl_laptop: Laptop, gl_mend: None) -> Laptop:
    """The laptop, with both workers ready; links and firewalls mended afterwards."""
    gl_laptop.ready()
    return gl_laptop


@pytest.mark.parametrize("kind", ["link", "drop"])
def test_a_partition_longer_than_the_lease_retries_elsewhere_once(gl_hosts, laptop, effects, kind):
    job, first = submit(laptop, gl_hosts, effects, lines=50)  # 10 s of work
    fault(first, kind, True)
    time.sleep(LEASE_SECONDS + 3)  # the partition
    fault(first, kind, False)
    got = result(laptop, job)
    assert got["state"] == "succeeded" and got["attempts"] == 2, got
    (a1, a2) = sorted(got["tasks"])
    assert a1[1] == first.name and a1[2] == "lost", a1
    second = gl_hosts[a2[1]]
    assert second is not first and a2[2] == "succeeded", a2
    # No overlap: the first attempt's process was gone before the second began.
    assert max(ticks(first, job, 1)) < min(ticks(second, job, 2)), (a1, a2)
    assert len(ticks(first, job, 1)) < 51  # stopped before the end of its work
    # The side effect happened once, from the retry.
    assert effects_of(laptop.host, job) == [f"/effect/{job}/2/{second.name}"]
    assert got["lines"][-1] == "done"
    # The partitioned worker rejoins.
    laptop.ready(first.name, timeout=45)


@pytest.mark.parametrize("kind", ["link", "drop"])
def test_a_partition_shorter_than_the_lease_changes_nothing(gl_hosts, laptop, effects, kind):
    job, host = submit(laptop, gl_hosts, effects, lines=30)  # 6 s of work
    fault(host, kind, True)
    time.sleep(1.5)  # the partition: well inside lease - 2 x heartbeat
    fault(host, kind, False)
    got = result(laptop, job)
    assert got["state"] == "succeeded" and got["attempts"] == 1, got
    assert got["lines"] == [f"line {i}" for i in range(30)] + ["done"], got["lines"]
    assert effects_of(laptop.host, job) == [f"/effect/{job}/1/{host.name}"]


ACKNOWLEDGED = """
import json, os, sys, time
import gpulayer as gl
conn = gl.connect()
print("connected", flush=True)
while not os.path.exists(sys.argv[1]):  # the test says when the control plane is away
    time.sleep(0.05)
job = gl.submit(["python", "-c", "print('acknowledged')"], retries=1, connection=conn)
print(json.dumps({"submitted": job.id, "at": time.time()}), flush=True)
info = conn.wait(job.id, timeout=120)
print(json.dumps({"state": info.state, "lines": job.logs(), "at": time.time()}), flush=True)
"""


def test_the_control_plane_cut_off_for_a_while_loses_nothing_acknowledged(
    gl_hosts, laptop, effects
):
    ctl = gl_hosts["ctl"]
    job, _ = submit(laptop, gl_hosts, effects, lines=10)  # 2 s: it ends while ctl is away
    go = laptop.host.tmp / "go"
    client = laptop.host.spawn(["python", "-c", ACKNOWLEDGED, str(go)], label="client",
                               env=laptop.env)  # fmt: skip
    until(lambda: "connected" in laptop.host.log("client"), 60, "the client to connect")
    ctl.link(False)
    cut = time.monotonic()
    # The client submits while the control plane is away: it waits, then is acknowledged.
    laptop.host.outside(go).touch()
    time.sleep(LEASE_SECONDS + 3)  # the control plane's host is unreachable
    assert client.poll() is None, laptop.host.log("client")
    assert "submitted" not in laptop.host.log("client")
    ctl.link(True)
    back, back_at = time.monotonic(), time.time()
    assert back - cut >= LEASE_SECONDS
    # Workers carry on within 30 s: both registered again and ready.
    laptop.ready(timeout=30)
    assert client.wait(timeout=30 - (time.monotonic() - back)) == 0, laptop.host.log("client")
    submitted, ended = (json.loads(x) for x in laptop.host.log("client").splitlines()[-2:])
    assert ended["state"] == "succeeded" and ended["lines"][-1] == "acknowledged", ended
    # The job acknowledged before the cut ran to its end, its effect once, all its lines.
    got = result(laptop, job)
    assert got["state"] == "succeeded", got
    assert got["lines"][-11:] == [f"line {i}" for i in range(10)] + ["done"], got["lines"]
    # Its side effect: once per attempt that ran (the first one may have finished
    # while its completion could not reach the control plane, which then retried it).
    done = effects_of(laptop.host, job)
    assert len(done) == len(set(done)) and f"/effect/{job}/{got['attempts']}/" in "".join(
        e + "/" for e in done
    ), (got, done)
    assert submitted["at"] >= back_at - 0.5  # the submit waited out the outage, not failed
