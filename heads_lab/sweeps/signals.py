"""Stop signals in a sweep: forwarded from the sweep's own process to its worker processes
(hydra/launcher=local, joblib), so the running jobs save a checkpoint and stop and no further job
starts; and passed on, after heads-lab's own stop, to a scheduler's handler (SLURM requeues)."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import sys
import threading
from multiprocessing import resource_tracker
from pathlib import Path

from heads_lab.training import stops

# Launchers whose jobs run in worker processes of this command (hydra/launcher=local or joblib,
# and submitit_local),
# by their _target_, however chosen (command line, a preset's defaults, a user's config).
WORKER_LAUNCHERS = ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
                    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher")
SLURM_LAUNCHER = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"


_ARM: list = []  # set by forward_stop_signals; called by CountFailures.on_multirun_start


SWEEP_PID_ENV = "HEADS_LAB_SWEEP_PID"  # the sweep's own process, seen by its worker processes


STOPPING = ".stopping"  # in the sweep dir while a stopping sweep waits for its jobs


def dir_arg(key: str, path) -> str:
    """`key=path` as a user types it into a shell so that Hydra reads it back: a path with
    anything but plain characters is quoted for Hydra ('...', its quotes escaped) and the whole
    quoted again for the shell (no expansion of $, `, !)."""
    text = str(path)
    if re.fullmatch(r"[A-Za-z0-9_./:+@%-]+", text):
        return f"{key}={text}"
    tail = "\\" if text.endswith("\\") else ""  # Hydra escapes a backslash only before a
    if "'" not in text:  # quote or at the end; Hydra's "..." inside the shell's '...'
        return "'" + key + '="' + text.replace('"', '\\"') + tail + '"' + "'"
    return shlex.quote(f"{key}='" + text.replace("'", "\\'") + tail + "'")


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
    # lazy: optional dependency (joblib comes with the launchers extra; only a joblib sweep gets here)
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
    """A sweep whose jobs run in worker processes (WORKER_LAUNCHERS: joblib's workers, or
    submitit_local's job processes, each passing a SIGTERM on to its job): SIGTERM or SIGUSR2 sent
    to this process (`kill <pid>`, a batch system stopping the command), Ctrl-C, or a stop signal
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
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    forwarder = _StopForwarder()
    _ARM.append(forwarder.arm)
    try:
        yield
    except BaseException:  # the launcher gives up (a second Ctrl-C, a worker killed)
        if not forwarder.received:
            raise
    finally:
        _ARM.remove(forwarder.arm)
        forwarder.restore()
    if forwarder.received:
        signum = forwarder.received[0]
        say_line(f"error: sweep stopped by {signal.Signals(signum).name}: run the same command "
                 f"with {dir_arg('hydra.sweep.dir', forwarder.sweep_dir)} to resume (finished jobs are "
                 "skipped, stopped ones resume from their checkpoints)")
        raise SystemExit(128 + signum)


def say_line(line: str) -> None:
    """One line on stderr in one write, newline included: a sweep's workers share the stream,
    and print's two writes (the text, then the newline) let two jobs' lines run together."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class _StopForwarder:
    """forward_stop_signals' state: the signals received, the handlers it replaced, the sweep
    dir, and the thread that sends each worker its stop signal."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.previous: dict = {}
        self.sweep_dir: str | None = None
        self.wake, self.done = threading.Event(), threading.Event()
        self.blocked: list = []
        self.thread = threading.Thread(target=self.forward, daemon=True, name="heads-lab stop")

    def forward(self) -> None:  # started before SIGINT is blocked: Ctrl-C is delivered to it
        self.wake.wait()
        received = self.received
        onward = signal.SIGUSR2 if received and received[0] == signal.SIGUSR2 else signal.SIGTERM
        sent: set[int] = set()
        while not self.done.is_set():  # a worker in its job's first seconds catches it later
            for pid in children(os.getpid()):
                if pid not in sent and catches(pid, onward):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, onward)
                    sent.add(pid)
            self.done.wait(0.1)

    def handler(self, signum, frame) -> None:
        if signum == signal.SIGINT and signal.SIGINT in self.received:
            raise KeyboardInterrupt  # a second Ctrl-C: joblib kills the workers
        self.received.append(signum)
        if len(self.received) == 1:
            print(f"{signal.Signals(signum).name} received: the running jobs save a checkpoint "
                  "and stop; no further job starts", file=sys.stderr)
            with contextlib.suppress(OSError):
                Path(self.sweep_dir, STOPPING).write_text(signal.Signals(signum).name)
            self.wake.set()

    handler.stops_heads_lab = True  # not a scheduler's handler (scheduler_handler)

    def arm(self, directory: str) -> None:
        self.sweep_dir = directory
        os.environ[SWEEP_PID_ENV] = str(os.getpid())  # the workers learn they are workers
        Path(directory, STOPPING).unlink(missing_ok=True)
        self.previous.update({s: signal.signal(s, self.handler) for s in stops.stop_signal_numbers()
                              if s not in self.previous})
        if not self.blocked and Path("/proc/self/status").is_file():  # else Ctrl-C reaches them
            self.thread.start()
            start_resource_trackers()  # their start unblocks SIGINT again: start them first
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # workers inherit it
            self.blocked.append(signal.SIGINT)

    def restore(self) -> None:
        """The handlers, the signal mask and the environment as they were; the STOPPING file gone."""
        self.done.set()
        self.wake.set()
        os.environ.pop(SWEEP_PID_ENV, None)
        if self.blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, self.blocked)
        for s, h in self.previous.items():
            signal.signal(s, h)
        if self.sweep_dir:
            Path(self.sweep_dir, STOPPING).unlink(missing_ok=True)


def pass_on(signal_name: str) -> None:
    """After heads-lab's own stop (checkpoint saved), a stop signal goes on to the handler that
    was in place before training began, if it is a program's own: under submitit (SLURM) that
    is its preemption handler, which requeues the job (USR2); the requeued job resumes from the
    checkpoint. A plain command has no such handler and just stops."""
    handler = scheduler_handler(signal_name)
    if handler is not None:
        owner = getattr(handler, "__self__", handler)
        print(f"{signal_name} passed on to {type(owner).__module__}.{type(owner).__qualname__} (a "
              "scheduler's handler: SLURM requeues the job, which resumes from the checkpoint)",
              file=sys.stderr)
        # SLURM's requeue sends SIGTERM to every process of the job, the `scontrol requeue`
        # the handler runs among them: ignored here, and so in that child (an ignored signal
        # stays ignored through exec), the requeue completes instead of dying mid-call
        with _sigterm_ignored():
            handler(signal.Signals[signal_name], None)


@contextlib.contextmanager
def _sigterm_ignored():
    try:
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # not the main thread: as it was
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def scheduler_handler(signal_name: str):
    """The handler of `signal_name` that was in place before training began, if it is a
    program's own (submitit's preemption handler under SLURM), else None."""
    try:
        signum = signal.Signals[signal_name]
    except KeyError:  # "a signal on another rank"
        return None
    handler = signal.getsignal(signum)
    if callable(handler) and handler is not signal.default_int_handler and \
            not stops.caught_by_heads_lab(handler):  # a run's or a sweep's own
        return handler
    return None


def signal_number(name: str) -> int:
    try:
        return signal.Signals[name].value
    except KeyError:
        return signal.SIGTERM.value
