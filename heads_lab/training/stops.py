"""The stop signals of a run: SIGTERM, SIGINT and SIGUSR2 ask training to save a checkpoint and
stop. Kept light (no torch): a sweep's worker installs the handler first thing in a job, and the
sweep's own process asks whether a handler is heads-lab's."""

from __future__ import annotations

import contextlib
import logging
import signal

log = logging.getLogger(__name__)

_STOPS: list[str] = []  # the stop signals received while _on_stop was installed


def _on_stop(signum, frame):
    name = signal.Signals(signum).name
    if name == "SIGINT" and "SIGINT" in _STOPS:  # a second Ctrl-C
        raise KeyboardInterrupt
    _STOPS.append(name)
    log.warning("%s received: saving a checkpoint after this update, then stopping", name)


def stop_signal_numbers() -> list[signal.Signals]:
    return [signal.SIGTERM, signal.SIGINT] + ([signal.SIGUSR2] if hasattr(signal, "SIGUSR2")
                                              else [])


@contextlib.contextmanager
def stop_signals():
    """SIGTERM, SIGINT and SIGUSR2 (a scheduler's preemption or time-limit warning, Ctrl-C)
    ask the training loop to save a checkpoint after the current update and stop; a second
    Ctrl-C stops at once. Yields the function the loop polls (the signal's name, or None).
    In a sweep's worker process the handler is already in place (keep_stop_signals) and stays."""
    poll = lambda: _STOPS[0] if _STOPS else None  # noqa: E731
    if signal.getsignal(signal.SIGTERM) is _on_stop:  # kept: a sweep's worker process
        yield poll
        return
    _STOPS.clear()
    try:
        previous = {s: signal.signal(s, _on_stop) for s in stop_signal_numbers()}
    except ValueError:  # not the main thread: leave signals alone
        yield lambda: None
        return
    try:
        yield poll
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


_on_stop.stops_heads_lab = True


def caught_by_heads_lab(handler) -> bool:
    """Whether a signal handler is heads-lab's own (a run's or a sweep's), not a scheduler's."""
    return bool(getattr(handler, "stops_heads_lab", False))


def keep_stop_signals() -> str | None:
    """In a sweep's worker process (joblib): stop signals are caught from its first job on, and
    stay caught between jobs, so that one arriving while a job starts or between two jobs is
    neither lost nor fatal (a worker killed by it made joblib kill the others, mid-checkpoint).
    Returns the stop signal this process has received (no further job starts), or None."""
    if signal.getsignal(signal.SIGTERM) is not _on_stop:
        _STOPS.clear()
        for s in stop_signal_numbers():
            signal.signal(s, _on_stop)
    return _STOPS[0] if _STOPS else None
