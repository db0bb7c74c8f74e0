"""`harnessrl view` in a real headless Chromium (Debian's chromium and chromium-driver, `make test` installs
them), driven by Selenium: each page loads, a filter narrows the list, a token's colour and title are the
journal's values, a rollout's call graph shows its breaks, and the side-by-side view compares a task under two
harnesses and at two policy versions. Screenshots of each page are kept in the test's tmp dir (SCREENSHOTS, when
set, names a directory to copy three of them to: `SCREENSHOTS=docs/viewer` makes the README's)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harnessrl.runtime.serving import run_in_thread, server
from harnessrl.runtime.viewer.app import create_app
from harnessrl.runtime.viewer.tokens import Colouring, colour

from tests.fixtures.viewer_run import BROKEN, Run

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                                reason="needs Debian's chromium and chromium-driver (make test installs them)")


@pytest.fixture()
def viewer_url(viewer_run: Run) -> Iterator[str]:
    http = server(create_app(viewer_run.path), "127.0.0.1", 0)
    thread = run_in_thread(http)
    port = http.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    http.should_exit = True
    thread.join(10)


@pytest.fixture()
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(arg)
    service = Service(executable_path=str(CHROMEDRIVER))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()  # stops Chromium, then the driver's process
        process = service.process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(5)


def follow(driver: Any, element: Any) -> None:
    """Click a link or a form's button and wait for the next page: a click does not always wait for it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    page = driver.find_element(By.TAG_NAME, "html")
    element.click()
    wait = WebDriverWait(driver, 15)
    wait.until(expected_conditions.staleness_of(page))
    wait.until(lambda d: d.execute_script("return document.readyState") == "complete")


def rgb(css_colour: str) -> tuple[int, ...]:
    """(r, g, b) of a computed `rgb(...)` or `rgba(...)`."""
    return tuple(int(v) for v in re.findall(r"\d+", css_colour)[:3])


def test_the_views_load_filter_and_colour_tokens_as_journaled(browser: Any, viewer_url: str, viewer_run: Run,
                                                              tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get(viewer_url + "/")
    assert driver.find_element(By.CSS_SELECTOR, "figure#chart svg").is_displayed()
    assert "mini-swe-agent" in driver.find_element(By.ID, "harnesses").text
    driver.save_screenshot(str(tmp_path / "run.png"))

    follow(driver, driver.find_element(By.LINK_TEXT, "rollouts"))
    assert len(driver.find_elements(By.CSS_SELECTOR, "#rollouts tbody tr")) == 9
    Select(driver.find_element(By.ID, "filter-harness")).select_by_value("mini-swe-agent")
    Select(driver.find_element(By.ID, "filter-solved")).select_by_value("false")
    follow(driver, driver.find_element(By.ID, "apply"))
    rows = driver.find_elements(By.CSS_SELECTOR, "#rollouts tbody tr")
    assert [(r.get_attribute("data-harness"), r.get_attribute("class")) for r in rows] == \
        [("mini-swe-agent", "unsolved")] * 2
    assert driver.find_element(By.ID, "count").text.startswith("2 rollouts")
    driver.save_screenshot(str(tmp_path / "rollouts.png"))

    follow(driver, rows[0].find_element(By.LINK_TEXT, "g0000001-r001"))
    assert driver.find_element(By.ID, "grader").text == "task-add: FAIL 1 of 3"
    [seq] = viewer_run.entry("g0000001-r001").sequences
    k = seq.loss_mask.index(1) + 2  # the third sampled token of the first call
    token = driver.find_element(By.ID, f"tok-0-{k}")
    assert token.get_attribute("title").startswith(f"token {seq.token_ids[k]} · logprob {seq.logprobs[k]:.4f} ")
    assert float(token.get_attribute("data-logprob")) == seq.logprobs[k]
    assert rgb(token.value_of_css_property("background-color")) == colour(Colouring.logprob, 1, seq.logprobs[k], 0.0, 0)
    driver.save_screenshot(str(tmp_path / "rollout.png"))

    driver.find_element(By.CSS_SELECTOR, "input[name=colour][value=version]").click()
    follow(driver, driver.find_element(By.ID, "recolour"))
    token = driver.find_element(By.ID, f"tok-0-{k}")
    assert rgb(token.value_of_css_property("background-color")) == colour(Colouring.version, 1, 0.0, 0.0,
                                                                          seq.policy_versions[k])

    # From the rollout to the same task under the other harness, side by side.
    follow(driver, driver.find_element(By.ID, "compare-harness"))
    a, b = driver.find_element(By.ID, "side-a"), driver.find_element(By.ID, "side-b")
    assert a.find_element(By.TAG_NAME, "h2").text == "harness mini-swe-agent"
    assert b.find_element(By.TAG_NAME, "h2").text == "harness oneshot"
    assert a.location["y"] == b.location["y"] and b.location["x"] > a.location["x"] + a.size["width"] / 2
    assert a.find_element(By.CSS_SELECTOR, "h3.shown").text == "g0000001-r001"  # the rollout it came from
    assert b.find_element(By.CSS_SELECTOR, "h3.shown").text == "g0000000-r000"  # the other side's best
    assert [e.text for e in b.find_elements(By.CSS_SELECTOR, "pre.sampled")] == ["def f(x): return x + 1", " # done"]
    driver.save_screenshot(str(tmp_path / "compare.png"))
    # The same task at two policy versions instead.
    Select(driver.find_element(By.ID, "compare-by")).select_by_value("version")
    follow(driver, driver.find_element(By.ID, "compare-apply"))
    # The sides' values were harness names: blank for versions, so they take the task's versions in order.
    assert [driver.find_element(By.CSS_SELECTOR, f"#side-{s} h2").text for s in "ab"] == ["version 0", "version 1"]

    # A rollout that broke its prefix: each break in its call graph with the proxy's cause.
    driver.get(f"{viewer_url}/rollouts/{BROKEN}")
    branches = driver.find_elements(By.CSS_SELECTOR, "#graph li.branch")
    assert sorted(b.get_attribute("data-cause") for b in branches) == ["", "history_changed", "retry"]
    assert driver.find_element(By.ID, "breaks").text == "2 root(s), 2 prefix break(s) · history_changed 1 · retry 1"
    driver.find_element(By.ID, "graph").location_once_scrolled_into_view  # noqa: B018 (scrolls it into view)
    driver.save_screenshot(str(tmp_path / "graph.png"))
    for name in ("run", "rollouts", "rollout", "compare", "graph"):
        assert (tmp_path / f"{name}.png").read_bytes().startswith(b"\x89PNG")
    if os.environ.get("SCREENSHOTS"):  # the README's: SCREENSHOTS=docs/viewer
        for name in ("run", "compare", "graph"):
            shutil.copy(tmp_path / f"{name}.png", os.environ["SCREENSHOTS"])
