"""The SLURM path on a real one-node cluster (scripts/slurm_cluster.sh: Debian's slurm-wlm,
slurmdbd on its own MariaDB, munge): a sweep submits one SLURM job per point, a job preempted
with SLURM's warning signal is requeued and resumes to exactly an uninterrupted run's numbers, and
a job failing on bad data is recorded and fails the sweep. They skip, saying why, where the
cluster cannot be brought up (not root, packages missing); .ci/run installs the packages."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import TINY
from tests.integration.test_cli import EXE, heads_lab
from tests.unit.test_data_sources import _corpus, _write

pytestmark = pytest.mark.slurm

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm_cluster.sh"
# one CPU and 1 GB per job, no GPU: two jobs side by side on a 2-core machine
SLURM = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0", "hydra.launcher.cpus_per_task=1",
         "hydra.launcher.mem_gb=1", "trainer.threads=1"]
NEEDED = ("sbatch", "slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd")


def _missing() -> list[str]:
    return [c for c in NEEDED if not (shutil.which(c) or Path("/usr/sbin", c).exists())]


def _sh(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout


@pytest.fixture(scope="module")
def cluster():
    """The one-node cluster: one already up is used as it is; one this fixture brings up it
    also tears down."""
    if os.geteuid() != 0:
        pytest.skip("the SLURM tests bring up a cluster with scripts/slurm_cluster.sh, which "
                    "needs root")
    if _missing():
        pytest.skip(f"SLURM not installed ({', '.join(_missing())} missing): `sudo "
                    "scripts/slurm_cluster.sh up` installs slurm-wlm, slurmdbd, munge and "
                    "mariadb-server (Debian), as .ci/run does")
    was_up = subprocess.run([str(SCRIPT), "status"], capture_output=True).returncode == 0
    if not was_up:
        up = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True, timeout=180)
        if up.returncode != 0:
            pytest.skip(f"scripts/slurm_cluster.sh up failed: {up.stderr.strip()[-500:]}")
    yield
    if not was_up:
        subprocess.run([str(SCRIPT), "down"], capture_output=True, timeout=120)


def _slurm_jobs(sweep: Path) -> list[str]:
    """The SLURM job ids submitit used for a sweep (its folder per job: <array>_<task>, or the
    plain job id for a one-job sweep)."""
    folders = sorted(p.name for p in (sweep / ".submitit").iterdir() if p.is_dir())
    return [f for f in folders if "_" in f] or folders


def _sacct(job: str, duplicates: bool = False) -> list[str]:
    """The job allocation's states in accounting, oldest first (-D: a requeued job's earlier
    runs too), once it has ended (submitit returns when the result is written, a moment before
    the job's own end)."""
    for _ in range(150):
        out = _sh("sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", job,
                  *(["-D"] if duplicates else []))
        states = [line.split("|")[1].split()[0] for line in out.splitlines()
                  if line.split("|")[0] == job]
        if states and states[-1] not in ("PENDING", "RUNNING", "COMPLETING"):
            return states
        time.sleep(0.2)
    return states


def test_a_sweep_submits_one_slurm_job_per_point_that_report_reads(cluster, tmp_path):
    sweep = tmp_path / "sweep"
    proc = heads_lab("train", "-m", *SLURM, *TINY, "model.heads=1,4", f"hydra.sweep.dir={sweep}",
                     cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = _slurm_jobs(sweep)
    assert len(jobs) == 2 and len({j.split("_")[0] for j in jobs}) == 1, jobs  # one array, 2 tasks
    for job in jobs:
        assert _sacct(job) == ["COMPLETED"], job
    found = sorted(sweep.glob("*/results.json"))
    assert [json.loads(p.read_text())["config"]["model"]["heads"] for p in found] == [1, 4]
    report = heads_lab("report", str(sweep), "--samples", "100", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    with open(sweep / "report.csv", newline="") as f:
        assert [r["setting"] for r in csv.DictReader(f)] == ["h=1 (base)", "h=4"]


# long enough for a signal to land mid-training; dropout on, so the RNG state must resume too
LONG = [*[o for o in TINY if not o.startswith(("trainer.max_steps", "trainer.valid_every"))],
        "trainer.max_steps=300", "trainer.save_every=20", "trainer.valid_every=50",
        "model.dropout=0.2", "model.heads=2"]
EXACT = ("train/loss", "valid/loss", "valid/ppl", "test/loss", "test/bleu", "test/chrf")


def _wait(what: str, check, proc: subprocess.Popen, seconds: float = 240):
    deadline = time.time() + seconds
    while time.time() < deadline:
        found = check()
        if found:
            return found
        assert proc.poll() is None, f"the sweep ended while waiting for {what}: " + proc.stderr.read()
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _why(err: str, job: str) -> str:
    """A failed sweep's story: the watcher's lines (each side's word on an ended state), the
    job's runs in accounting, and the end of the sweep's stderr."""
    said = [line for line in err.splitlines() if "accounting says" in line or "squeue" in line]
    runs = subprocess.run(["sacct", "-n", "-X", "-P", "-D", "-o", "JobID,State,ExitCode,Start,End",
                           "-j", job], capture_output=True, text=True).stdout
    return "\n".join(["watcher: " + ("; ".join(said) or "nothing"), "sacct -D: " + runs,
                      err[-2500:]])


def test_a_preempted_job_is_requeued_and_resumes_to_the_uninterrupted_numbers(cluster, tmp_path):
    whole = heads_lab("train", *LONG, "trainer.threads=1", f"hydra.run.dir={tmp_path / 'whole'}",
                      cwd=tmp_path, timeout=600)
    assert whole.returncode == 0, whole.stderr[-3000:]
    uninterrupted = json.loads((tmp_path / "whole" / "results.json").read_text())

    sweep = tmp_path / "sweep"
    proc = subprocess.Popen([EXE, "train", "-m", *SLURM, *LONG, f"hydra.sweep.dir={sweep}"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait("a checkpoint", lambda: list(sweep.glob("*/checkpoints/step_*.pt")), proc)
        job = _slurm_jobs(sweep)[0]
        assert job in _sh("squeue", "-h", "-o", "%i").split()  # running, as SLURM sees it
        # SLURM's warning before a time limit or preemption (--signal=USR2@signal_delay_s)
        _sh("scancel", "--signal=USR2", job)
        # submitit requeues it (scontrol requeue); SLURM holds a requeued job ~120 s: release it
        _wait("the requeued job", lambda: "PENDING" in _sh("squeue", "-h", "-j", job, "-o", "%T"),
              proc, 60)
        # not in the second its first run was killed: slurmd revoked that run's credential and
        # refuses a relaunch within the same second ("Job credential revoked": the requeued run
        # FAILED at once, exit 1, and the sweep with it; what SLURM's own hold prevents)
        _wait("the node to be idle", lambda: _sh("sinfo", "-h", "-o", "%T").split() == ["idle"],
              proc, 60)
        time.sleep(2)
        _sh("scontrol", "update", f"jobid={job}", "StartTime=now")
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run(["scancel", _slurm_jobs(sweep)[0].split("_")[0]], capture_output=True)
    assert proc.returncode == 0, _why(err, job)
    run_dir = next(sweep.glob("0_*"))
    results = json.loads((run_dir / "results.json").read_text())
    stopped = results["train"]["resumed_from"]
    assert stopped is not None and 0 < int(stopped) < 300, stopped
    assert f"resuming from {run_dir}/checkpoints/step_{int(stopped):07d}.pt" in \
        (run_dir / "train.log").read_text()
    logs = "".join(p.read_text() for p in (sweep / ".submitit" / job).glob("*.err"))
    assert f"stopped by SIGUSR2 at step {stopped}" in logs
    # SLURM requeues it: no advice to run the sweep again by hand (that would start a copy)
    assert "SLURM requeues the job" in logs and "run the same" not in logs, logs
    assert _sacct(job, duplicates=True) == ["REQUEUED", "COMPLETED"]
    assert results["train"]["steps"] == uninterrupted["train"]["steps"] == 300
    for key in EXACT:
        assert results["metrics"][key] == uninterrupted["metrics"][key], key
    assert results["train"]["valid_history"] == uninterrupted["train"]["valid_history"]


def test_a_job_failing_on_bad_data_is_recorded_and_fails_the_sweep(cluster, tmp_path):
    good, bad = _corpus(tmp_path / "good"), _corpus(tmp_path / "bad")
    _write(bad / "train.en", ["x"] * 299)  # one line short of train.de: found when the job reads it
    sweep = tmp_path / "sweep"
    proc = heads_lab("train", "-m", *SLURM, "model=tiny", "trainer.max_steps=4",
                     "trainer.max_tokens=1024", "eval.beam=1", "logger=none", "data=local",
                     f"data.root={good},{bad}", "data.src=de", "data.tgt=en", "data.vocab_size=60",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert f"1 job(s) of the sweep failed: data.root={bad}" in proc.stderr
    failed = [json.loads(p.read_text()) for p in sweep.glob("*/failed.json")]
    assert len(failed) == 1 and "train.en" in failed[0]["error"], failed
    assert failed[0]["job"] == f"data.root={bad}"
    assert len(list(sweep.glob("*/results.json"))) == 1
    for job in _slurm_jobs(sweep):  # the job itself ends normally: heads-lab caught the error
        assert _sacct(job) == ["COMPLETED"], job


def test_an_ended_state_in_accounting_is_checked_against_the_controller(cluster, tmp_path):
    """The window submitit alone misreads: accounting says FAILED while the controller still
    holds the job (a requeued job waits in PENDING). A held job stands for it on the real
    controller; a job that really ended keeps accounting's state."""
    from heads_lab.sweeps.slurm import ControllerCheckedWatcher

    held = _sh("sbatch", "--parsable", "--hold", "-o", str(tmp_path / "held.out"),
               "--wrap", "true").strip()
    done = _sh("sbatch", "--parsable", "-o", str(tmp_path / "done.out"), "--wrap", "true").strip()
    try:
        _sacct(done)  # ended, and in accounting
        watcher = ControllerCheckedWatcher(delay_s=600)
        for job in (held, done):
            watcher.register_job(job)
        info = watcher.read_info(f"JobID|State|NodeList\n{held}|FAILED|vm\n{done}|FAILED|vm\n")
        assert info[held]["State"] == "PENDING"
        assert info[done]["State"] == "FAILED"  # squeue lists it as ended, or not at all
    finally:
        subprocess.run(["scancel", held, done], capture_output=True)
