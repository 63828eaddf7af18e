"""The sidebar against a real JupyterLab, a real worker and real jobs, in Chromium."""

import time

from playwright.sync_api import expect

from gpulayer import contracts
from gpulayer.client import Connection

TIMEOUT_MS = 30_000

# Steps 0-3, then wait (at most 60 s) until the test has seen the job running
# and creates the gate file, then steps 4-7: no race with a slow machine. Each
# step also writes a training metric point, as a Trainer would.
STEPS = """
import json, os, sys, time
for i in range(8):
    if i == 4:
        deadline = time.monotonic() + 60
        while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
            time.sleep(0.05)
    print(f"step {i}", flush=True)
    with open(os.environ["GPULAYER_METRICS_FILE"], "a") as f:
        point = {"step": i, "ts": time.time(), "metrics": {"train/loss": 1 / (i + 1)}}
        f.write(json.dumps(point) + "\\n")
    time.sleep(0.1)
"""


def submit(cluster, **spec) -> contracts.Job:
    with cluster.connection() as conn:
        return conn.submit(contracts.JobSpec(**spec))


def job_state(cluster, job_id: str) -> str:
    with cluster.connection() as conn:
        return conn.job(job_id).state.value


def until_state(cluster, job_id: str, state: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (got := job_state(cluster, job_id)) != state:
        assert time.monotonic() < deadline, f"job {job_id} is {got}, not {state}"
        time.sleep(0.1)


def test_the_panel_lists_the_worker_with_its_gpus(gl_sidebar):
    worker = gl_sidebar.worker("local-1")
    expect(worker).to_be_visible(timeout=TIMEOUT_MS)
    expect(worker.locator(".gpulayer-state")).to_have_text("ready")
    gpus = worker.locator(".gpulayer-gpu")
    expect(gpus).to_have_count(2)
    expect(gpus.first).to_contain_text("GPU 0: NVIDIA A100 (simulated)")
    expect(gpus.first).to_contain_text("80.0GiB")
    # simulated GPUs report no readings, and the bar says so rather than showing 0 %
    expect(gpus.first.locator(".gpulayer-bar").first).to_contain_text("no reading")
    expect(gl_sidebar.panel.locator(".gpulayer-gpu-summary")).to_have_text("GPUs 0/2 busy")
    expect(gl_sidebar.page.locator(".gpulayer-status-item")).to_have_text("GPUs 0/2")
    gl_sidebar.screenshot("workers")


def test_a_submitted_job_appears_and_its_logs_stream_into_the_view(gl_sidebar, gl_shared_dir):
    gate = gl_shared_dir / "gate"
    job = submit(
        gl_sidebar.cluster,
        name="steps",
        command=["python", "-c", STEPS, str(gate)],
        resources={"gpus": 1},
    )
    row = gl_sidebar.job_row(job.id)
    expect(row).to_be_visible(timeout=TIMEOUT_MS)
    expect(row.locator(".gpulayer-job-name")).to_have_text("steps")
    view = gl_sidebar.open_job(job.id)
    lines = view.locator(".gpulayer-log-line")
    # the first lines arrive while the job still runs: the view follows the log live
    expect(lines.filter(has_text="step 1")).to_have_count(1, timeout=TIMEOUT_MS)
    assert job_state(gl_sidebar.cluster, job.id) == "running"
    expect(gl_sidebar.page.locator(".gpulayer-status-item")).to_have_text("GPUs 1/2")
    # the chart of the task's readings (CPU, memory) is drawn while it runs
    readings = view.locator("section:not(.gpulayer-training) .gpulayer-chart canvas")
    expect(readings).to_have_count(1, timeout=TIMEOUT_MS)
    # and the training metrics it writes get a chart of their own, over steps
    training = view.locator(".gpulayer-training")
    expect(training.locator(".gpulayer-chart canvas")).to_have_count(1, timeout=TIMEOUT_MS)
    expect(training).to_contain_text("train/loss")
    gl_sidebar.screenshot("job-running")
    gate.touch()
    expect(lines.filter(has_text="step 7")).to_have_count(1, timeout=TIMEOUT_MS)
    expect(view.locator(".gpulayer-state").first).to_have_text("succeeded", timeout=TIMEOUT_MS)
    expect(view.locator(".gpulayer-logs-status")).to_have_attribute(
        "data-complete", "true", timeout=TIMEOUT_MS
    )
    texts = lines.all_inner_texts()
    assert [t for t in texts if t.startswith("step")] == [f"step {i}" for i in range(8)]
    assert texts[0].startswith("started on local-1 (GPU ")
    gl_sidebar.screenshot("job-succeeded")


def test_artifacts_are_download_links(gl_sidebar):
    job = submit(
        gl_sidebar.cluster,
        name="writer",
        shell='cd "$GPULAYER_ARTIFACTS" && mkdir out && echo 42 > out/answer.txt',
    )
    expect(gl_sidebar.job_row(job.id)).to_be_visible(timeout=TIMEOUT_MS)
    view = gl_sidebar.open_job(job.id)
    link = view.locator(".gpulayer-artifacts a")
    expect(link).to_have_text("out/answer.txt", timeout=TIMEOUT_MS)
    # the link works with the Lab session's own cookie, as a click in the browser would
    answer = gl_sidebar.page.request.get(link.get_attribute("href"))
    assert answer.status == 200
    assert answer.text() == "42\n"


def test_the_owner_filter(gl_sidebar):
    with gl_sidebar.cluster.connection() as conn:
        bob = conn.create_token(contracts.CreateToken(name="bob", role="submitter"))
    with Connection(gl_sidebar.cluster.url, bob.token) as as_bob:
        theirs = as_bob.submit(contracts.JobSpec(name="bobs-job", command=["true"]))
    mine = submit(gl_sidebar.cluster, name="admins-job", command=["true"])
    jobs = gl_sidebar.panel.locator(".gpulayer-job")
    expect(gl_sidebar.job_row(mine.id)).to_be_visible(timeout=TIMEOUT_MS)
    expect(gl_sidebar.job_row(theirs.id)).to_be_visible(timeout=TIMEOUT_MS)
    gl_sidebar.panel.locator(".gpulayer-filter-owner").select_option("bob")
    expect(jobs).to_have_count(1, timeout=TIMEOUT_MS)
    expect(jobs.first).to_have_attribute("data-job-id", theirs.id)
    gl_sidebar.panel.locator(".gpulayer-filter-owner").select_option("")
    expect(gl_sidebar.job_row(mine.id)).to_be_visible(timeout=TIMEOUT_MS)


def test_cancel_from_the_button(gl_sidebar):
    job = submit(gl_sidebar.cluster, name="sleeper", command=["sleep", "60"])
    until_state(gl_sidebar.cluster, job.id, "running")
    row = gl_sidebar.job_row(job.id)
    expect(row).to_have_attribute("data-state", "running", timeout=TIMEOUT_MS)
    row.locator(".gpulayer-cancel").click()
    expect(row).to_have_attribute("data-state", "cancelled", timeout=TIMEOUT_MS)
    with gl_sidebar.cluster.connection() as conn:
        done = conn.job(job.id)
    assert done.state == "cancelled"
    assert done.reason and done.reason.startswith("cancelled by ")
    # an ended job offers no cancel button any more
    expect(row.locator(".gpulayer-cancel")).to_have_count(0)


def test_cancel_from_the_job_view(gl_sidebar):
    job = submit(gl_sidebar.cluster, name="sleeper-2", command=["sleep", "60"])
    until_state(gl_sidebar.cluster, job.id, "running")
    expect(gl_sidebar.job_row(job.id)).to_be_visible(timeout=TIMEOUT_MS)
    view = gl_sidebar.open_job(job.id)
    view.locator(".gpulayer-cancel").click()
    expect(view).to_have_attribute("data-state", "cancelled", timeout=TIMEOUT_MS)
    assert job_state(gl_sidebar.cluster, job.id) == "cancelled"


def test_a_pending_job_shows_why_it_waits(gl_sidebar):
    job = submit(gl_sidebar.cluster, name="too-big", command=["true"], resources={"gpus": 4})
    row = gl_sidebar.job_row(job.id)
    expect(row).to_have_attribute("data-state", "queued", timeout=TIMEOUT_MS)
    view = gl_sidebar.open_job(job.id)
    reasons = view.locator(".gpulayer-pending-reason")
    expect(reasons).to_have_count(1, timeout=TIMEOUT_MS)
    expect(reasons.first).to_contain_text("local-1: needs 4 × GPU")
    gl_sidebar.screenshot("job-pending")
    # the list filters by state on the server
    gl_sidebar.panel.locator(".gpulayer-filter-state").select_option("queued")
    expect(gl_sidebar.panel.locator(".gpulayer-job")).to_have_count(1, timeout=TIMEOUT_MS)
    expect(gl_sidebar.panel.locator(".gpulayer-job").first).to_have_attribute("data-job-id", job.id)
    gl_sidebar.panel.locator(".gpulayer-filter-state").select_option("")
    gl_sidebar.page.locator("#jp-left-stack").screenshot(path=str(gl_sidebar.shots / "sidebar.png"))
