"""A whole notebook on a gpulayer kernel, in Chromium (docs/kernels.md, issue 21).

JupyterLab runs the control plane and one worker with two simulated A100s; the
kernelspec ``gl-1gpu`` is installed by ``gpulayer kernel install --prefix`` into a
data dir on Lab's JUPYTER_PATH. The user picks it in the launcher, and everything
after that is the page: the notebook talks to 127.0.0.1 ports of the Lab server,
whose provisioner relays them to an ipykernel on the worker. The provisioner finds
the control plane inside its own Lab server (its URL and Jupyter token): Lab's
environment holds no gpulayer URL or token.
"""

import re
import socket
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect

from gpulayer import contracts
from gpulayer.cluster import LocalCluster

TIMEOUT_MS = 30_000
KERNEL = "Python 3 (gpulayer, 1 GPU)"


def kernel_jobs(cluster: LocalCluster) -> list[contracts.Job]:
    """The gpulayer kernels' jobs (relay sessions)."""
    with cluster.connection() as conn:
        return [j for j in conn.jobs() if "gpulayer.dev/kernel" in j.spec.labels]


def kernel_job(cluster: LocalCluster) -> contracts.Job:
    """The running job of the one gpulayer kernel."""
    (job,) = [j for j in kernel_jobs(cluster) if j.state == "running"]
    return job


class NotebookPage:
    """Locators of Lab's launcher and the open notebook (the test's page object)."""

    def __init__(self, page: Page, cluster: LocalCluster, shots: Path) -> None:
        self.page = page
        self.cluster = cluster
        self.shots = shots
        self.notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        self.cells = self.notebook.locator(".jp-Notebook .jp-Cell")
        # "Python 3 (gpulayer, 1 GPU) | Idle", the kernel's name and state in the status bar
        self.kernel_status = page.locator('#jp-main-statusbar [title^="Change kernel for"]')

    def open_launcher(self) -> None:
        self.page.goto(f"{self.cluster.url}lab?reset&token={self.cluster.jupyter_token}")
        self.page.locator(".jp-Launcher").wait_for(state="visible", timeout=TIMEOUT_MS)

    def launch(self, display_name: str) -> None:
        """Click the kernel's card in the launcher's Notebook section; wait until idle."""
        card = self.page.locator('.jp-LauncherCard[data-category="Notebook"]').filter(
            has=self.page.get_by_text(display_name, exact=True)
        )
        card.click()
        self.notebook.wait_for(state="visible", timeout=TIMEOUT_MS)
        self.until_idle(timeout=60_000)

    def hide_file_browser(self) -> None:
        """Collapse the left sidebar: the notebook gets the screenshot's width."""
        self.page.locator('.jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id="filebrowser"]').click()
        expect(self.page.locator("#filebrowser")).to_be_hidden()

    def until_idle(self, timeout: int = TIMEOUT_MS) -> None:
        expect(self.kernel_status).to_contain_text("Idle", timeout=timeout)

    def run(self, code: str) -> Locator:
        """Type ``code`` into the last cell, run it (Shift+Enter); that cell."""
        cell = self.cells.nth(self.cells.count() - 1)  # pinned: running appends a cell
        cell.locator(".cm-content").click()
        self.page.keyboard.insert_text(code)
        self.page.keyboard.press("Shift+Enter")
        return cell

    def output(self, cell: Locator) -> Locator:
        return cell.locator(".jp-OutputArea-output")

    def screenshot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def gl_notebook(gl_page: Page, gl_kernel_lab: LocalCluster, gl_screenshots: Path) -> NotebookPage:
    """The page with Lab's launcher showing."""
    page = NotebookPage(gl_page, gl_kernel_lab, gl_screenshots)
    page.open_launcher()
    return page


def test_a_notebook_runs_on_a_gpulayer_kernel(gl_notebook: NotebookPage) -> None:
    nb, page = gl_notebook, gl_notebook.page
    nb.launch(KERNEL)
    nb.hide_file_browser()
    expect(nb.kernel_status).to_contain_text(KERNEL)

    # the cell runs on the worker, with the GPU the kernel reserved
    where = nb.run(
        "import os, socket\n"
        'print("CUDA_VISIBLE_DEVICES =", os.environ["CUDA_VISIBLE_DEVICES"])\n'
        'print("worker host =", socket.gethostname(), "| job", os.environ["GPULAYER_JOB_ID"])'
    )
    expect(nb.output(where)).to_contain_text(
        re.compile(r"CUDA_VISIBLE_DEVICES = [01]\n"), timeout=TIMEOUT_MS
    )
    job = kernel_job(nb.cluster)
    assert job.worker_name == "local-1"
    expect(nb.output(where)).to_contain_text(f"worker host = {socket.gethostname()} | job {job.id}")

    # a widget made by the remote kernel; the slider moved in the page moves its value
    # there, and the kernel's observer answers through a label (comms both ways)
    slider = nb.run(
        "import ipywidgets as widgets\n"
        "seen = []\n"
        'slider = widgets.IntSlider(value=5, max=20, description="on the GPU")\n'
        'echo = widgets.Label("remote value: 5")\n'
        "def record(change):\n"
        '    seen.append(change["new"])\n'
        "    echo.value = f\"remote value: {change['new']}\"\n"
        'slider.observe(record, names="value")\n'
        "widgets.VBox([slider, echo])"
    )
    handle = slider.locator(".widget-slider .noUi-handle")
    expect(handle).to_be_visible(timeout=TIMEOUT_MS)
    handle.focus()
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    expect(slider.locator(".widget-readout")).to_have_text("8")
    expect(slider.locator(".widget-label", has_text="remote value")).to_have_text(
        "remote value: 8", timeout=TIMEOUT_MS
    )
    check = nb.run('print("remote value:", slider.value, "| last seen:", seen[-1])')
    expect(nb.output(check)).to_have_text("remote value: 8 | last seen: 8\n", timeout=TIMEOUT_MS)

    # the toolbar's interrupt stops a busy loop on the worker
    busy = nb.run("while True:\n    pass")
    expect(nb.kernel_status).to_contain_text("Busy", timeout=TIMEOUT_MS)
    nb.notebook.locator('.jp-Toolbar [data-jp-item-name="interrupt"] jp-button').click()
    expect(nb.output(busy)).to_contain_text("KeyboardInterrupt", timeout=TIMEOUT_MS)
    nb.until_idle()
    nb.screenshot("gpulayer-kernel")

    # restart from the Kernel menu: a new kernel, the old variables gone, and it works
    page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Restart Kernel…$")).click()
    page.locator(".jp-Dialog .jp-mod-accept").click()
    nb.until_idle(timeout=60_000)
    after = nb.run('print("slider" in globals(), 6 * 7)')
    expect(nb.output(after)).to_have_text("False 42\n", timeout=TIMEOUT_MS)
    # the restart placed a new kernel job and ended the old one: one GPU held, not two
    states = {j.id: j.state for j in kernel_jobs(nb.cluster)}
    assert states.pop(job.id) in ("succeeded", "cancelled"), states
    assert list(states.values()) == ["running"], states
    expect(page.locator(".gpulayer-status-item")).to_have_text("GPUs 1/2", timeout=TIMEOUT_MS)
    nb.screenshot("gpulayer-kernel-restarted")
