"""Hydra sweeps, as heads-lab runs them: every job composed and checked before the first one
starts; a sweep run again into its dir skips its finished jobs (--rerun runs them again, keeping
their results aside) and resumes the others; a finished run of another config is never
overwritten; a job's user error is recorded (failed.json) and counted, the other jobs run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf.errors import OmegaConfBaseException

from heads_lab.config.compose import compose, expand_sweeps, to_object
from heads_lab.config.messages import one_line
from heads_lab.config.validate import validate
from heads_lab.errors import ConfigError, HeadsLabError, finished_run
from heads_lab.output.files import LOCK, ensure_writable
from heads_lab.output.trackers import RUN_FILES, check_installed
from heads_lab.sweeps import kept_config
from heads_lab.sweeps.end import FAILED_JOBS, record_failure, record_stopped
from heads_lab.sweeps.overrides import check_parses, dir_override
from heads_lab.sweeps.signals import (
    STOPPING,
    SWEEP_PID_ENV,
    dir_arg,
    in_worker,
    pass_on,
    say_line,
    scheduler_handler,
    signal_number,
)
from heads_lab.training import stops

RERUN_ENV = "HEADS_LAB_RERUN"  # --rerun, for this process and launchers' worker processes
SWEEP_KEYS_ENV = "HEADS_LAB_SWEEP_KEYS"
FIXED_OVERRIDES: set[str] = set()  # a sweep's overrides that every job shares


def is_multirun(overrides: list[str]) -> bool:
    return "-m" in overrides or "--multirun" in overrides


def refuse_finished_run_dir(overrides: list[str]) -> None:
    """An explicit `hydra.run.dir` holding a finished run fails before Hydra writes anything
    into it. An explicit `hydra.sweep.dir` may hold finished jobs of the same sweep (they are
    skipped), but not a finished run of any other config."""
    sweep = is_multirun(overrides)
    key = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    for item in overrides:
        where = dir_override(item, key)
        if where is None:
            continue
        finished = finished_runs(where) if where.is_dir() else []
        if not finished:
            continue
        if not sweep:
            raise finished_run(finished[0].parent)
        jobs = sweep_jobs(overrides) or []  # unknown (unparsable) jobs: refuse, to be safe
        for path in finished:
            try:
                done = by_key(json.loads(path.read_text()).get("overrides", []))
            except (OSError, json.JSONDecodeError):
                done = {}
            if done not in jobs:  # a finished job of this very sweep is skipped, not refused
                raise finished_run(path.parent, key, _differs(done, jobs))


def _differs(done: dict[str, str], jobs: list[dict[str, str]]) -> str:
    """' of other settings (it has ...; the nearest job of this sweep has ...)': how a
    finished run differs from the sweep's job nearest to it (the fewest settings apart); ''
    when there is no job."""
    if not jobs:
        return ""
    def apart(job: dict[str, str]) -> list[str]:
        return sorted({k for k in {*done, *job} if done.get(k) != job.get(k)})
    keys, job = min(((apart(job), job) for job in jobs), key=lambda pair: len(pair[0]))
    def said(settings: dict[str, str]) -> str:
        return ", ".join(f"{k}={settings[k]}" if k in settings else f"{k} at its default"
                         for k in keys)
    return (f" of other settings (it has {said(done)}; the nearest job of this sweep has "
            f"{said(job)})")


def finished_runs(where: Path) -> list[Path]:
    """The results.json of the train runs under `where`; not those of runs derived from one
    and kept inside it (heads-lab prune's gates runs, <run>/prune/...)."""
    found = sorted(where.rglob("results.json"))
    runs = {p.parent for p in found} | {p.parent.parent for p in where.rglob(".hydra/config.yaml")}
    return [p for p in found if not any(a in runs for a in p.parent.parents)]


def by_key(overrides: list[str]) -> dict[str, str]:
    """Overrides as {key: value}, the last one of a key winning (as Hydra applies them)."""
    return dict(o.split("=", 1) if "=" in o else (o, "") for o in overrides)


def is_hydra_override(override: str) -> bool:
    """`hydra.sweep.dir=...`, `hydra/launcher=local`, `+hydra.x=...`: Hydra's own settings,
    which a job's results.json (its task overrides) never lists."""
    return override.lstrip("+~").startswith(("hydra.", "hydra/"))


def job_overrides(overrides: list[str]) -> list[list[str]]:
    """Every job's overrides, as Hydra's basic sweeper forms them: the command line's sweeps and
    the preset's hydra.sweeper.params (the command line wins for a key). Raises on sweep syntax
    only Hydra's sweeper understands."""
    plain = [o for o in overrides if not o.startswith("-")]
    try:
        params = compose([o for o in plain if "," not in o.split("=", 1)[-1]],
                         hydra=True).hydra.sweeper.params or {}
    except Exception:  # a bad fixed override: each job's own composition names it
        params = {}
    given = {o.split("=", 1)[0] for o in plain}
    return expand_sweeps(plain + [f"{k}={v}" for k, v in params.items() if k not in given])


def sweep_jobs(overrides: list[str]) -> list[dict[str, str]] | None:
    """Every job's task overrides as {key: value} (None when they cannot be worked out)."""
    try:
        return [by_key([o for o in job if not is_hydra_override(o)])
                for job in job_overrides(overrides)]
    except Exception:
        return None


def check_writable_run_dir(overrides: list[str]) -> None:
    """An explicit run or sweep dir that cannot be created fails in one line before Hydra
    tries (a path under a file, a read-only or full filesystem)."""
    for item in overrides:
        for key in ("hydra.run.dir", "hydra.sweep.dir"):
            where = dir_override(item, key)
            if where is not None:
                ensure_writable(where, key)


def check_sweep(overrides: list[str]) -> None:
    """Compose and validate every job of a sweep before the first one starts: a bad value in
    one job fails at once, in one line naming the job, and nothing runs."""
    plain = [o for o in overrides if o not in ("-m", "--multirun")]
    if any(o.startswith("-") for o in plain):
        return  # other Hydra flags (--cfg, -c ...): leave them to Hydra
    try:
        jobs = job_overrides(plain)
    except Exception:  # sweep syntax only Hydra's sweeper understands, or a composition error
        return  # Hydra reports it itself, in one line through _one_line
    varying = [i for i in range(len(jobs[0])) if len({job[i] for job in jobs}) > 1]
    for job in jobs:
        try:
            run = to_object(compose(job))
            validate(run)
            check_installed(run.logger)
            _preflight(run.data)
            if str(run.trainer.precision) == "bf16":  # stop once, not once per job
                # lazy: start-up time (torch)
                from heads_lab.training.device import check_precision, resolve_device

                check_precision(resolve_device(run.trainer.device), "bf16")
        except (HeadsLabError, HydraException, OmegaConfBaseException) as err:
            label = ",".join(job[i] for i in varying) or " ".join(job)
            raise ConfigError(f"sweep job {label}: {one_line(err)} (no job was run)") from None


def check_run(overrides: list[str]) -> None:
    """A single run checked as a sweep's jobs are, before Hydra creates its run dir: the
    config's relations (validate), its tracker installed, its data source (sources.preflight):
    `model.heads=3` with d_model 256 or a damaged Tatoeba zip fails in one line and nothing is
    written. A config that does not compose is left to Hydra, which reports it in one line."""
    if any(o.startswith("-") for o in overrides):
        return  # --cfg, --help ...: nothing is trained
    try:
        run = to_object(compose(overrides))
    except Exception:  # noqa: BLE001 (Hydra reports it in one line when it composes)
        return
    validate(run)
    check_installed(run.logger)
    _preflight(run.data)


def _preflight(data) -> None:
    from heads_lab.data.sources import preflight  # lazy: start-up time (the data package)

    preflight(data)


def finished_job(run_dir: Path, hydra_cfg) -> float | None:
    """A sweep run again into the same dir (hydra.sweep.dir=...) skips the jobs whose results
    are complete, so a crashed or timed-out sweep resumes where it stopped; unfinished jobs
    resume from their checkpoints. With --rerun a finished job's results, outputs and
    checkpoints move into <job dir>/previous-<time>/ and the job runs afresh."""
    done = run_dir / "results.json"
    if not done.is_file():
        return None
    if os.environ.get(RERUN_ENV) == "1":  # keep the earlier results: into previous-<time>/
        aside = run_dir / f"previous-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.mkdir()
        for item in run_dir.iterdir():
            if item.name in ("results.json", "checkpoints", "evals", *RUN_FILES) or \
                    item.suffix == ".txt":
                item.rename(aside / item.name)
        print(f"job {hydra_cfg.job.num}: earlier results moved to {aside}; running again",
              file=sys.stderr)
        return None
    print(f"job {hydra_cfg.job.num} ({run_dir.name}) is already complete: skipped "
          "(--rerun runs it again)", file=sys.stderr)
    return json.loads(done.read_text()).get("metrics", {}).get("valid/loss")


@contextlib.contextmanager
def user_errors(hydra_cfg):
    """A user error inside a job: one line on stderr. A single run exits 2 at once; in a sweep
    the job is recorded as failed and the other jobs run (main() exits 2 at the end)."""
    from heads_lab.training.state import Preempted  # lazy: start-up time (torch)

    try:
        yield
    except KeyboardInterrupt:  # Ctrl-C outside training's stop signals (the final evaluation)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            raise
        print(f"error: interrupted; run the same command with "
              f"{dir_arg('hydra.run.dir', hydra_cfg.runtime.output_dir)} to resume (a run whose "
              "training had ended is evaluated again from its last checkpoint)", file=sys.stderr)
        raise SystemExit(130) from None
    except Preempted as err:  # a stop signal: the whole command stops, resumable, not failed
        requeued = scheduler_handler(err.signal_name) is not None  # SLURM resumes it itself
        if hydra_cfg.mode != RunMode.MULTIRUN:  # the advice names this run's dir, as typed
            advice = ("" if requeued else "; run the same command with "
                      f"{dir_arg('hydra.run.dir', hydra_cfg.runtime.output_dir)} to resume")
            print(f"error: {err.stopped}{advice}", file=sys.stderr)
        else:
            job = job_label(list(hydra_cfg.overrides.task), hydra_cfg.job.num)
            advice = ("" if requeued else "; run the same sweep command with "
                      f"{dir_arg('hydra.sweep.dir', hydra_cfg.sweep.dir)} to resume it")
            say_line(f"error: {job_title(hydra_cfg.job.num, job)}: {err.stopped}{advice}")
            if in_worker():  # return: joblib would kill the other workers, mid-checkpoint
                record_stopped(Path(hydra_cfg.runtime.output_dir), err.signal_name, job,
                               err.stopped)
                with contextlib.suppress(OSError, ValueError):  # the whole sweep stops
                    os.kill(int(os.environ[SWEEP_PID_ENV]), signal_number(err.signal_name))
                return
        pass_on(err.signal_name)
        raise SystemExit(128 + signal_number(err.signal_name)) from None
    except HeadsLabError as err:
        if os.environ.get("HEADS_LAB_TRACEBACK"):
            raise
        if hydra_cfg.mode != RunMode.MULTIRUN:
            print(f"error: {err}", file=sys.stderr)
            kept_config.restore(Path(hydra_cfg.runtime.output_dir))  # an earlier run's
            discard_unstarted(Path(hydra_cfg.runtime.output_dir))
            raise SystemExit(2) from None
        job = job_label(list(hydra_cfg.overrides.task), hydra_cfg.job.num)
        say_line(f"error: {job_title(hydra_cfg.job.num, job)}: {err}")
        FAILED_JOBS.append(job)
        record_failure(Path(hydra_cfg.runtime.output_dir), str(err), job)


STARTUP_FILES = (".hydra", "train.log", "tokenizer.model", LOCK)  # a run's before training


def discard_unstarted(run_dir: Path) -> None:
    """A single run stopped by a user error before it trained (a data file missing, the hub
    unreachable): remove what Hydra and the start wrote (.hydra/, train.log, the tokenizer), so
    no empty run dir is left for `report` to list; the error was said on stderr. A dir holding
    anything else (checkpoints, results, the user's files) is left as it is."""
    if not run_dir.is_dir() or any(p.name not in STARTUP_FILES for p in run_dir.iterdir()):
        return
    for name in STARTUP_FILES:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    cwd = Path.cwd().resolve()
    for folder in (run_dir, *run_dir.resolve().parents):  # and outputs/runs/<date>/ left empty
        if folder == cwd or cwd not in folder.parents and folder != run_dir:
            break
        try:
            folder.rmdir()  # only an empty one
        except OSError:
            break


def job_label(task: list[str], num: int) -> str:
    """A sweep job named by the settings the sweep varies (model.heads=4,seed=2); in a launcher's
    worker process the parent's SWEEP_KEYS_ENV says which keys those are."""
    keys = os.environ.get(SWEEP_KEYS_ENV)
    if keys:
        wanted = set(json.loads(keys))
        varying = [o for o in task if o.split("=", 1)[0] in wanted]
    else:
        varying = [o for o in task if o not in FIXED_OVERRIDES]
    return ",".join(varying) or f"job {num}"


def job_title(num: int, label: str) -> str:
    """'job 3 (model.heads=4,seed=2)', or 'job 0' where the sweep varies nothing."""
    return label if label == f"job {num}" else f"job {num} ({label})"


def not_started(hydra_cfg) -> bool:
    """In a sweep on worker processes, before a job: whether the sweep is stopping (a stop signal
    reached this worker, or the sweep's STOPPING file exists); then the job does not start, and
    says so in its stopped.json. From its first job on, a worker catches stop signals
    (stops.keep_stop_signals)."""
    if SWEEP_PID_ENV not in os.environ:  # not a sweep on worker processes
        return False
    # (joblib runs a 1-worker sweep's jobs in this process: there the sweep's own handler
    # catches a stop signal between jobs, and the STOPPING file says so)
    name = stops.keep_stop_signals() if in_worker() else None
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if (run_dir / "results.json").is_file():  # finished: finished_job skips it
        return False
    if name is None:
        with contextlib.suppress(OSError):  # the sweep stopped while this worker started up
            name = Path(str(hydra_cfg.sweep.dir), STOPPING).read_text().strip() or "SIGTERM"
    if name is None:
        return False
    job = job_label(list(hydra_cfg.overrides.task), hydra_cfg.job.num)
    record_stopped(run_dir, name, job, f"not started: the sweep was stopped by {name}")
    return True


def prepare(overrides: list[str]) -> list[str]:
    """Before Hydra starts: read --rerun, refuse a finished run dir, check the dirs are
    writable and every sweep job composes; --rerun (RERUN_ENV) and the settings a sweep varies
    (SWEEP_KEYS_ENV) go to the environment, where launchers' worker processes see them (the keys
    name each job's tracker run, h=8,seed=2). Returns the overrides for Hydra."""
    if "--rerun" in overrides:
        os.environ[RERUN_ENV] = "1"
    else:
        os.environ.pop(RERUN_ENV, None)
    overrides = [o for o in overrides if o != "--rerun"]
    check_parses(overrides)
    refuse_finished_run_dir(overrides)  # a sweep may hold its own finished jobs (skipped)
    os.environ.pop(SWEEP_KEYS_ENV, None)
    if not is_multirun(overrides):
        check_run(overrides)
    else:
        check_sweep(overrides)
        jobs = sweep_jobs(overrides)
        if jobs:
            keys = sorted({k for job in jobs for k in job
                           if len({job_.get(k) for job_ in jobs}) > 1})
            os.environ[SWEEP_KEYS_ENV] = json.dumps(keys)
    check_writable_run_dir(overrides)  # after the config checks: a bad config creates no dir
    FAILED_JOBS.clear()
    FIXED_OVERRIDES.clear()
    FIXED_OVERRIDES.update(o for o in overrides if "," not in o.split("=", 1)[-1])
    return overrides
