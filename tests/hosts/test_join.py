"""Join across hosts exactly as printed: ``gpulayer up --host 10.200.0.10`` on ctl (TLS
on, as off loopback), its two join lines run as they are on w1 and w2, and a user on
the laptop with ``gl.connect(...)``, the CLI and a notebook (nbclient, a real kernel)."""

import json
import re
import textwrap

from .conftest import WORKERS, Laptop, Plane


def test_up_prints_a_tls_url_and_join_lines_that_work_as_printed(gl_fleet: Plane, gl_laptop):
    ctl = gl_fleet.host
    assert gl_fleet.url == f"https://{ctl.address}:8765/", gl_fleet.printed
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", gl_fleet.fingerprint)
    token_line, join_line = gl_fleet.join_lines
    assert re.fullmatch(r"export GPULAYER_JOIN_TOKEN=gl_\S+", token_line), gl_fleet.printed
    assert join_line == f"gpulayer join {gl_fleet.url} --fingerprint {gl_fleet.fingerprint}"
    workers = gl_laptop.ready()
    for i, name in enumerate(WORKERS, start=1):
        w = workers[name]  # named after its host: the printed line sets no name
        assert w["hostname"] == name
        # The address its peers reach: found from the route to ctl, not given.
        assert w["address"] == f"10.200.0.{10 + i}", w
        assert gl_fleet.workers[name].poll() is None  # the printed lines still run


def test_each_worker_advertises_its_own_interface(gl_hosts, gl_fleet: Plane):
    for i, name in enumerate(WORKERS, start=1):
        log = gl_hosts[name].log("join")
        assert f"peers reach this worker at 10.200.0.{10 + i} (eth0)" in log, log


SUBMIT = """
import json, sys
import gpulayer as gl

conn = gl.connect({url!r}, token={token!r}, fingerprint={pin!r})
out = {{}}
for name in ("w1", "w2"):
    job = gl.submit(["hostname"], worker=name, connection=conn).wait(timeout=60)
    out[name] = [job.state, job.logs()]
json.dump(out, sys.stdout)
"""


def test_a_laptop_runs_jobs_on_both_hosts_with_gl_connect(gl_laptop: Laptop):
    plane = gl_laptop.plane
    code = SUBMIT.format(url=plane.url, token=gl_laptop.token, pin=plane.fingerprint)
    got = json.loads(gl_laptop.python(code))
    assert got["w1"][0] == "succeeded" and got["w1"][1][-1] == "w1", got
    assert got["w2"][0] == "succeeded" and got["w2"][1][-1] == "w2", got


def test_the_cli_on_the_laptop_submits_follows_and_lists(gl_laptop: Laptop):
    out = gl_laptop.cli("submit", "--worker", "w2", "-f", "--", "sh", "-c", "echo from $(hostname)")
    assert "from w2" in out, out
    jobs = json.loads(gl_laptop.cli("jobs", "-o", "json"))["jobs"]
    assert jobs, "the laptop's jobs are listed"


def test_a_worker_cannot_read_the_control_planes_files_by_path(gl_hosts, gl_laptop: Laptop):
    plane = gl_laptop.plane
    token_file = plane.data_dir / "admin.token"
    assert plane.host.run(["test", "-s", str(token_file)]).returncode == 0  # there on ctl
    assert plane.host.outside(token_file).exists()  # and where the test looks for it
    for name in ("w1", "laptop"):
        done = gl_hosts[name].run(["cat", str(token_file)], check=False)
        assert done.returncode != 0 and "No such file" in done.stderr, (name, done)
    done = gl_laptop.cli_run("submit", "--worker", "w1", "-f", "--", "cat", str(token_file))
    assert done.returncode == 1 and "No such file" in done.stderr, done
    # Each host has its own HOME and temp dir at the same path, holding its own files
    # (and its own /tmp, unless the checkout or Python lives there: the harness says).
    for host in gl_hosts:
        dirs = ["$HOME", "$TMPDIR"] + (["/tmp"] if host.private_tmp else [])
        host.run(["sh", "-c", "; ".join(f"echo {host.name} > {d}/whose" for d in dirs)])
    for host in gl_hosts:
        dirs = ["$HOME", "$TMPDIR"] + (["/tmp"] if host.private_tmp else [])
        got = host.run(["sh", "-c", "cat " + " ".join(f"{d}/whose" for d in dirs)]).stdout.split()
        assert got == [host.name] * len(dirs), (host.name, dirs, got)


NOTEBOOK = """
import json, sys
import nbformat
from nbclient import NotebookClient

nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell(s) for s in {cells!r}]
NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout=120).execute()
json.dump([[o.get("text", o.get("evalue", "")) for o in c.outputs] for c in nb.cells], sys.stdout)
"""


def test_a_notebook_on_the_laptop_runs_cells_on_the_workers(gl_laptop: Laptop):
    plane = gl_laptop.plane
    cells = [
        "import gpulayer as gl\n"
        f"gl.connect({plane.url!r}, token={gl_laptop.token!r}, fingerprint={plane.fingerprint!r})",
        "%load_ext gpulayer",
        "%%gpulayer --worker w1\nimport socket\nprint('cell on', socket.gethostname())",
        "%%gpulayer --worker w2\nimport socket\nprint('cell on', socket.gethostname())",
    ]
    code = textwrap.dedent(NOTEBOOK).format(cells=cells)
    outs = json.loads(gl_laptop.python(code, timeout=180))
    text = ["".join(o) for o in outs]
    assert "cell on w1" in text[2], outs
    assert "cell on w2" in text[3], outs
