"""hydra/launcher=slurm: submitit's job states, with the controller's word for a job that is
still alive.

submitit learns a job's state from accounting (`sacct`) and takes a state such as FAILED as the
job's end: it stops polling and, without the job's result file, raises "has not produced any
output (state: FAILED)", which fails the whole sweep. Accounting lags the controller (on a
one-node cluster `sacct` showed nothing for a running job, then REQUEUED or PENDING while squeue
already showed it running again), so an ended state from `sacct` is checked against the
controller (`squeue`): a job squeue still holds as pending, running, requeued or completing
keeps squeue's state, and submitit waits for it. A job squeue no longer lists, or lists as ended,
keeps sacct's state: a job that really failed fails the sweep as before. COMPLETED is never
second-guessed (its result file is there). The sweep's process installs the watcher when its
launcher is SLURM's (sweeps/end.py: CountFailures).

A requeued job that really FAILED is not this watcher's to hide: the preemption test once
released its requeued job (SLURM holds one ~120 s) in the second its first run was killed, and
slurmd refused the relaunch ("Job credential revoked", exit 1); that run FAILED in accounting
and in the controller, and the sweep rightly failed. The test now waits for the node to be idle."""

from __future__ import annotations

import logging
import subprocess

from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

LOG = logging.getLogger(__name__)

# squeue's states of a job that has not ended (a requeued job passes through these)
ALIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING",
         "COMPLETING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
         "RESV_DEL_HOLD"}


def controller_states(job_ids: list[str]) -> dict[str, str]:
    """The controller's state of each job it still holds (squeue), {} where squeue fails (a job
    that left the controller, no squeue): then accounting's word stands."""
    bases = sorted({j.split("_")[0] for j in job_ids})
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%i|%T", "-j", ",".join(bases)],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        err = (getattr(e, "stderr", None) or str(e)).strip().splitlines()
        LOG.warning("squeue -j %s gave no answer (%s)", ",".join(bases), err[-1] if err else e)
        return {}
    states = {}
    for line in out.splitlines():
        job, _, state = line.strip().partition("|")
        if job and state:
            states[job] = state.split()[0]
    return states


class ControllerCheckedWatcher(SlurmInfoWatcher):
    """submitit's sacct watcher, with ended states (not COMPLETED) checked against squeue."""

    def read_info(self, string):
        info = super().read_info(string)
        ended = []
        for job, stats in info.items():
            state = (stats.get("State") or "").split()  # e.g. "CANCELLED by 0"
            if job in self._registered and state and state[0] not in ALIVE | {"COMPLETED"}:
                ended.append(job)
        if ended:
            live = controller_states(ended)
            for job in ended:
                if live.get(job) in ALIVE:
                    info[job] = {**info[job], "State": live[job]}
                else:  # said, so that a sweep failed by it shows both sides' word
                    LOG.warning("SLURM job %s: accounting says %s, squeue says %s: taken as "
                                "ended", job, info[job]["State"], live.get(job, "nothing"))
        return info


def use_checked_watcher() -> None:
    """SLURM jobs of this process wait through ControllerCheckedWatcher (submitit's watcher is
    one object shared by all its SLURM jobs, a class attribute: replaced before any is
    submitted; its polling delay kept)."""
    if not isinstance(SlurmJob.watcher, ControllerCheckedWatcher):
        SlurmJob.watcher = ControllerCheckedWatcher(delay_s=SlurmJob.watcher._delay_s)
