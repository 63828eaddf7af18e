"""The sidebar in a JupyterLab whose server does not run the gpulayer extension."""

from playwright.sync_api import expect


def test_the_panel_says_the_server_extension_is_missing(gl_bare_lab, gl_page, gl_screenshots):
    # gl_bare_lab first: the page closes before the server stops
    gl_page.goto(gl_bare_lab)
    gl_page.locator('.jp-SideBar [data-id="gpulayer-sidebar"]').click()
    problem = gl_page.locator("#gpulayer-sidebar .gpulayer-problem")
    expect(problem).to_have_attribute("data-code", "extension_missing", timeout=30_000)
    expect(problem).to_contain_text("gpulayer server extension missing")
    expect(problem).to_contain_text("pip install gpulayer")
    # and once, as a notification, without opening the panel
    expect(gl_page.locator(".Toastify").get_by_text("not enabled")).to_be_visible()
    gl_page.screenshot(path=str(gl_screenshots / "server-extension-missing.png"))
