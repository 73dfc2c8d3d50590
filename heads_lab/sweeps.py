"""Hydra sweeps, as heads-lab runs them: every job composed and checked before the first one
starts; a sweep run again into its dir skips its finished jobs (--rerun runs them again, keeping
their results aside) and resumes the others; a finished run of another config is never
overwritten; a job's user error is recorded (failed.json) and counted, the other jobs run."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from heads_lab import stops
from heads_lab.errors import one_line

RERUN: list[str] = []
SWEEP_KEYS_ENV = "HEADS_LAB_SWEEP_KEYS"
FAILED_JOBS: list[str] = []
FIXED_OVERRIDES: set[str] = set()  # a sweep's overrides that every job shares


def is_multirun(overrides: list[str]) -> bool:
    return "-m" in overrides or "--multirun" in overrides


# Launchers whose jobs run in worker processes of this command (hydra/launcher=local or joblib),
# by their _target_, however chosen (command line, a preset's defaults, a user's config).
WORKER_LAUNCHERS = ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",)
_ARM: list = []  # set by forward_stop_signals; called by CountFailures.on_multirun_start
SWEEP_PID_ENV = "HEADS_LAB_SWEEP_PID"  # the sweep's own process, seen by its worker processes
STOPPING = ".stopping"  # in the sweep dir while a stopping sweep waits for its jobs


def children(pid: int) -> list[int]:
    """The processes `pid` started itself (Linux /proc; elsewhere none): a sweep's workers, not
    the processes those start (a wandb service, say)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (Linux /proc; elsewhere False): a
    worker that would die of a stop signal (idle, or still starting) is not sent one."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def start_resource_trackers() -> None:
    """Start the helper processes joblib's workers need (loky's and multiprocessing's resource
    trackers) now: each unblocks SIGINT in this thread when it starts, which would let Ctrl-C
    reach workers that are not yet in a job (forward_stop_signals)."""
    from multiprocessing import resource_tracker

    from joblib.externals.loky.backend import resource_tracker as loky_tracker

    for tracker in (loky_tracker, resource_tracker):
        with contextlib.suppress(Exception):  # none here: the launcher starts it as before
            tracker.ensure_running()


def in_worker() -> bool:
    """Whether this process runs jobs for a sweep's own process (a joblib worker)."""
    pid = os.environ.get(SWEEP_PID_ENV)
    return bool(pid) and pid != str(os.getpid())


@contextlib.contextmanager
def forward_stop_signals():
    """A sweep whose jobs run in worker processes (WORKER_LAUNCHERS): SIGTERM or SIGUSR2 sent to
    this process (`kill <pid>`, a batch system stopping the command), Ctrl-C, or a stop signal
    that reached one worker's job goes on to every worker as SIGTERM (as SIGUSR2 for SIGUSR2);
    the running jobs save a checkpoint and stop, and no further job starts (the sweep dir's
    STOPPING file tells a worker still starting up). This process waits until every running job
    has saved its checkpoint (a stopped job returns instead of raising: joblib kills all its
    workers when a job raises, and used to kill the others mid-save), then exits 128 + the
    signal, saying to run the same command with hydra.sweep.dir=<its dir> to resume (a default
    sweep dir is new each time). A second Ctrl-C stops at once. The workers start with SIGINT
    blocked, so that Ctrl-C from the terminal reaches this process only (a worker not yet in a
    job would die of it, and joblib would then kill the others); only workers that catch
    SIGTERM (those in a job, or past one) are sent it (Linux: /proc; elsewhere the workers
    get Ctrl-C from the terminal, as before). The handlers go in once the sweep's
    config says which launcher runs it (CountFailures.on_multirun_start)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous: dict = {}
    sweep_dir: list[str] = []
    wake, done = threading.Event(), threading.Event()
    blocked: list = []

    def forward() -> None:  # started before SIGINT is blocked: Ctrl-C is delivered to it
        wake.wait()
        onward = signal.SIGUSR2 if received and received[0] == signal.SIGUSR2 else signal.SIGTERM
        sent: set[int] = set()
        while not done.is_set():  # a worker in its job's first seconds catches it later
            for pid in children(os.getpid()):
                if pid not in sent and catches(pid, onward):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, onward)
                    sent.add(pid)
            done.wait(0.1)

    def handler(signum, frame):
        if signum == signal.SIGINT and signal.SIGINT in received:
            raise KeyboardInterrupt  # a second Ctrl-C: joblib kills the workers
        received.append(signum)
        if len(received) == 1:
            print(f"{signal.Signals(signum).name} received: the running jobs save a checkpoint "
                  "and stop; no further job starts", file=sys.stderr)
            with contextlib.suppress(OSError):
                Path(sweep_dir[0], STOPPING).write_text(signal.Signals(signum).name)
            wake.set()

    handler.stops_heads_lab = True  # not a scheduler's handler (scheduler_handler)
    thread = threading.Thread(target=forward, daemon=True, name="heads-lab stop")

    def arm(directory: str) -> None:
        sweep_dir[:] = [directory]
        os.environ[SWEEP_PID_ENV] = str(os.getpid())  # the workers learn they are workers
        Path(directory, STOPPING).unlink(missing_ok=True)
        previous.update({s: signal.signal(s, handler) for s in stops.stop_signal_numbers()
                         if s not in previous})
        if not blocked and Path("/proc/self/status").is_file():  # else Ctrl-C reaches them
            thread.start()
            start_resource_trackers()  # their start unblocks SIGINT again: start them first
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # workers inherit it
            blocked.append(signal.SIGINT)

    _ARM.append(arm)
    try:
        yield
    except BaseException:  # the launcher gives up (a second Ctrl-C, a worker killed)
        if not received:
            raise
    finally:
        done.set()
        wake.set()
        _ARM.remove(arm)
        os.environ.pop(SWEEP_PID_ENV, None)
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
        for s, h in previous.items():
            signal.signal(s, h)
        if sweep_dir:
            Path(sweep_dir[0], STOPPING).unlink(missing_ok=True)
    if received:
        print(f"error: sweep stopped by {signal.Signals(received[0]).name}: run the same "
              f"command with hydra.sweep.dir={sweep_dir[0]} to resume (finished jobs are "
              "skipped, stopped ones resume from their checkpoints)", file=sys.stderr)
        raise SystemExit(128 + received[0])


def refuse_finished_run_dir(overrides: list[str]) -> None:
    """An explicit `hydra.run.dir` holding a finished run fails before Hydra writes anything
    into it. An explicit `hydra.sweep.dir` may hold finished jobs of the same sweep (they are
    skipped), but not a finished run of any other config."""
    from heads_lab.errors import finished_run

    sweep = is_multirun(overrides)
    key = "hydra.sweep.dir=" if sweep else "hydra.run.dir="
    for item in overrides:
        if not item.startswith(key):
            continue
        where = Path(item.split("=", 1)[1])
        finished = sorted(where.rglob("results.json")) if where.is_dir() else []
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
                raise finished_run(path.parent)


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
    from heads_lab.config import compose, expand_sweeps

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
    from heads_lab.runner import ensure_writable

    for item in overrides:
        if item.startswith(("hydra.run.dir=", "hydra.sweep.dir=")):
            key, where = item.split("=", 1)
            ensure_writable(Path(where), key)


def check_sweep(overrides: list[str]) -> None:
    """Compose and validate every job of a sweep before the first one starts: a bad value in
    one job fails at once, in one line naming the job, and nothing runs."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from heads_lab.config import compose, to_object, validate
    from heads_lab.errors import ConfigError, HeadsLabError

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
            if str(run.trainer.precision) == "bf16":  # stop once, not once per job
                from heads_lab.device import check_precision, resolve_device

                check_precision(resolve_device(run.trainer.device), "bf16")
        except (HeadsLabError, HydraException, OmegaConfBaseException) as err:
            label = ",".join(job[i] for i in varying) or " ".join(job)
            raise ConfigError(f"sweep job {label}: {one_line(err)} (no job was run)") from None


def finished_job(run_dir: Path, hydra_cfg) -> float | None:
    """A sweep run again into the same dir (hydra.sweep.dir=...) skips the jobs whose results
    are complete, so a crashed or timed-out sweep resumes where it stopped; unfinished jobs
    resume from their checkpoints. With --rerun a finished job's results, outputs and
    checkpoints move into <job dir>/previous-<time>/ and the job runs afresh."""
    import time

    done = run_dir / "results.json"
    if not done.is_file():
        return None
    if RERUN:  # keep the earlier results: move them into previous-<time>/ in the run dir
        aside = run_dir / f"previous-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.mkdir()
        for item in run_dir.iterdir():
            if item.name in ("results.json", "checkpoints", "evals", "wandb-run-id") or \
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
    from hydra.types import RunMode

    from heads_lab.errors import HeadsLabError
    from heads_lab.train import Preempted

    try:
        yield
    except Preempted as err:  # a stop signal: the whole command stops, resumable, not failed
        requeued = scheduler_handler(err.signal_name) is not None  # SLURM resumes it itself
        if hydra_cfg.mode != RunMode.MULTIRUN:
            print(f"error: {err.stopped if requeued else err}", file=sys.stderr)
        else:
            job = job_label(list(hydra_cfg.overrides.task), hydra_cfg.job.num)
            advice = ("" if requeued else "; run the same sweep command with hydra.sweep.dir="
                      f"{hydra_cfg.sweep.dir} to resume it")
            print(f"error: job {hydra_cfg.job.num} ({job}): {err.stopped}{advice}",
                  file=sys.stderr)
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
            raise SystemExit(2) from None
        job = job_label(list(hydra_cfg.overrides.task), hydra_cfg.job.num)
        print(f"error: job {hydra_cfg.job.num} ({job}): {err}", file=sys.stderr)
        FAILED_JOBS.append(job)
        record_failure(Path(hydra_cfg.runtime.output_dir), str(err), job)


def job_label(task: list[str], num: int) -> str:
    """A sweep job named by the settings the sweep varies (model.heads=4,seed=2); in a launcher's
    worker process the parent's SWEEP_KEYS_ENV says which keys those are."""
    keys = os.environ.get(SWEEP_KEYS_ENV)
    if keys:
        wanted = set(json.loads(keys))
        varying = [o for o in task if o.split("=", 1)[0] in wanted]
    else:
        varying = [o for o in task if o not in FIXED_OVERRIDES]
    return ",".join(varying) or str(num)


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


def record_stopped(run_dir: Path, signal_name: str, job: str, what: str) -> None:
    """A sweep job stopped by a signal in a worker process says so in its run dir (stopped.json),
    for `heads-lab report`."""
    from heads_lab.files import write_json

    with contextlib.suppress(OSError):
        write_json(run_dir / "stopped.json", {"status": "stopped", "job": job,
                                              "signal": signal_name, "error": what})


def record_failure(run_dir: Path, error: str, job: str) -> None:
    """A failed sweep job says so in its run dir (failed.json), for `heads-lab report` and for
    the sweep's exit code when the job ran in another process (joblib, submitit, SLURM)."""
    from heads_lab.files import write_json

    try:
        write_json(run_dir / "failed.json", {"status": "failed", "job": job, "error": error})
    except OSError:
        pass


def pass_on(signal_name: str) -> None:
    """After heads-lab's own stop (checkpoint saved), a stop signal goes on to the handler that
    was in place before training began, if it is a program's own: under submitit (SLURM) that
    is its preemption handler, which requeues the job (USR2); the requeued job resumes from the
    checkpoint. A plain command has no such handler and just stops."""
    import signal

    handler = scheduler_handler(signal_name)
    if handler is not None:
        owner = getattr(handler, "__self__", handler)
        print(f"{signal_name} passed on to {type(owner).__module__}.{type(owner).__qualname__} (a "
              "scheduler's handler: SLURM requeues the job, which resumes from the checkpoint)",
              file=sys.stderr)
        handler(signal.Signals[signal_name], None)


def scheduler_handler(signal_name: str):
    """The handler of `signal_name` that was in place before training began, if it is a
    program's own (submitit's preemption handler under SLURM), else None."""
    import signal

    try:
        signum = signal.Signals[signal_name]
    except KeyError:  # "a signal on another rank"
        return None
    handler = signal.getsignal(signum)
    if callable(handler) and handler is not signal.default_int_handler and \
            not stops.caught_by_heads_lab(handler):  # a run's or a sweep's own
        return handler
    return None


class CountFailures(Callback):
    """Hydra callback (conf/hydra/default.yaml): a sweep's failed jobs counted in the process that
    runs the sweep, whichever launcher ran them. Jobs in other processes (joblib, submitit, SLURM)
    say so in their failed.json; those written since the sweep started are this sweep's."""

    def on_multirun_start(self, config, **kwargs) -> None:
        import time

        self.started = time.time() - 1  # file times may be coarser than time.time()
        if str(config.hydra.launcher.get("_target_", "")) in WORKER_LAUNCHERS:
            for arm in list(_ARM):  # forward_stop_signals: stop signals reach the workers
                arm(str(config.hydra.sweep.dir))

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


def signal_number(name: str) -> int:
    import signal

    try:
        return signal.Signals[name].value
    except KeyError:
        return signal.SIGTERM.value


def prepare(overrides: list[str]) -> list[str]:
    """Before Hydra starts: read --rerun, refuse a finished run dir, check the dirs are
    writable and every sweep job composes; the settings a sweep varies go to the environment
    (SWEEP_KEYS_ENV), where launchers' worker processes see them (they name each job's wandb run,
    h=8,seed=2). Returns the overrides for Hydra."""
    RERUN[:] = ["--rerun"] if "--rerun" in overrides else []
    overrides = [o for o in overrides if o != "--rerun"]
    refuse_finished_run_dir(overrides)  # a sweep may hold its own finished jobs (skipped)
    check_writable_run_dir(overrides)
    os.environ.pop(SWEEP_KEYS_ENV, None)
    if is_multirun(overrides):
        check_sweep(overrides)
        jobs = sweep_jobs(overrides)
        if jobs:
            keys = sorted({k for job in jobs for k in job
                           if len({job_.get(k) for job_ in jobs}) > 1})
            os.environ[SWEEP_KEYS_ENV] = json.dumps(keys)
    FAILED_JOBS.clear()
    FIXED_OVERRIDES.clear()
    FIXED_OVERRIDES.update(o for o in overrides if "," not in o.split("=", 1)[-1])
    return overrides


def failures() -> int:
    """After the sweep: its failed jobs on stderr in one line; the exit code (2 if any)."""
    if FAILED_JOBS:
        print(f"error: {len(FAILED_JOBS)} job(s) of the sweep failed: {'; '.join(FAILED_JOBS)} "
              "(each job's error is in its run dir's failed.json)", file=sys.stderr)
        return 2
    return 0
