"""hydra/launcher=slurm's watcher (heads_lab/sweeps/slurm.py): an ended state from accounting
(sacct) is checked against the controller (squeue), so a job being requeued is waited for and a
job that really ended is not."""

from __future__ import annotations

import subprocess

import pytest

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the launchers extra")

from heads_lab.sweeps import slurm  # noqa: E402

SACCT = ("JobID|State|NodeList\n"
         "12|FAILED|vm\n12.batch|FAILED|vm\n"  # accounting's last record: the run requeue ended
         "13|FAILED|vm\n"  # really failed: the controller no longer holds it
         "14|CANCELLED by 0|vm\n"  # being requeued, a state with words after it
         "15_0|COMPLETED|vm\n"  # done: never second-guessed
         "16|RUNNING|vm\n")


@pytest.fixture
def watcher(monkeypatch):
    asked = []

    def squeue(cmd, **kwargs):
        asked.append(cmd)
        assert cmd[:5] == ["squeue", "-h", "-o", "%i|%T", "-j"]
        return subprocess.CompletedProcess(cmd, 0, "12|PENDING\n14|REQUEUED\n16|RUNNING\n", "")

    monkeypatch.setattr(slurm.subprocess, "run", squeue)
    monkeypatch.setattr("submitit.core.core.subprocess.check_output",
                        lambda cmd, **kwargs: SACCT.encode())
    w = slurm.ControllerCheckedWatcher(delay_s=600)
    for job in ("12", "13", "14", "15_0", "16"):
        w.register_job(job)
    return w, asked


def test_a_job_the_controller_still_holds_is_not_done_whatever_accounting_says(watcher, caplog):
    w, asked = watcher
    assert w.get_state("12", mode="force") == "PENDING"
    assert not w.is_done("12", mode="cache") and not w.is_done("14", mode="cache")
    assert w.get_state("14", mode="cache") == "REQUEUED"
    assert w.is_done("13", mode="cache") and w.get_state("13", mode="cache") == "FAILED"
    assert w.is_done("15_0", mode="cache") and not w.is_done("16", mode="cache")
    # one squeue call, for the ended states other than COMPLETED only
    assert len(asked) == 1 and asked[0][-1] == "12,13,14"
    # the ended one says what each side said, for a sweep it fails
    assert [r.getMessage() for r in caplog.records] == [
        "SLURM job 13: accounting says FAILED, squeue says nothing: taken as ended"]


def test_without_an_answer_from_squeue_accounting_stands(monkeypatch, watcher, caplog):
    w, _ = watcher

    def broken(cmd, **kwargs):
        raise subprocess.CalledProcessError(1, cmd, "", "slurm_load_jobs error: Invalid job id")

    monkeypatch.setattr(slurm.subprocess, "run", broken)
    assert w.get_state("12", mode="force") == "FAILED" and w.is_done("12", mode="cache")
    assert "squeue -j 12,13,14 gave no answer (slurm_load_jobs error: Invalid job id)" in caplog.text


def test_a_slurm_sweep_waits_through_the_checked_watcher(monkeypatch, tmp_path):
    from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

    from heads_lab.config.compose import compose
    from heads_lab.sweeps.end import CountFailures

    monkeypatch.chdir(tmp_path)  # the sweep's start marks its dir (outputs/multiruns/...)
    monkeypatch.setattr(SlurmJob, "watcher", SlurmInfoWatcher(delay_s=600))
    CountFailures().on_multirun_start(compose(["hydra/launcher=local"], hydra=True))
    assert type(SlurmJob.watcher) is SlurmInfoWatcher  # another launcher: untouched
    CountFailures().on_multirun_start(compose(["hydra/launcher=slurm"], hydra=True))
    assert isinstance(SlurmJob.watcher, slurm.ControllerCheckedWatcher)
    assert SlurmJob.watcher._delay_s == 600
