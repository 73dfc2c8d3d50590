"""An earlier run's .hydra/ kept through a refused start. Hydra writes a run's config files
(.hydra/config.yaml, hydra.yaml, overrides.yaml) before heads-lab's task starts, so `heads-lab
train ... hydra.run.dir=<an earlier run>` with other settings rewrote them before the resume
check refused it, and `eval`, `analyze` and `prune`, which rebuild a run's config from
overrides.yaml, then read the earlier run as the refused one. The callback keeps the files' bytes
when the run starts; a start refused before it trained puts them back."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from hydra.experimental.callback import Callback

from heads_lab.errors import ConfigError
from heads_lab.output.files import lock_dir, moved, unlock_dir

# run dir → (its checkpoints then: {name: (size, mtime)}, {.hydra file name: bytes})
KEPT: dict[Path, tuple[dict[str, tuple[int, float]], dict[str, bytes]]] = {}


class KeepEarlierConfig(Callback):
    """Hydra callback (conf/hydra/default.yaml), before Hydra writes anything: a single run's dir
    is locked for the process's life (a second training into it stops at once: files.lock_dir)
    and, where it holds an earlier run's .hydra/, has its files kept in memory before Hydra
    writes the new ones; a sweep's dir is locked likewise."""

    def on_run_start(self, config, **kwargs) -> None:
        if int(os.environ.get("RANK", "0")) != 0:  # torchrun: the ranks share rank 0's dir
            return
        # (a dated default dir resolves here too: Hydra sets override_dirname when it composes)
        try:
            run_dir = Path(str(config.hydra.run.dir))
        except Exception:  # a dir that does not resolve: nothing to keep or lock
            return
        _locked(run_dir, "hydra.run.dir")
        if _resume_never(config) and _trained(run_dir):
            aside = _set_aside(run_dir)  # (its lock, held, goes with it)
            _locked(run_dir, "hydra.run.dir")
            unlock_dir(aside)
            return
        with contextlib.suppress(Exception):
            keep(run_dir)

    def on_multirun_start(self, config, **kwargs) -> None:
        try:
            sweep_dir = Path(str(config.hydra.sweep.dir))
        except Exception:  # as above: a dir that does not resolve yet
            return
        _locked(sweep_dir, "hydra.sweep.dir")


def _resume_never(config) -> bool:
    with contextlib.suppress(Exception):
        return str(config.trainer.resume) == "never"
    return False


def _trained(run_dir: Path) -> bool:
    """Whether `run_dir` holds a run that trained and did not finish (its checkpoints); a
    finished one (results.json) is refused later, as with resume=auto."""
    folder = run_dir / "checkpoints"
    return (not (run_dir / "results.json").is_file() and folder.is_dir()
            and any(folder.iterdir()))


def _set_aside(run_dir: Path) -> Path:
    """trainer.resume=never over a run that trained: that run moves whole to
    <dir>.prev-<time>, said on stderr, and this one starts in an empty dir (it overwrote the
    earlier run's best.pt and mixed their step checkpoints before)."""
    aside = run_dir.with_name(f"{run_dir.name}.prev-{time.strftime('%Y%m%d-%H%M%S')}")
    try:  # renamed while locked: no other heads-lab can start in it meanwhile
        run_dir.rename(aside)
    except OSError as err:
        print(f"error: trainer.resume=never would move the run in {run_dir} aside, to {aside}, "
              f"and cannot ({err.strerror or err}); move or delete it yourself, or choose "
              "another hydra.run.dir", file=sys.stderr)
        raise SystemExit(2) from None
    moved(run_dir, aside)
    print(f"trainer.resume=never: the run that was in {run_dir} (its checkpoints, config and "
          f"log) is now in {aside}; this one starts afresh", file=sys.stderr)
    return aside


def _locked(path: Path, key: str) -> None:
    """files.lock_dir, its refusal said in one line and exit 2 here: Hydra turns an exception
    in a callback into a warning and goes on (SystemExit passes through it)."""
    try:
        lock_dir(path, key)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def _checkpoints(run_dir: Path) -> dict[str, tuple[int, float]]:
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return {}
    return {p.name: (p.stat().st_size, p.stat().st_mtime) for p in folder.iterdir()}


def keep(run_dir: Path) -> None:
    folder = run_dir / ".hydra"
    if folder.is_dir():
        files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
        KEPT[run_dir.resolve()] = (_checkpoints(run_dir), files)


def restore(run_dir: Path) -> bool:
    """Put back the earlier .hydra/ files of `run_dir`, unless its checkpoints changed since they
    were kept (the run trained: its config is the new one). True when they were put back."""
    before, files = KEPT.pop(run_dir.resolve(), (None, None))
    if not files or _checkpoints(run_dir) != before:
        return False
    folder = run_dir / ".hydra"
    folder.mkdir(exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return True
