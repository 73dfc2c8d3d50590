"""A sweep's end, whichever launcher ran its jobs: each failed or stopped job's record in its
run dir (failed.json, stopped.json), the Hydra callback that counts them in the process running
the sweep and prints the sweep's last line, and the exit code."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import time
from pathlib import Path

from hydra.experimental.callback import Callback

from heads_lab.output.files import write_json
from heads_lab.sweeps.signals import _ARM, SLURM_LAUNCHER, WORKER_LAUNCHERS

FAILED_JOBS: list[str] = []


def record_stopped(run_dir: Path, signal_name: str, job: str, what: str) -> None:
    """A sweep job stopped by a signal in a worker process says so in its run dir (stopped.json),
    for `heads-lab report`."""
    with contextlib.suppress(OSError):
        write_json(run_dir / "stopped.json", {"status": "stopped", "job": job,
                                              "signal": signal_name, "error": what})


def record_failure(run_dir: Path, error: str, job: str) -> None:
    """A failed sweep job says so in its run dir (failed.json), for `heads-lab report` and for
    the sweep's exit code when the job ran in another process (joblib, submitit, SLURM)."""
    try:
        write_json(run_dir / "failed.json", {"status": "failed", "job": job, "error": error})
    except OSError:
        pass


class CountFailures(Callback):
    """Hydra callback (conf/hydra/default.yaml): a sweep's failed jobs counted in the process that
    runs the sweep, whichever launcher ran them. Jobs in other processes (joblib, submitit, SLURM)
    say so in their failed.json; those written since the sweep started are this sweep's."""

    def on_multirun_start(self, config, **kwargs) -> None:
        self.started = _start_mark(Path(str(config.hydra.sweep.dir)))
        target = str(config.hydra.launcher.get("_target_", ""))
        if target in WORKER_LAUNCHERS:
            for arm in list(_ARM):  # forward_stop_signals: stop signals reach the workers
                arm(str(config.hydra.sweep.dir))
        if target == SLURM_LAUNCHER:  # a requeued job is waited for, not taken as failed
            from heads_lab.sweeps.slurm import use_checked_watcher  # lazy: submitit

            use_checked_watcher()

    def on_multirun_end(self, config, **kwargs) -> None:
        started = getattr(self, "started", 0.0)
        for path in sorted(Path(str(config.hydra.sweep.dir)).glob("*/failed.json"),
                           key=lambda p: p.parent.name):
            try:
                if path.stat().st_mtime < started:
                    continue
                job = json.loads(path.read_text()).get("job") or path.parent.name
            except (OSError, json.JSONDecodeError):
                job = path.parent.name
            if job not in FAILED_JOBS:
                FAILED_JOBS.append(job)
        folder = config.hydra.launcher.get("submitit_folder")  # submitit's: ${hydra.sweep.dir}/.submitit/%j
        logs = Path(str(folder).split("%j", 1)[0]) if folder else None
        print(sweep_summary(Path(str(config.hydra.sweep.dir)), started, logs))


def _start_mark(sweep_dir: Path) -> float:
    """The sweep's start by the clock that stamps its files (a cluster node's or a file
    server's may differ from this machine's): the time of a file written now in the sweep dir."""
    mark = sweep_dir / ".sweep_started"
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        mark.unlink(missing_ok=True)
        mark.write_text("")
        return mark.stat().st_mtime
    except OSError:
        return time.time() - 1  # file times may be coarser than time.time()


def sweep_summary(sweep_dir: Path, started: float, logs: Path | None = None) -> str:
    """One line at a sweep's end, whichever launcher ran it: how many jobs finished now,
    earlier (skipped), failed or stopped, the command for its table, and `logs`, the launcher's
    log folder (submitit's jobs print nothing to the sweep's console)."""
    def count(name: str, now: bool = True) -> int:
        return sum((p.stat().st_mtime >= started) == now for p in sweep_dir.glob(f"*/{name}"))

    stopped = [p for p in sweep_dir.glob("*/stopped.json") if p.stat().st_mtime >= started]
    unstarted = sum(_error(p).startswith("not started") for p in stopped)
    counts = {"finished": count("results.json"), "finished earlier (skipped)":
              count("results.json", now=False), "failed": len(FAILED_JOBS),
              "stopped": len(stopped) - unstarted, "not started": unstarted}
    told = ", ".join(f"{n} {what}" for what, n in counts.items() if n) or "no job ran"
    table = (f"; its table: heads-lab report {shlex.quote(str(sweep_dir))}"
             if counts["finished"] or counts["finished earlier (skipped)"] else "")
    where = f"; the launcher's logs: {logs}" if logs else ""
    return f"sweep {sweep_dir}: {told}{table}{where}"


def _error(path: Path) -> str:
    try:
        return str(json.loads(path.read_text()).get("error", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def failures() -> int:
    """After the sweep: its failed jobs on stderr in one line; the exit code (2 if any)."""
    if FAILED_JOBS:
        print(f"error: {len(FAILED_JOBS)} job(s) of the sweep failed: {'; '.join(FAILED_JOBS)} "
              "(each job's error is in its run dir's failed.json)", file=sys.stderr)
        return 2
    return 0
