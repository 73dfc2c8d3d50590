"""Training checkpoints that survive crashes, preemption and full disks.

A checkpoint holds the whole training state (model, optimizer, LR schedule, step, epoch and the
position in the epoch's batch order, the RNG states of Python, NumPy and torch, the progress
counters and the config), so a resumed run continues exactly where the saved one stood.

On disk: `MAGIC`, the SHA-256 of the payload, then the payload (torch.save bytes). It is written
to a temp file in the same dir, fsync'ed and renamed over the target, so a reader sees either the
old file or the complete new one; a truncated or corrupt file fails its checksum and is skipped
in favour of the previous one. Loading uses torch.load(weights_only=True): plain tensors, numbers,
strings and containers only, never arbitrary pickled code.

Layout in a run dir: checkpoints/step_0000500.pt ... (the last `keep_last`), checkpoints/best.pt
(lowest validation loss so far; a hard link to its step file where the filesystem allows).
`Checkpoints` is the policy the training loop uses: where to save, what to keep, and which
checkpoint a run may resume from (only one written with the same trajectory-changing settings).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from heads_lab.config.compose import RESUMABLE_CHANGES, is_among, written_before
from heads_lab.config.schemas import TrainerConfig
from heads_lab.errors import CheckpointError

log = logging.getLogger(__name__)
# Settings that may change between a checkpoint and its resumption without changing the run.
MAGIC = b"HEADSLAB-CKPT-1\n"
DIGEST = 32  # bytes of SHA-256
STEP_FILE = re.compile(r"step_(\d+)\.pt$")


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_path(run_dir: Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step_{step:07d}.pt"


def save(path: Path, state: dict[str, Any]) -> None:
    """Write `state` atomically with a checksum. On failure (e.g. the disk is full) the temp
    file is removed, any earlier file at `path` is untouched, and OSError propagates."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getbuffer()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            f.write(hashlib.sha256(payload).digest())
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def load(path: Path) -> dict[str, Any]:
    """Read and verify a checkpoint; CheckpointError says what is wrong with it."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err.strerror or err}") from None
    head = len(MAGIC) + DIGEST
    if len(data) < head or not data.startswith(MAGIC):
        raise CheckpointError(f"{path} is not a heads-lab checkpoint (or is truncated)")
    digest, payload = data[len(MAGIC):head], memoryview(data)[head:]
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"{path} is corrupt or truncated (checksum mismatch)")
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as err:  # a checksum-valid file that torch cannot read: a format change
        raise CheckpointError(f"cannot load checkpoint {path}: {err}") from None


def step_files(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of the run's step checkpoints, newest first."""
    found = []
    folder = checkpoint_dir(run_dir)
    if folder.is_dir():
        for path in folder.iterdir():
            match = STEP_FILE.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
    return sorted(found, reverse=True)


def latest(run_dir: Path, warn: bool = True) -> tuple[dict[str, Any], Path] | None:
    """The newest checkpoint that loads and verifies; corrupt ones are skipped with a warning
    (warn=False: silently, where the same scan is made again and warns then). None when the run
    has no checkpoints; CheckpointError when it has some but none is valid."""
    files = step_files(run_dir)
    problems = []
    for _, path in files:
        try:
            return load(path), path
        except CheckpointError as err:
            if warn:
                log.warning("skipping %s; falling back to an earlier checkpoint", err)
            problems.append(path.name)
    if files:
        raise CheckpointError(
            f"{checkpoint_dir(run_dir)} holds no valid checkpoint ({', '.join(problems)} failed "
            "their checks); delete that dir to start the run afresh, or use another run dir")
    return None


def set_aside_newer(run_dir: Path, step: int) -> None:
    """The step checkpoints newer than `step`, the one a run resumes from (so they failed their
    checks), renamed to <name>.corrupt: the rotation counts only valid ones, so it never keeps a
    corrupt file and deletes the valid one the run resumed from."""
    for newer, path in step_files(run_dir):
        if newer > step:
            aside = path.with_name(path.name + ".corrupt")
            os.replace(path, aside)
            log.warning("%s failed its checks: kept as %s, out of the rotation", path.name,
                        aside.name)


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step checkpoints (best.pt is a separate file)."""
    for _, path in step_files(run_dir)[max(keep_last, 1):]:
        path.unlink(missing_ok=True)


def mark_best(run_dir: Path, path: Path) -> None:
    """Make checkpoints/best.pt the checkpoint at `path`: a hard link (no extra space) or a copy,
    swapped in atomically."""
    best = checkpoint_dir(run_dir) / "best.pt"
    tmp = best.with_name("best.pt.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp)
    except OSError:
        tmp.write_bytes(path.read_bytes())
    os.replace(tmp, best)


def rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                       "has_gauss": has_gauss, "gauss": gauss}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["gauss"]))
    if "cuda" in state and torch.cuda.is_available():  # as many GPUs as both machines have
        for i, gpu_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(gpu_state, i)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Checkpoints:
    """Where and how often `train` saves, and what it resumes from. `config` is the run's
    resolved config (stored in each checkpoint and compared on resume). `is_writer` is False on
    data-parallel ranks other than 0: they resume like rank 0 but never write."""

    def __init__(self, run_dir: Path, cfg: TrainerConfig, config: dict[str, Any],
                 is_writer: bool = True):
        self.run_dir, self.cfg, self.config, self.is_writer = Path(run_dir), cfg, config, is_writer
        self.last_path: Path | None = None

    def resume_state(self) -> dict[str, Any] | None:
        if self.cfg.resume != "auto":
            return None
        found = latest(self.run_dir)
        if found is None:
            return None
        state, path = found
        _check_same_run(state.get("config", {}), self.config, path)
        _check_same_precision(state, self.config, self._precision()["precision"], path)
        log.info("resuming from %s (step %d)", path, state["progress"]["step"])
        self.last_path = path
        if self.is_writer:
            set_aside_newer(self.run_dir, state["progress"]["step"])
        return state

    def _precision(self) -> dict[str, str]:
        """{"precision": what the run computes in}: `heads-lab train` resolves `auto` before
        training; the loop alone, given `auto`, computes in fp32 (bf16 autocast only for bf16)."""
        return {"precision": "bf16" if self.cfg.precision == "bf16" else "fp32"}

    def save(self, state: dict[str, Any], step: int, best: bool) -> Path | None:
        if not self.is_writer:
            return None
        path = step_path(self.run_dir, step)
        try:
            # the precision it computes in: with trainer.precision=auto the config alone does not
            # say (bf16 where native), and a resumption on another machine must not switch it
            save(path, {**state, "config": self.config, **self._precision()})
        except OSError as err:
            previous = f"the previous one ({self.last_path.name}) is intact" if self.last_path else \
                "no earlier checkpoint exists"
            log.warning("checkpoint at step %d not saved (%s); %s; training continues",
                        step, err.strerror or err, previous)
            return None
        self.last_path = path
        if best:
            mark_best(self.run_dir, path)
        prune(self.run_dir, self.cfg.keep_last)
        return path


def _check_same_run(saved: dict[str, Any], current: dict[str, Any], path: Path) -> None:
    """A checkpoint resumes only the run that wrote it: compare every setting that changes the
    trajectory (model, data, seed, optimizer, batches, precision). A setting the checkpoint does
    not have was added by a newer heads-lab after it was written: most new settings default to
    the old behaviour, so it resumes, with a warning naming it; where the default changed what
    the run did (config.written_before), the run must name its old value."""
    # lazy: start-up time (rich), kept out of the bench's peak-RSS child processes
    from heads_lab.output.tracking import flatten

    old, new = flatten(saved), flatten(current)
    before = written_before(old)
    for key in sorted(set(old) | set(new)):
        if is_among(key, RESUMABLE_CHANGES) or key == "trainer.precision":  # _check_same_precision
            continue
        if key in before and new.get(key) != before[key]:
            raise CheckpointError(
                f"{path} was written before {key} existed, by a run that started as {key}="
                f"{before[key]}; resume with {key}={before[key]} (the default has changed)")
        if key not in old:
            log.warning("%s has no setting %s (added since it was written); resuming with %s=%r",
                        path.name, key, key, new[key])
            continue
        if old.get(key) != new.get(key):
            raise CheckpointError(
                f"{path} was written by a run with {key}={old.get(key)!r}, not {new.get(key)!r}; "
                "resume with the same settings, or use another run dir (or trainer.resume=never, "
                "which moves this run aside to <dir>.prev-<time>)")


def trained_in(state: dict[str, Any]) -> str | None:
    """The precision a checkpoint's run trained in: recorded in it, else its explicit
    trainer.precision; None for an `auto` run saved before checkpoints recorded it."""
    setting = _precision_setting(state.get("config", {}))
    return state.get("precision") or (setting if setting not in (None, "auto") else None)


def auto_precision(run_dir: Path, native: str) -> str:
    """trainer.precision=auto for a run that may resume from `run_dir`: `native` (bf16 where
    bf16 is native, else fp32) for a new run, and the precision its newest checkpoint trained in
    for a resumed one, so that a run never changes precision midway: fp32 runs anywhere (an
    AVX2 CPU's run resumed on a GPU continues in fp32), bf16 only where it is native (a GPU's
    run cannot resume on an AVX2 CPU: one line saying where it can). An `auto` checkpoint saved
    before checkpoints recorded their precision resumes in `native` (with a warning, on resume)."""
    found = latest(run_dir, warn=False)  # resuming scans again, and warns of what it skips
    trained = trained_in(found[0]) if found else None
    if trained is None or trained == native:
        return native
    path = found[1]
    if trained == "fp32":
        log.info("trainer.precision=auto: %s trained in fp32, so the run resumes in fp32 (bf16 "
                 "is native here)", path.name)
        return "fp32"
    raise CheckpointError(
        f"{path} trained in bf16 (trainer.precision=auto), and bf16 is not native here; resume it "
        "where it is (a GPU, a CPU with AVX512-BF16 or AMX), or use another run dir (or "
        "trainer.resume=never)")


def _check_same_precision(state: dict[str, Any], current: dict[str, Any], computes: str,
                          path: Path) -> None:
    """A run resumes only in the precision it trained in: compare what the checkpoint trained
    in (recorded in it; an explicit fp32 or bf16 setting says it too) with what this run
    computes in (trainer.precision=auto resolves to the checkpoint's precision where it can:
    `auto_precision`). `auto` and the precision it resolved to resume each other. A checkpoint
    written with `auto` before checkpoints recorded their precision resumes under `auto` with a
    warning naming the precision it continues in."""
    setting = _precision_setting(state.get("config", {}))
    trained = trained_in(state)
    if trained is None:
        if setting == "auto" and _precision_setting(current) in (None, "auto"):
            log.warning("%s does not record the precision it trained in (trainer.precision=auto, "
                        "saved before checkpoints recorded it); it resumes in %s, what auto is "
                        "here: if it trained in another, resume with trainer.precision=<that one>",
                        path.name, computes)
        return
    if trained != computes:
        where = " where bf16 is native" if trained == "bf16" else ""
        raise CheckpointError(
            f"{path} trained in {trained} (trainer.precision={setting or trained}), but this run "
            f"computes in {computes}; resume it with trainer.precision={trained} (or auto){where}, "
            "or use another run dir (or trainer.resume=never, which moves this run aside to "
                "<dir>.prev-<time>)")


def _precision_setting(config: dict[str, Any]) -> str | None:
    value = (config.get("trainer") or {}).get("precision")
    return None if value is None else str(value)
