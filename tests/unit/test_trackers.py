"""The experiment-tracker seam: a tracker plugged in through TRACKERS gets the run's metrics,
its summary and its end, says where its run is in results.json, and can never fail a run."""

from __future__ import annotations

import inspect
import logging

import pytest

from heads_lab.config.schemas import LoggerConfig, WandbConfig, WandbMode
from heads_lab.output import trackers
from heads_lab.output.tracking import Tracker


class Recorder:
    """A tracker that keeps what it is given (the ≤ 3-file recipe of docs/architecture.md)."""

    name = "recorder"
    run_files = ("recorder.log",)
    started: list = []

    def __init__(self, run_dir):
        self.calls: list = []
        self.run_dir = run_dir
        Recorder.started.append(self)

    @classmethod
    def wanted(cls, cfg):
        return cfg.name == "recorder"

    @classmethod
    def start(cls, cfg, run_dir, name, config, group, tags):
        tracker = cls(run_dir)
        tracker.calls.append(("start", name, group, tags, config["model.heads"]))
        return tracker

    def log(self, step, metrics):
        self.calls.append(("log", step, dict(metrics)))

    def summary(self, metrics):
        self.calls.append(("summary", dict(metrics)))

    def finish(self, failed):
        self.calls.append(("finish", failed))

    def where(self):
        return {"dir": str(self.run_dir)}


class Broken(Recorder):
    name = "broken"

    @classmethod
    def wanted(cls, cfg):
        return True

    def finish(self, failed):
        raise RuntimeError("disk full")


class Unstartable(Recorder):
    name = "unstartable"

    @classmethod
    def wanted(cls, cfg):
        return True

    @classmethod
    def start(cls, *args):
        return None  # it warned, as a real one does


@pytest.fixture
def registry(monkeypatch):
    Recorder.started = []
    monkeypatch.setattr(trackers, "TRACKERS", (*trackers.TRACKERS, Recorder, Broken, Unstartable))
    return Recorder.started


def test_a_plugged_in_tracker_gets_metrics_summary_and_end_and_says_where_it_is(
        tmp_path, registry, caplog):
    tracker = Tracker(LoggerConfig(name="recorder"), tmp_path, "h=8", {"model": {"heads": 8}},
                      group="table_a", tags=["t"])
    recorder, broken = registry
    assert [type(t) for t in tracker.trackers] == [Recorder, Broken]  # Unstartable left out
    tracker.log(10, {"train/loss": 3.5})
    tracker.log(20, {"valid/ppl": 9.0, "valid/loss": 2.2})
    with caplog.at_level(logging.WARNING):
        tracker.finish(summary={"test/bleu": 30.0})
    assert recorder.calls == [("start", "h=8", "table_a", ["t"], 8),
                              ("log", 10, {"train/loss": 3.5}),
                              ("log", 20, {"valid/ppl": 9.0, "valid/loss": 2.2}),
                              ("summary", {"test/bleu": 30.0}), ("finish", False)]
    assert "broken finish failed: disk full" in caplog.text  # a warning, never the run's error
    where = tracker.where()
    assert where == {"wandb": None, "tensorboard": None, "recorder": None, "broken": None,
                     "unstartable": None}  # finished: nothing is running any more


def test_where_names_every_tracker_and_the_running_ones_runs(tmp_path, registry):
    tracker = Tracker(LoggerConfig(name="recorder"), tmp_path, "run", {"model": {"heads": 4}})
    assert tracker.where() == {"wandb": None, "tensorboard": None,
                               "recorder": {"dir": str(tmp_path)}, "broken": {"dir": str(tmp_path)},
                               "unstartable": None}
    tracker.finish(failed=True)
    assert registry[0].calls[-1] == ("finish", True)


def test_the_logger_config_chooses_the_trackers():
    wanted = {t.name: t.wanted for t in trackers.TRACKERS}
    assert not wanted["wandb"](LoggerConfig()) and not wanted["tensorboard"](LoggerConfig())
    assert wanted["wandb"](WandbConfig()) and not wanted["tensorboard"](WandbConfig())
    assert not wanted["wandb"](WandbConfig(mode=WandbMode.disabled))
    assert wanted["wandb"](WandbConfig(tensorboard=True))
    assert wanted["tensorboard"](WandbConfig(tensorboard=True))
    assert wanted["tensorboard"](LoggerConfig(name="tensorboard", tensorboard=True))


def test_every_tracker_implements_the_interface():
    methods = {name for name, _ in inspect.getmembers(trackers.ExperimentTracker)
               if not name.startswith("_")}
    assert methods == {"wanted", "start", "log", "summary", "finish", "where"}
    for tracker in trackers.TRACKERS:
        assert isinstance(tracker.name, str) and isinstance(tracker.run_files, tuple)
        for name in methods:
            ours = inspect.signature(getattr(trackers.ExperimentTracker, name))
            theirs = inspect.signature(getattr(tracker, name))
            assert list(theirs.parameters) == list(ours.parameters), (tracker.name, name)
    assert trackers.RUN_FILES == ("wandb-run-id", "tensorboard")


def test_a_missing_tracker_package_is_named_with_its_fix(monkeypatch):
    from heads_lab.errors import ConfigError

    monkeypatch.setattr(trackers, "_installed", lambda package: package != "wandb")
    with pytest.raises(ConfigError, match=r"^logger=wandb needs the wandb package, which is not "
                       r"installed: pip install 'wandb>=0.19.10' .*\(logger=none\)$"):
        trackers.check_installed(WandbConfig())
    trackers.check_installed(LoggerConfig(name="tensorboard", tensorboard=True))  # installed
    trackers.check_installed(WandbConfig(mode=WandbMode.disabled))  # not asked for


def test_a_tracker_failing_mid_run_is_a_warning_and_the_run_goes_on(tmp_path, registry, caplog,
                                                                     monkeypatch):
    def fail(self, step, metrics):
        raise OSError("connection reset")

    monkeypatch.setattr(Broken, "log", fail)
    tracker = Tracker(LoggerConfig(name="recorder"), tmp_path, "run", {"model": {"heads": 4}})
    recorder, broken = registry
    with caplog.at_level(logging.WARNING):
        tracker.log(10, {"train/loss": 3.0})
        tracker.log(20, {"train/loss": 2.0})  # the broken one is not called again
    assert caplog.text.count("broken failed at step 10 (connection reset)") == 1
    assert [c[1] for c in recorder.calls if c[0] == "log"] == [10, 20]
    assert tracker.where()["broken"] == {"dir": str(tmp_path)}  # its run is still said
    tracker.finish(summary={"test/bleu": 1.0})
    assert recorder.calls[-1] == ("finish", False)
