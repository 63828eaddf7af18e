"""Provider instances in the sidebar: a JupyterLab whose control plane has no worker,
only a ``simulated`` provider (a cloud's shape: an offer with a price and a slow
boot). A GPU job's card says what is being provisioned for it; the Instances section
follows the instance from provisioning to ready, with its cost, then to gone once idle.
"""

import re

from playwright.sync_api import expect

from gpulayer import contracts

TIMEOUT_MS = 30_000


def test_a_gpu_job_shows_its_instance_from_provisioning_to_gone(gl_cloud_sidebar):
    sidebar = gl_cloud_sidebar
    with sidebar.cluster.connection() as conn:
        spec = contracts.JobSpec(name="needs-a-gpu", command=["true"], resources={"gpus": 1})
        job = conn.submit(spec)
    row = sidebar.job_row(job.id)
    note = row.locator(".gpulayer-job-reason.gpulayer-mod-provisioning")
    expect(note).to_contain_text("provisioning: ", timeout=TIMEOUT_MS)
    expect(note).to_contain_text(" on cloud)")
    section = sidebar.panel.locator(".gpulayer-instances-section")
    instance = section.locator(".gpulayer-instance")
    expect(instance).to_have_count(1, timeout=TIMEOUT_MS)
    expect(instance.locator(".gpulayer-state")).to_have_text(
        re.compile("provisioning|booting"), timeout=TIMEOUT_MS
    )
    expect(instance.locator(".gpulayer-instance-meta")).to_contain_text("cloud · a100 · 1 GPU")
    # the job view says the same while it waits
    view = sidebar.open_job(job.id)
    expect(view.locator(".gpulayer-mod-provisioning")).to_contain_text("provisioning: ")
    sidebar.page.locator("#jp-left-stack").screenshot(path=str(sidebar.shots / "instances.png"))
    expect(row).to_have_attribute("data-state", "succeeded", timeout=60_000)
    expect(note).to_have_count(0)
    expect(instance.locator(".gpulayer-instance-meta")).to_contain_text("($3.60/h)")
    # idle for idle_timeout: terminated; the section keeps it, gone, with why
    expect(instance).to_have_attribute("data-state", "gone", timeout=60_000)
    expect(instance.locator(".gpulayer-instance-note")).to_contain_text("idle for")
