"""Browser tests: a real JupyterLab with gpulayer inside, a real worker, Debian's Chromium.

Run them on their own (they must not share a process with pytest-jupyter, whose
event loop breaks Playwright's sync API)::

    python -m pytest labextension/ui-tests

The JupyterLab server is ``LocalCluster(server_module="jupyterlab")``: the
control plane runs inside Lab as it does for users, and ``gpulayer join`` runs a
worker with two simulated GPUs. Lab loads the sidebar this checkout built
(``jupyter_ext/labextension``). Screenshots go to ``$GPULAYER_SCREENSHOTS`` or
``test-artifacts/screenshots/``. Without a ``chromium`` on PATH the tests skip.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from gpulayer.cli import main as cli_main
from gpulayer.cluster import LocalCluster, free_port

ROOT = Path(__file__).resolve().parents[2]
BUILT = ROOT / "jupyter_ext" / "labextension"
CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-dev-shm-usage",
    # keep Chromium from calling out to the internet
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def chromium() -> str | None:
    """The browser Playwright drives (Debian's package; Playwright downloads none)."""
    return os.environ.get("CHROMIUM_BIN") or shutil.which("chromium")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip every browser test, with the reason, when there is no Chromium here
    (CI sets GPULAYER_REQUIRE_BROWSER=1, which makes that an error instead)."""
    if chromium() is None and os.environ.get("GPULAYER_REQUIRE_BROWSER") == "1":
        raise pytest.UsageError("GPULAYER_REQUIRE_BROWSER=1 but there is no chromium on PATH")
    if chromium() is None:
        skip = pytest.mark.skip(reason="no chromium on PATH (apt-get install -y chromium)")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gl_screenshots() -> Path:
    """Where the tests save their screenshots (printed at the end of the run)."""
    out = Path(os.environ.get("GPULAYER_SCREENSHOTS", ROOT / "test-artifacts" / "screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def pytest_terminal_summary(terminalreporter) -> None:
    """Print where the screenshots are."""
    out = os.environ.get("GPULAYER_SCREENSHOTS", str(ROOT / "test-artifacts" / "screenshots"))
    terminalreporter.write_line(f"gpulayer browser-test screenshots: {out}")


def _lab_env(base: Path, data_dirs: Sequence[Path] = ()) -> dict[str, str]:
    """Isolated Lab settings (no news toast), this checkout's built sidebar first, then
    ``data_dirs`` on JUPYTER_PATH (kernelspecs a test installed)."""
    settings = base / "lab-settings"
    notes = settings / "@jupyterlab" / "apputils-extension"
    notes.mkdir(parents=True)
    (notes / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    env = {
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(base / "lab-workspaces"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "JUPYTER_CONFIG_DIR": str(base / "config"),
    }
    path = [str(d) for d in data_dirs]
    if (BUILT / "package.json").exists():
        data = base / "jupyter-data"
        (data / "labextensions").mkdir(parents=True)
        (data / "labextensions" / "gpulayer").symlink_to(BUILT, target_is_directory=True)
        path.insert(0, str(data))
    if path:
        env["JUPYTER_PATH"] = os.pathsep.join(
            p for p in (*path, os.environ.get("JUPYTER_PATH", "")) if p
        )
    return env


def start_lab(
    base: Path, *, workers: int, server_args: list[str], data_dirs: Sequence[Path] = ()
) -> LocalCluster:
    """JupyterLab (with the control plane) and ``workers`` simulated-GPU workers;
    Lab also looks in ``data_dirs`` (Jupyter data dirs: kernelspecs)."""
    base.mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(
        base / "cluster",
        workers=workers,
        slots=2,
        simulated_gpus="2xA100-80GB",
        heartbeat_seconds=0.5,
        lease_seconds=10.0,
        env=_lab_env(base, data_dirs),
        server_module="jupyterlab",
        server_args=["--LabApp.extension_manager=readonly", *server_args],
    )
    return cluster.start()


@pytest.fixture
def gl_shared_dir() -> Iterator[Path]:
    """A folder jobs may read and write (0777): as root the worker runs them as the
    unprivileged ``gpulayer-task``, which cannot enter ``tmp_path`` (tests/conftest.py)."""
    path = Path(tempfile.mkdtemp(prefix="gl-shared-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def gl_lab(tmp_path_factory) -> Iterator[LocalCluster]:
    """JupyterLab with gpulayer and one worker named ``local-1`` with 2 simulated A100s."""
    cluster = start_lab(tmp_path_factory.mktemp("lab"), workers=1, server_args=[])
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def gl_kernel_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """JupyterLab with gpulayer, one worker (``local-1``, 2 simulated A100s) and the
    gpulayer kernelspec ``gl-1gpu`` (1 GPU) installed by ``gpulayer kernel install
    --prefix`` where Lab finds it. Lab gets no gpulayer URL, token or saved
    connection: its kernels must find the control plane inside Lab itself."""
    base = tmp_path_factory.mktemp("kernel-lab")
    prefix = base / "kernels"
    assert cli_main(["kernel", "install", "--name", "gl-1gpu", "--gpus", "1",
                     "--prefix", str(prefix)]) == 0  # fmt: skip
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GPULAYER_CONFIG", str(base / "no-saved-connection.json"))
        env.delenv("GPULAYER_URL", raising=False)
        env.delenv("GPULAYER_TOKEN", raising=False)
        cluster = start_lab(
            base, workers=1, server_args=[], data_dirs=[prefix / "share" / "jupyter"]
        )
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def gl_browser():
    """One headless Chromium for the session."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def gl_page(gl_browser):
    """A fresh page (its own cookies) that fails the test on uncaught page errors."""
    context = gl_browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


class SidebarPage:
    """Locators of the gpulayer sidebar and job views (the tests' page object)."""

    def __init__(self, page, cluster: LocalCluster, shots: Path) -> None:
        self.page = page
        self.cluster = cluster
        self.shots = shots
        self.panel = page.locator("#gpulayer-sidebar")

    def open(self) -> None:
        """Load Lab with Jupyter's token and show the gpulayer panel."""
        # `reset`: the default layout, whatever an earlier test left in the workspace
        self.page.goto(f"{self.cluster.url}lab?reset&token={self.cluster.jupyter_token}")
        tab = self.page.locator('.jp-SideBar [data-id="gpulayer-sidebar"]')
        tab.wait_for(state="visible")
        self.page.locator("#jp-main-dock-panel").wait_for(state="visible")
        if "lm-mod-current" not in (tab.get_attribute("class") or ""):
            tab.click()
        self.panel.wait_for(state="visible")

    def worker(self, name: str):
        return self.panel.locator(f'.gpulayer-worker[data-worker="{name}"]')

    def job_row(self, job_id: str):
        return self.panel.locator(f'.gpulayer-job[data-job-id="{job_id}"]')

    def job_view(self, job_id: str):
        return self.page.locator(f'.gpulayer-job-view-body[data-job-id="{job_id}"]')

    def open_job(self, job_id: str):
        self.job_row(job_id).locator(".gpulayer-job-open").click()
        view = self.job_view(job_id)
        view.wait_for(state="visible")
        return view

    def screenshot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path


@pytest.fixture
def gl_sidebar(gl_page, gl_lab, gl_screenshots) -> SidebarPage:
    """The page with Lab loaded and the gpulayer panel open."""
    sidebar = SidebarPage(gl_page, gl_lab, gl_screenshots)
    sidebar.open()
    return sidebar


#: A cloud's shape with no worker: one offer with a price and a slow boot (test_instances.py).
CLOUD_PROVIDERS = """
[providers.cloud]
kind = "simulated"
idle_timeout = 3
[[providers.cloud.offers]]
name = "a100"
gpus = "1xA100-80GB"
price_per_hour = 3.6
boot_seconds = 6
"""


@pytest.fixture(scope="module")
def gl_cloud_lab(tmp_path_factory) -> Iterator[LocalCluster]:
    """JupyterLab with gpulayer, no worker, and one simulated provider ``cloud``."""
    from tests.providers.conftest import stop_instances

    base = tmp_path_factory.mktemp("cloud-lab")
    (base / "providers.toml").write_text(CLOUD_PROVIDERS)
    args = [f"--GpulayerApp.providers_file={base / 'providers.toml'}",
            "--GpulayerApp.autoscale_seconds=0.3"]  # fmt: skip
    cluster = start_lab(base, workers=0, server_args=args)
    try:
        yield cluster
    finally:
        cluster.stop()
        stop_instances(cluster.data_dir)  # what the provider left running, by PID


@pytest.fixture
def gl_cloud_sidebar(gl_page, gl_cloud_lab, gl_screenshots) -> SidebarPage:
    """The page with that Lab loaded and the gpulayer panel open."""
    sidebar = SidebarPage(gl_page, gl_cloud_lab, gl_screenshots)
    sidebar.open()
    return sidebar


@pytest.fixture
def gl_bare_lab(tmp_path: Path) -> Iterator[str]:
    """The URL of a JupyterLab with the sidebar installed but ``jupyter_ext`` disabled."""
    env = {**os.environ, **_lab_env(tmp_path)}
    config = Path(env["JUPYTER_CONFIG_DIR"])
    config.mkdir(parents=True, exist_ok=True)
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_ext": False}}})
    )
    port, token = free_port(), "bare-lab-token"
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
            f"--ServerApp.root_dir={tmp_path}", "--LabApp.extension_manager=readonly"]  # fmt: skip
    env["JUPYTER_TOKEN"] = token
    with (tmp_path / "lab.log").open("wb") as out:
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "api", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, (tmp_path / "lab.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "JupyterLab did not start"
            time.sleep(0.1)
        yield f"{url}lab?reset&token={token}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
