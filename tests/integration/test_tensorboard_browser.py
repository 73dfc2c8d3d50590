"""A sweep's TensorBoard in a real browser: `tensorboard --logdir <sweep>` on 127.0.0.1, opened
in headless Chromium (selenium + Debian's chromium-driver): both runs of the sweep are listed and
the valid/loss scalar is drawn; `--logdir <sweep>/tensorboard` names the runs by their swept
settings, and its HParams table lists every run with its h and final BLEU."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import TINY
from tests.integration.test_cli import heads_lab
from tests.integration.test_head_view_browser import BROWSER, DRIVER, browser  # noqa: F401

pytestmark = pytest.mark.skipif(
    not (BROWSER and DRIVER),
    reason="no headless browser: install Debian's chromium and chromium-driver (apt-get install "
           "chromium chromium-driver; .ci/run does)")
TENSORBOARD = shutil.which("tensorboard", path=str(Path(sys.executable).parent))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("tb")
    proc = heads_lab("train", "-m", *TINY, "logger=tensorboard", "model.heads=2,4",
                     f"hydra.sweep.dir={root / 'sweep'}", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "sweep"


@pytest.fixture(scope="module")
def server(sweep):
    yield from _serve(sweep)


def _serve(logdir: Path):
    port = _free_port()
    proc = subprocess.Popen([TENSORBOARD, "--logdir", str(logdir), "--host", "127.0.0.1",
                             "--port", str(port), "--load_fast=false", "--reload_interval=1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/data/runs", timeout=2) as r:
                if len(__import__("json").loads(r.read())) >= 2:
                    break
        except OSError:
            pass
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("tensorboard did not list the sweep's runs within 60 s: "
                    + (proc.stderr.read()[-2000:] if proc.stderr else ""))
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_tensorboard_lists_the_sweeps_runs_and_draws_a_scalar(browser, server, sweep):  # noqa: F811
    import json

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    jobs = sorted(p.parent for p in sweep.glob("*/results.json"))
    runs = [f"{job.name}/tensorboard" for job in jobs]
    losses = [h["valid/loss"] for job in jobs
              for h in json.loads((job / "results.json").read_text())["train"]["valid_history"]]
    browser.get(f"{server}/#timeseries")
    body = lambda d: d.find_element(By.TAG_NAME, "body").text  # noqa: E731
    WebDriverWait(browser, 60).until(lambda d: all(r in body(d) for r in runs))  # the runs table
    browser.find_element(By.CSS_SELECTOR, "metrics-tag-filter input").send_keys("valid/loss")
    card = """return Array.from(document.querySelectorAll('scalar-card-component'))
        .filter(c => c.innerText.replace(/\\n/g, '').indexOf('valid/loss') == 0)"""
    WebDriverWait(browser, 60).until(lambda d: len(d.execute_script(card)) == 1)
    # its chart: a drawn canvas, both runs in its legend, y-axis ticks at the losses' scale
    chart = browser.execute_script(card + """.map(c => ({
        canvas: Array.from(c.querySelectorAll('line-chart canvas')).map(x => x.width * x.height),
        legend: (c.querySelector('scalar-card-data-table') || {innerText: ''}).innerText,
        ticks: Array.from(c.querySelectorAll('line-chart-axis')).map(a => a.innerText)}))[0]""")
    assert chart["canvas"] and min(chart["canvas"]) > 0, chart
    assert all(r.split("/")[0][:30] in chart["legend"] for r in runs), chart["legend"]
    ticks = [float(t) for axis in chart["ticks"] for t in axis.split() if _number(t)]
    near = [t for t in ticks if min(losses) - 0.5 <= t <= max(losses) + 0.5]
    assert len(near) >= 2, (ticks, losses)


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


TEXT = """function walk(n, out) {  // visible text, shadow roots included (the hparams dashboard)
    if (!n || n.nodeName == 'STYLE' || n.nodeName == 'SCRIPT') return;
    if (n.shadowRoot) walk(n.shadowRoot, out);
    if (n.nodeType == 3 && n.textContent.trim()) out.push(n.textContent.trim());
    for (const c of n.childNodes) walk(c, out);
  }
  const out = []; walk(document.body, out); return out;"""


@pytest.fixture(scope="module")
def index_server(sweep):
    yield from _serve(sweep / "tensorboard")


def test_the_hparams_table_lists_every_run_by_its_swept_settings(browser, index_server,  # noqa: F811
                                                                 sweep):
    import json

    from selenium.webdriver.support.ui import WebDriverWait

    jobs = sorted(p.parent for p in sweep.glob("*/results.json"))
    bleus = {json.loads((j / "results.json").read_text())["config"]["model"]["heads"]:
             json.loads((j / "results.json").read_text())["metrics"]["test/bleu"] for j in jobs}
    with urllib.request.urlopen(f"{index_server}/data/runs", timeout=5) as r:
        assert sorted(json.loads(r.read())) == ["h=2", "h=4"]  # short names, one per job
    browser.set_window_size(1600, 1000)
    browser.get(f"{index_server}/#hparams")

    def table(d):
        words = d.execute_script(TEXT)
        return words[words.index("TABLE VIEW"):] if "TABLE VIEW" in words else []

    WebDriverWait(browser, 60).until(lambda d: {"h=2", "h=4"} <= set(table(d)))
    words = table(browser)
    header = words[words.index("Trial ID"):words.index("h=2")]
    assert {"h", "final/test_bleu", "final/valid_ppl"} <= set(header), header
    for heads in (2, 4):  # each run's row holds its h and its BLEU
        row = words[words.index(f"h={heads}"):][:len(header)]
        assert str(heads) in row or f"{heads}.0000" in row, row
        assert any(abs(float(x) - bleus[heads]) < 1e-3 for x in row if _number(x)), (row, bleus)
