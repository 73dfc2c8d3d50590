"""An earlier run's .hydra/ kept through a refused start. Hydra writes a run's config files
(.hydra/config.yaml, hydra.yaml, overrides.yaml) before heads-lab's task starts, so `heads-lab
train ... hydra.run.dir=<an earlier run>` with other settings rewrote them before the resume
check refused it, and `eval`, `analyze` and `prune`, which rebuild a run's config from
overrides.yaml, then read the earlier run as the refused one. The callback keeps the files' bytes
when the run starts; a start refused before it trained puts them back."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from hydra.experimental.callback import Callback

# run dir → (its checkpoints then: {name: (size, mtime)}, {.hydra file name: bytes})
KEPT: dict[Path, tuple[dict[str, tuple[int, float]], dict[str, bytes]]] = {}


class KeepEarlierConfig(Callback):
    """Hydra callback (conf/hydra/default.yaml): a single run's dir, where it holds an earlier
    run's .hydra/, has its files kept in memory before Hydra writes the new ones."""

    def on_run_start(self, config, **kwargs) -> None:
        if int(os.environ.get("RANK", "0")) != 0:  # torchrun: the ranks share rank 0's dir
            return
        # a dated default dir may not resolve yet (hydra.job.override_dirname is set later),
        # and is new: there is nothing to keep
        with contextlib.suppress(Exception):
            keep(Path(str(config.hydra.run.dir)))


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
