"""The one way heads-lab writes a file: atomically (a temp file in the same dir, then a rename),
so a reader, a crash or a concurrent sweep job never sees half of it, with the permissions of any
file the user creates (0666 less the umask: 0644 under the usual 022), so colleagues on a shared
machine can read results as they can the PNGs and checkpoints."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from heads_lab.errors import ConfigError


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8) to `path` atomically; returns the path."""
    path = Path(path)
    mode = "wb" if isinstance(data, bytes) else "w"
    kwargs = {} if isinstance(data, bytes) else {"encoding": "utf-8", "newline": ""}
    with tempfile.NamedTemporaryFile(mode, dir=path.parent, prefix=f".{path.name}.",
                                     suffix=".tmp", delete=False, **kwargs) as f:
        f.write(data)
    os.chmod(f.name, 0o666 & ~_umask())  # NamedTemporaryFile makes it 0600 whatever the umask
    os.replace(f.name, path)
    return path


def _umask() -> int:
    """The process's umask: from /proc on Linux, else by setting it and straight back (which
    another thread could see for an instant)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json(path: Path, obj: Any) -> Path:
    """JSON, indented, atomically."""
    return write_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def write_lines(path: Path, lines: list[str]) -> Path:
    """One line per item (a translation, a reference), atomically."""
    return write_atomic(path, "".join(line + "\n" for line in lines))


def ensure_writable(path: Path, label: str) -> None:
    """Create `path` and write a probe file into it; a ConfigError naming `label` (the key that
    chose the dir) and the fix if that fails (a path under a file, read-only, or full)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        # a probe of its own: torchrun's ranks probe the same run dir at the same moment
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(f"cannot write to {label} {path}: {err.strerror or err}; choose a "
                          "writable dir (or fix its permissions / free space)") from None


LOCK = ".heads-lab.lock"  # in a run or sweep dir, held by the process writing into it
_HELD: dict[Path, int] = {}  # dir → the open file descriptor holding its lock (for life)


def lock_dir(path: Path, key: str) -> None:
    """Hold an exclusive lock on dir `path` for the rest of this process (creating the dir), so
    that a second heads-lab writing into it (two trainings given one hydra.run.dir, two sweeps
    given one hydra.sweep.dir) stops at once instead of overwriting the first. The lock is the
    kernel's (flock) on `path`/.heads-lab.lock: it ends with the process, however it ends, so a
    killed run's dir never stays locked and resumes. ConfigError, one line naming `key`, where
    another process holds it. A dir that cannot be created or written is left to the checks
    that say so (nothing is locked)."""
    import fcntl  # lazy: POSIX only, where it is the only caller's need

    path = Path(path).resolve()
    if path in _HELD:
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        raise ConfigError(f"{path} is in use by another heads-lab ({holder}): wait for it to "
                          f"end, or choose another {key}") from None
    except OSError:  # a file system without locks (some network ones): left unlocked
        os.close(fd)
        return
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}, since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
    except OSError:  # who holds it is a courtesy: the lock holds without it
        pass
    _HELD[path] = fd


def moved(old: Path, new: Path) -> None:
    """lock_dir's lock follows a dir renamed from `old` to `new` (the same file, still held)."""
    fd = _HELD.pop(Path(old).resolve(), None)
    if fd is not None:
        _HELD[Path(new).resolve()] = fd


def unlock_dir(path: Path) -> None:
    """Give up lock_dir's lock on `path` (before the dir is moved away)."""
    fd = _HELD.pop(Path(path).resolve(), None)
    if fd is not None:
        os.close(fd)


def output_dir(run_dir: Path, kind: str, overrides: list[str], first: tuple[str, ...] = ()) -> Path:
    """A new dir run_dir/<kind>/<date>_<time>_<overrides> (overrides starting with `first`
    lead, so dirs of a sweep tell apart), never an existing one. The label keeps whole
    overrides up to 80 characters and counts the rest (`+2`): the full list is in the dir's
    JSON."""
    ordered = sorted(overrides, key=lambda o: not o.startswith(first)) if first else overrides
    parts = ["".join(c if c.isalnum() or c in "=.,-_" else "-" for c in o) for o in ordered]
    label = ""
    for i, part in enumerate(parts):
        more = f",+{len(parts) - i}"
        if label and len(label) + 1 + len(part) + (len(more) if i < len(parts) - 1 else 0) > 80:
            label += more
            break
        label = f"{label},{part}" if label else part[:80]
    out = run_dir / kind / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{label or 'defaults'}"
    out.mkdir(parents=True, exist_ok=False)
    return out
