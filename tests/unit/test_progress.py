"""Progress lines of the long commands without a training loop (analyze, prune, report)."""

from __future__ import annotations

import logging
import re
import time

import numpy as np
import torch

from heads_lab.output.progress import Steps, clock, steps


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_line_at_most_every_interval_with_elapsed_and_eta(monkeypatch, caplog):
    fake = Clock()
    monkeypatch.setattr("heads_lab.output.progress.time.monotonic", fake)
    log = logging.getLogger("test.progress")
    with caplog.at_level(logging.INFO, logger="test.progress"):
        counter = Steps("LRP relevance", 10, log, every_s=30, unit="sentences")
        for _ in range(10):
            fake.now += 20  # 20 s per sentence: a line every other sentence
            counter.step()
        counter.finish()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "LRP relevance 2/10 sentences (20%)  elapsed 0:00:40  ETA 0:02:40"
    assert len(lines) == 5  # after 2, 4, 6, 8 sentences, and the closing line
    assert lines[-1] == "LRP relevance 10/10 sentences (100%)  elapsed 0:03:20  ETA 0:00:00"


def test_short_work_stays_quiet_and_the_wrapper_yields_every_item(caplog):
    log = logging.getLogger("test.progress")
    with caplog.at_level(logging.INFO, logger="test.progress"):
        assert list(steps(range(5), "maps", 5, log)) == [0, 1, 2, 3, 4]
    assert caplog.records == []
    assert clock(3725.4) == "1:02:05"


def test_maps_of_a_long_run_report_their_progress(monkeypatch, caplog):
    """collect_maps logs where it is (every_s patched to 0: a line per batch)."""
    from heads_lab.analysis import collect_maps
    from heads_lab.config.schemas import ModelConfig
    from heads_lab.data import Split
    from heads_lab.model import Transformer

    monkeypatch.setattr(Steps.__init__, "__defaults__", (0.0, ""))  # every_s = 0
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=16, heads=2, d_ff=32, encoder_layers=1,
                                    decoder_layers=1), 20)
    rng = np.random.default_rng(0)
    split = Split(None, None, [rng.integers(4, 20, 5).tolist() for _ in range(5)],
                  [rng.integers(4, 20, 4).tolist() for _ in range(5)])
    with caplog.at_level(logging.INFO, logger="heads_lab.analysis.maps"):
        collect_maps(model, split, None, torch.device("cpu"), batch_size=2)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("attention maps 2/5 sentences (40%)  elapsed ")
    assert lines[-1].startswith("attention maps 5/5 sentences (100%)")


def test_the_training_line_ends_at_the_time_budget_when_it_comes_before_max_steps(monkeypatch):
    """trainer.max_time: the ETA is the budget's seconds left when they end the run first (a
    run with max_steps 100000 under a 30-minute budget must not say 26 hours), else the steps'."""
    from heads_lab.output import tracking

    fake = Clock()
    monkeypatch.setattr(tracking.time, "monotonic", fake)
    tracker = tracking.Tracker.__new__(tracking.Tracker)
    tracker.progress, tracker.trackers = None, []
    tracker.total, tracker.started, tracker.first, tracker.max_time = 100_000, fake.now, None, 1800.0
    metrics = {"train/loss": 3.0, "train/lr": 1e-3, "train/tokens_per_s": 4000.0}
    tracker.progress_line(50, {**metrics, "train/seconds": 50.0})
    fake.now += 50  # 1 s a step: the steps would take 99,900 s more
    line = tracker.progress_line(100, {**metrics, "train/seconds": 100.0})
    assert line.endswith(f"ETA {clock(1700)}")  # the budget's 1,700 s left
    tracker.max_time = 10_000_000.0  # a budget that would not end it first
    assert tracker.progress_line(100, {**metrics, "train/seconds": 100.0}).endswith(
        f"ETA {clock(99_900)}")
    tracker.max_time = None  # no budget: the steps' ETA, as before
    assert tracker.progress_line(100, metrics).endswith(f"ETA {clock(99_900)}")


def test_the_last_steps_line_has_nothing_left_even_as_the_first_line(monkeypatch):
    """A run whose last step is its first progress line (max_steps ≤ log_every) has no pace yet,
    but nothing is left: ETA 0:00:00, not '?'; an earlier first line still has no ETA."""
    from heads_lab.output import tracking

    fake = Clock()
    monkeypatch.setattr(tracking.time, "monotonic", fake)
    tracker = tracking.Tracker.__new__(tracking.Tracker)
    tracker.progress, tracker.trackers = None, []
    tracker.total, tracker.started, tracker.first, tracker.max_time = 30, fake.now, None, None
    metrics = {"train/loss": 3.0, "train/lr": 1e-3, "train/tokens_per_s": 4000.0}
    assert tracker.progress_line(30, metrics).endswith(f"ETA {clock(0)}")
    tracker.first, tracker.total = None, 100
    assert tracker.progress_line(10, metrics).endswith("ETA ?")
    # the first line of a run: the updates' own pace so far (20 s for 10 steps, 90 to go)
    tracker.first = None
    assert tracker.progress_line(10, {**metrics, "train/seconds": 20.0}).endswith(
        f"ETA {clock(180)}")


def test_a_tracker_has_its_progress_fields_before_start(tmp_path):
    """Every field progress_line reads exists from __init__ (start() sets them for a run): a line
    asked for before start() has no step total and no budget, so no ETA, instead of an
    AttributeError."""
    from heads_lab.config.schemas import LoggerConfig
    from heads_lab.output.tracking import Tracker

    tracker = Tracker(LoggerConfig(name="recorder"), tmp_path, "run", {"model": {"heads": 4}})
    metrics = {"train/loss": 3.0, "train/lr": 1e-3, "train/tokens_per_s": 4000.0,
               "train/seconds": 10.0}
    assert (tracker.total, tracker.first, tracker.max_time) == (None, None, None)
    line = tracker.progress_line(10, metrics)
    assert line.startswith("step 10/?  loss 3.000  lr 1.00e-03  4,000 tok/s  elapsed ")
    assert line.endswith("ETA ?")


def test_the_progress_bars_last_line_is_where_training_stopped(tmp_path):
    """A stop signal or the time budget ends training between two logged steps: the bar's last
    line shows the step training stopped at, not the last logged one."""
    import io

    from rich.console import Console

    from heads_lab.config.schemas import LoggerConfig
    from heads_lab.output import tracking

    out = io.StringIO()
    tracker = tracking.Tracker(LoggerConfig(name="recorder"), tmp_path, "run", {})
    original = tracking.console
    tracking.console = Console(file=out, width=200, force_terminal=True, color_system=None,
                               markup=False)  # a terminal: piped output has no bar
    try:
        tracker.start(1000)
        tracker.log(130, {"train/loss": 3.0, "train/lr": 1e-3, "train/tokens_per_s": 4000.0,
                          "train/seconds": 10.0})
        time.sleep(0.05)  # a pace: rich's estimate of the time left
        tracker.stop_progress(137)
        tracker.start(200)
        tracker.log(200, {"train/loss": 2.0, "train/lr": 1e-3, "train/tokens_per_s": 4000.0,
                          "train/seconds": 10.0})
        tracker.stop_progress(200)
    finally:
        tracking.console = original
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # a terminal's: no codes
    last = [chunk.split("\r")[-1] for chunk in shown.split("\n")]  # each bar's final state
    stopped, ended = [line for line in last if line.startswith("train")]
    # stopped short: no estimate left of the steps it will never take; at its end: nothing left
    assert "step 137/1000" in stopped and stopped.rstrip().endswith("ETA -:--:--")
    assert "step 200/200" in ended and ended.rstrip().endswith("ETA 0:00:00")
