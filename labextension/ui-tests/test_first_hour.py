"""What a new user meets in the sidebar (issue 22): a job that can never run says so,
the tab has its own icon and the documented tooltip, a long owner name stays inside
the panel, cell jobs have readable names, and training charts have a log scale."""

import time
from pathlib import Path

from playwright.sync_api import expect

from gpulayer import contracts
from gpulayer.client import Connection

TIMEOUT_MS = 30_000
ROOT = Path(__file__).resolve().parents[2]
CAPTION = "GPU layer: workers and jobs"

# A loss that falls over four decades, as a good run's does.
FALLING_LOSS = """
import json, os, time
with open(os.environ["GPULAYER_METRICS_FILE"], "a") as f:
    for i in range(8):
        point = {"step": i, "ts": time.time(), "metrics": {"train/loss": 10.0 ** (1 - i / 2)}}
        f.write(json.dumps(point) + "\\n")
"""


def submit(cluster, **spec) -> contracts.Job:
    with cluster.connection() as conn:
        return conn.submit(contracts.JobSpec(**spec))


def cancel(cluster, job_id: str) -> None:
    with cluster.connection() as conn:
        conn.cancel(job_id)


def until_ended(cluster, job_id: str, timeout: float = 60.0) -> contracts.Job:
    deadline = time.monotonic() + timeout
    with cluster.connection() as conn:
        while not (info := conn.job(job_id)).state.terminal:
            assert time.monotonic() < deadline, f"job {job_id} is still {info.state}"
            time.sleep(0.1)
    return info


def test_an_unsatisfiable_job_card_says_it_cannot_start_and_what_to_do(gl_sidebar):
    # local-1 has 2 GPUs: a job that needs 4 can never run there
    job = submit(gl_sidebar.cluster, name="needs-four", command=["true"], resources={"gpus": 4})
    row = gl_sidebar.job_row(job.id)
    expect(row).to_have_attribute("data-unsatisfiable", "true", timeout=TIMEOUT_MS)
    expect(row).to_have_attribute("data-state", "queued")
    expect(row.locator(".gpulayer-state")).to_have_text("unsatisfiable")
    reason = row.locator(".gpulayer-job-reason")
    expect(reason).to_contain_text("cannot start: unsatisfiable: no registered worker")
    expect(reason).to_contain_text("join a worker that has them")
    expect(reason).not_to_contain_text("waiting for placement")
    # the job's view says the same, with the per-worker reasons
    view = gl_sidebar.open_job(job.id)
    expect(view.locator(".gpulayer-job-reason")).to_contain_text("cannot start: unsatisfiable")
    expect(view.locator(".gpulayer-pending-reason")).to_contain_text("local-1: needs 4 × GPU")
    gl_sidebar.screenshot("job-unsatisfiable")
    cancel(gl_sidebar.cluster, job.id)
    expect(row).to_have_attribute("data-state", "cancelled", timeout=TIMEOUT_MS)
    expect(row).to_have_attribute("data-unsatisfiable", "false")


def test_the_tab_has_its_own_icon_and_the_tooltip_the_docs_name(gl_sidebar):
    tab = gl_sidebar.page.locator('.jp-SideBar [data-id="gpulayer-sidebar"]')
    expect(tab).to_have_attribute("title", CAPTION)
    expect(tab.locator('svg[data-icon="gpulayer:chip"]')).to_have_count(1)
    # not Lab's "running" icon, which its Running panel's tab shows right beside it
    running = gl_sidebar.page.locator('.jp-SideBar [data-id="jp-running-sessions"] svg')
    expect(running).to_have_attribute("data-icon", "ui-components:running")
    assert CAPTION in (ROOT / "docs" / "user-guide.md").read_text()
    # the job views' tabs carry it too
    job = submit(gl_sidebar.cluster, name="icon-check", command=["true"])
    expect(gl_sidebar.job_row(job.id)).to_be_visible(timeout=TIMEOUT_MS)
    gl_sidebar.open_job(job.id)
    main_tab = gl_sidebar.page.locator(".jp-MainAreaWidget-tab, #jp-main-dock-panel .lm-TabBar-tab")
    expect(
        main_tab.filter(has_text="icon-check").locator('svg[data-icon="gpulayer:chip"]')
    ).to_have_count(1)
    gl_sidebar.page.locator('.jp-SideBar [data-id="gpulayer-sidebar"]').screenshot(
        path=str(gl_sidebar.shots / "sidebar-tab.png")
    )


def _inside(inner, outer) -> None:
    a, b = inner.bounding_box(), outer.bounding_box()
    assert a is not None and b is not None
    assert a["x"] >= b["x"] - 0.5 and a["x"] + a["width"] <= b["x"] + b["width"] + 0.5, (a, b)


def test_a_32_character_owner_keeps_the_owner_filter_inside_the_panel(gl_sidebar):
    owner = "a-research-team-with-a-long-name"
    assert len(owner) == 32
    with gl_sidebar.cluster.connection() as conn:
        token = conn.create_token(contracts.CreateToken(name=owner, role="submitter"))
    with Connection(gl_sidebar.cluster.url, token.token) as theirs:
        job = theirs.submit(contracts.JobSpec(name="theirs", command=["true"]))
    row = gl_sidebar.job_row(job.id)
    expect(row).to_be_visible(timeout=TIMEOUT_MS)
    panel = gl_sidebar.panel
    select = panel.locator(".gpulayer-filter-owner")
    expect(select.locator(f'option[value="{owner}"]')).to_have_count(1, timeout=TIMEOUT_MS)

    def fits() -> None:
        _inside(select, panel)
        _inside(panel.locator(".gpulayer-filter-state"), panel)
        _inside(row.locator(".gpulayer-job-owner"), row)
        # nothing in the panel is wider than the panel: no sideways scrolling
        assert panel.evaluate("e => e.scrollWidth <= e.clientWidth"), "the panel overflows"

    fits()  # with the long name among the options
    select.select_option(owner)
    expect(panel.locator(".gpulayer-job")).to_have_count(1, timeout=TIMEOUT_MS)
    fits()  # and with it chosen
    # the full name is one hover away
    expect(select).to_have_attribute("title", owner)
    expect(row.locator(".gpulayer-job-owner")).to_have_attribute("title", owner)
    gl_sidebar.page.locator("#jp-left-stack").screenshot(
        path=str(gl_sidebar.shots / "sidebar-long-owner.png")
    )
    select.select_option("")


def test_cell_jobs_are_listed_by_session_and_first_line(gl_sidebar):
    source = "\n# warm up the data loader\nimport time\ntime.sleep(0.1)\n"
    job = submit(gl_sidebar.cluster, kind="cell", cell={"source": source})
    row = gl_sidebar.job_row(job.id)
    expect(row.locator(".gpulayer-job-name")).to_have_text(
        "cell: # warm up the data loader", timeout=TIMEOUT_MS
    )
    expect(row.locator(".gpulayer-job-name")).not_to_contain_text(job.id)
    view = gl_sidebar.open_job(job.id)
    expect(view.locator("h2")).to_have_text("cell: # warm up the data loader")
    # and Lab's tab for it reads the same
    tab = gl_sidebar.page.locator("#jp-main-dock-panel .lm-TabBar-tab").filter(
        has_text="cell: # warm up the data loader"
    )
    expect(tab).to_have_count(1, timeout=TIMEOUT_MS)


def test_the_training_chart_has_a_log_scale_toggle(gl_sidebar):
    job = submit(gl_sidebar.cluster, name="falling-loss", command=["python", "-c", FALLING_LOSS])
    assert until_ended(gl_sidebar.cluster, job.id).state == "succeeded"
    expect(gl_sidebar.job_row(job.id)).to_be_visible(timeout=TIMEOUT_MS)
    view = gl_sidebar.open_job(job.id)
    training = view.locator(".gpulayer-training")
    chart = training.locator(".gpulayer-chart")
    expect(chart.locator("canvas")).to_have_count(1, timeout=TIMEOUT_MS)
    toggle = training.locator(".gpulayer-log-scale input")
    # four decades of loss: on a log scale from the start, so the tail is not a flat line
    expect(toggle).to_be_checked()
    expect(chart).to_have_attribute("data-scale", "log")
    log_png = chart.locator("canvas").screenshot()
    training.screenshot(path=str(gl_sidebar.shots / "training-log.png"))
    toggle.uncheck()
    expect(chart).to_have_attribute("data-scale", "linear")
    expect(chart.locator("canvas")).to_have_count(1)
    linear_png = chart.locator("canvas").screenshot()
    assert linear_png != log_png, "the chart did not redraw on the other scale"
    training.screenshot(path=str(gl_sidebar.shots / "training-linear.png"))
    toggle.check()
    expect(chart).to_have_attribute("data-scale", "log")
