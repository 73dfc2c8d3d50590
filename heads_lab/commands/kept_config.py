"""An earlier run's .hydra/ kept through a refused start. Hydra writes a run's config files
(.hydra/config.yaml, hydra.yaml, overrides.yaml) before heads-lab's task starts, so `heads-lab
train ... hydra.run.dir=<an earlier run>` with other settings rewrote them before the resume
check refused it, and `eval`, `analyze` and `prune`, which rebuild a run's config from
overrides.yaml, then read the earlier run as the refused one. The callback keeps the files' bytes
when the run starts; a start refused before it trained puts them back."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from hydra.experimental.callback import Callback

KEPT: dict[Path, tuple[float, dict[str, bytes]]] = {}  # run dir → (when, {file name: bytes})


class KeepEarlierConfig(Callback):
    """Hydra callback (conf/hydra/default.yaml): a single run's dir, where it holds an earlier
    run's .hydra/, has its files kept in memory before Hydra writes the new ones."""

    def on_run_start(self, config, **kwargs) -> None:
        # a dated default dir may not resolve yet (hydra.job.override_dirname is set later),
        # and is new: there is nothing to keep
        with contextlib.suppress(Exception):
            keep(Path(str(config.hydra.run.dir)))


def keep(run_dir: Path) -> None:
    folder = run_dir / ".hydra"
    if folder.is_dir():
        files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
        KEPT[run_dir.resolve()] = (time.time(), files)


def restore(run_dir: Path) -> bool:
    """Put back the earlier .hydra/ files of `run_dir`, unless the run wrote a checkpoint since
    they were kept (it trained: its config is the new one). True when they were put back."""
    when, files = KEPT.pop(run_dir.resolve(), (None, None))
    if not files:
        return False
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_dir() and any(p.stat().st_mtime >= when for p in checkpoints.iterdir()):
        return False
    folder = run_dir / ".hydra"
    folder.mkdir(exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return True
