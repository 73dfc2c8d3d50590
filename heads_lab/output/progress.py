"""Progress a person can follow in a log: one line at most every `every_s` seconds (and one at
the end) for the long commands that have no training loop — analyze (maps, importance, LRP),
prune (gate training, pruning curves), report over many runs — in the form the training loop's
line takes (`what i/n (p %)  elapsed h:mm:ss  ETA h:mm:ss`), so a SLURM .out file, nohup or CI
log shows where a run is. The line goes to the module logger of the command (its log file and
stderr); nothing is printed for work that finishes before the first interval."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
EVERY_S = 30.0


def clock(seconds: float) -> str:
    """h:mm:ss."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Steps:
    """Counts steps of a known total and logs where it is, at most every `every_s` seconds."""

    def __init__(self, what: str, total: int, log: logging.Logger, every_s: float = EVERY_S,
                 unit: str = ""):
        self.what, self.total, self.log, self.every_s = what, total, log, every_s
        self.unit = f" {unit}" if unit else ""
        self.done = 0
        self.started = self.last = time.monotonic()
        self.said = False

    def line(self) -> str:
        spent = time.monotonic() - self.started
        share = self.done / self.total if self.total else 1.0
        eta = clock(spent / self.done * (self.total - self.done)) if self.done else "?"
        return (f"{self.what} {self.done}/{self.total}{self.unit} ({share:.0%})  "
                f"elapsed {clock(spent)}  ETA {eta}")

    def step(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.every_s and self.done < self.total:
            self.last, self.said = now, True
            self.log.info(self.line())

    def finish(self) -> None:
        """The closing line, if a progress line was written before (short work stays quiet)."""
        if self.said:
            self.log.info(self.line())


def steps(items: Iterable[T], what: str, total: int, log: logging.Logger,
          every_s: float = EVERY_S, unit: str = "") -> Iterator[T]:
    """`items`, logging progress as they are consumed (see `Steps`)."""
    counter = Steps(what, total, log, every_s, unit)
    for item in items:
        yield item
        counter.step()
    counter.finish()


def console_handler(show_path: bool = False, markup: bool = False) -> logging.Handler:
    """The console's log handler (conf/hydra/*_logging/rich.yaml): rich's on a terminal; plain
    lines on stdout elsewhere (a SLURM .out, nohup, a CI log), one line per record, never
    wrapped at 80 columns or padded, so a progress line keeps its `elapsed … ETA` and a path its
    characters."""
    from rich.console import Console  # lazy: start-up time (rich), and only on a terminal
    from rich.logging import RichHandler  # lazy: as above

    console = Console()
    if console.is_terminal:
        return RichHandler(console=console, show_path=show_path, markup=markup)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)s %(message)s",
                                           datefmt="%m/%d/%y %H:%M:%S"))
    return handler
