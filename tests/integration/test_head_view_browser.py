"""The head view in a real headless browser (Debian's chromium driven by selenium through
chromium-driver): it loads with no JavaScript error, offers every site, layer and head, and
hiding a head removes its lines from the canvas."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from heads_lab.output.head_view import head_view_html

BROWSER, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (BROWSER and DRIVER),
    reason="no headless browser: install Debian's chromium and chromium-driver (apt-get install "
           "chromium chromium-driver; .ci/run does)")

BLUE, ORANGE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)  # the page's colours of heads 0 and 1


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1200,900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def _maps(layers: int, heads: int, n: int, m: int) -> np.ndarray:
    """Head 0 puts its weight on key i for query i, head 1 on the mirrored key, others uniform."""
    w = np.full((layers, heads, n, m), 1.0 / m)
    for i in range(n):
        w[:, 0, i] = 0.0
        w[:, 0, i, min(i, m - 1)] = 1.0
        w[:, 1, i] = 0.0
        w[:, 1, i, m - 1 - min(i, m - 1)] = 1.0
    return w


def _pixels(driver, colour) -> int:
    """Canvas pixels within a small distance of `colour` (lines of weight 1, mostly opaque)."""
    return driver.execute_script("""
        var c = document.getElementById('lines'), d = c.getContext('2d')
            .getImageData(0, 0, c.width, c.height).data, want = arguments[0], n = 0;
        for (var p = 0; p < d.length; p += 4) {
          if (d[p + 3] > 100 && Math.abs(d[p] - want[0]) < 40 && Math.abs(d[p + 1] - want[1]) < 40
              && Math.abs(d[p + 2] - want[2]) < 40) n++;
        }
        return n;""", list(colour))


def test_head_view_loads_shows_every_layer_and_head_and_hides_a_head(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    src, tgt = ["▁the", "▁dog", "▁runs", "</s>"], ["<s>", "▁der", "▁Hund", "▁läuft"]
    attention = {"enc-self": _maps(2, 3, 4, 4), "dec-self": _maps(3, 3, 4, 4),
                 "dec-enc": _maps(3, 3, 4, 4)}
    notes = {"enc-self": [[f"L{layer} h{h} other, LRP 0.{h}" for h in range(3)]
                          for layer in range(2)]}
    page = head_view_html(attention, src, tgt, tmp_path / "view.html", "test view", notes)
    browser.get(page.as_uri())
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
    assert browser.title == "test view"
    sites = Select(browser.find_element(By.ID, "site"))
    assert [o.text for o in sites.options] == ["enc-self: source → source",
                                               "dec-self: target → target",
                                               "dec-enc: target → source"]
    for k, layers in enumerate((2, 3, 3)):  # every site, every layer, every head
        sites.select_by_index(k)
        layer_menu = Select(browser.find_element(By.ID, "layer"))
        assert [o.text for o in layer_menu.options] == [str(i) for i in range(layers)]
        for layer in range(layers):
            layer_menu.select_by_index(layer)
            assert len(browser.find_elements(By.CSS_SELECTOR, "#heads button.head")) == 3
            title = browser.find_elements(By.CSS_SELECTOR, "#heads button.head")[1].get_attribute(
                "title")  # the notes of this layer's head (enc-self only has them)
            assert title.startswith(f"head 1 (L{layer} h1 other, LRP 0.1)" if k == 0 else
                                    "head 1: click")
            assert browser.find_element(By.ID, "status").text.endswith("3 of 3 heads shown")
    sites.select_by_index(0)
    buttons = browser.find_elements(By.CSS_SELECTOR, "#heads button.head")
    buttons[2].click()  # head 2's faint uniform lines would tint the others where they cross
    assert _pixels(browser, BLUE) > 50 and _pixels(browser, ORANGE) > 50
    buttons[1].click()  # hide head 1: its (orange) lines go, head 0's stay
    assert "1 of 3 heads shown" in browser.find_element(By.ID, "status").text
    assert _pixels(browser, ORANGE) == 0 and _pixels(browser, BLUE) > 50
    browser.find_element(By.ID, "none").click()
    assert _pixels(browser, BLUE) == 0 and _pixels(browser, ORANGE) == 0
    buttons[1].click()
    assert _pixels(browser, ORANGE) > 50 and _pixels(browser, BLUE) == 0
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
