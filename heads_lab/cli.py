"""`heads-lab <command> [hydra overrides]`. Each command is a short function that wires the
stages together; user errors (config, data, checkpoint) become one line on stderr and exit 2."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

USAGE = """usage: heads-lab <command> [overrides]

Attention head-count ablations for Transformer translators.

commands:
  train    train a translator, then evaluate PPL, BLEU and chrF (Hydra overrides, -m to sweep)
           e.g. heads-lab train model.heads=8
                heads-lab train -m model.heads=1,2,4,8
  info     what a config costs (parameters, FLOPs per token, attention memory), without data
           or training; comma lists compare configs side by side (--json for JSON)
           e.g. heads-lab info model.heads=1,8,32
  eval     evaluate a finished or partial run again from its checkpoints (another beam, split
           or test set; eval.average_last=N averages the last N checkpoints)
           e.g. heads-lab eval outputs/runs/2026-11-22/14-03-12_model.heads=8 eval.beam=5
  report   a study's table from its runs: settings, params, PPL, BLEU, chrF (mean ± std over
           seeds), paired-bootstrap p vs the base row, speed; Markdown, CSV and PNG plots
           e.g. heads-lab report outputs/multiruns/2026-11-22/14-05-40
  analyze  what each head of a trained run does: confidence, positional / syntactic / rare-word
           heads, importance, distances between heads; analysis.json, PNGs, an HTML head view
           e.g. heads-lab analyze outputs/runs/2026-11-22/14-03-12 analysis.heatmaps=[enc:0:*]
  prune    remove heads: method=importance (Michel et al., iterative, BLEU/PPL curve) or
           method=gates (Voita et al., Hard Concrete gates with an L0 penalty; -m over λ)
           e.g. heads-lab prune outputs/runs/2026-11-22/14-03-12 method=gates prune.l0_lambda=0.05
  bench    training and decoding speed side by side (MHA at h = 1..32, talking heads,
           multi-query, bf16, torch.nn.Transformer), MFU, memory; --depth: Liu et al. curves

`heads-lab <command> --help` shows the command's config groups and keys.
"""


def main(argv: list[str] | None = None) -> int:
    # Token-budget batches give a new tensor shape nearly every step; oneDNN's default cache of
    # 1024 compiled kernels then holds GBs that are rarely reused (bf16: 3.2 vs 2.4 GB after 90
    # Multi30k steps, no slower). Set before torch loads; the user's own setting wins.
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "128")
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    if args[0] in ("-V", "--version"):
        from heads_lab import __version__

        print(f"heads-lab {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}; commands: {', '.join(COMMANDS)} "
              "(see heads-lab --help)", file=sys.stderr)
        return 2
    return _reporting_user_errors(lambda: COMMANDS[command](rest))


def _reporting_user_errors(run: Callable[[], int]) -> int:
    """Run a command; a user error (config, data, checkpoint, a Hydra composition error) becomes
    one line on stderr and exit code 2. HEADS_LAB_TRACEBACK=1 (or HYDRA_FULL_ERROR=1) re-raises."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from heads_lab.errors import HeadsLabError

    traces = bool(os.environ.get("HYDRA_FULL_ERROR") or os.environ.get("HEADS_LAB_TRACEBACK"))
    try:
        return run()
    except (HeadsLabError, HydraException, OmegaConfBaseException) as err:
        if traces:
            raise
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def _run_hydra(task: Callable, command: str, overrides: list[str]) -> int:
    """Run `task` under Hydra (output dirs, multirun, --help) with the packaged config tree."""
    import hydra

    from heads_lab.config import config_dir, register_configs

    _RERUN[:] = ["--rerun"] if "--rerun" in overrides else []
    overrides = [o for o in overrides if o != "--rerun"]
    _refuse_finished_run_dir(overrides)  # a sweep may hold its own finished jobs (skipped)
    _check_writable_run_dir(overrides)
    os.environ.pop(SWEEP_KEYS_ENV, None)
    if _is_multirun(overrides):
        _check_sweep(overrides)
        jobs = _sweep_jobs(overrides)
        if jobs:  # the settings that vary between jobs name each job's wandb run (h=8,seed=2);
            # in the environment, so launchers' worker processes (joblib, submitit) see them too
            keys = sorted({k for job in jobs for k in job
                           if len({job_.get(k) for job_ in jobs}) > 1})
            os.environ[SWEEP_KEYS_ENV] = json.dumps(keys)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun: every rank uses rank 0's run dir
        import datetime

        from heads_lab.errors import ConfigError
        from heads_lab.parallel import from_env

        if _is_multirun(overrides):
            raise ConfigError("data-parallel training (torchrun) runs one job; drop -m, or "
                              "sweep with a launcher that starts one torchrun per job")
        os.environ["HEADS_LAB_START_TIME"] = from_env().broadcast(
            datetime.datetime.now().isoformat())
    register_configs()
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra raise, so we can report in one line
    sys.argv = [f"heads-lab {command}", *overrides]
    entry = hydra.main(config_path=str(config_dir()), config_name="train", version_base="1.3")(task)
    _FAILED_JOBS.clear()
    _FIXED_OVERRIDES.clear()
    _FIXED_OVERRIDES.update(o for o in overrides if "," not in o.split("=", 1)[-1])
    if "--help" in overrides or "-h" in overrides:
        return _hydra_help(entry)
    try:
        entry()
    finally:
        _leave_process_group()
    if _FAILED_JOBS:
        print(f"error: {len(_FAILED_JOBS)} job(s) of the sweep failed: {'; '.join(_FAILED_JOBS)}",
              file=sys.stderr)
        return 2
    return 0


def _leave_process_group() -> None:
    if "torch" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _hydra_help(entry: Callable) -> int:
    """Hydra's help, without the internal schema/ groups (they hold the typed schemas)."""
    buffer, code = io.StringIO(), 0
    with contextlib.redirect_stdout(buffer):
        try:
            entry()
        except SystemExit as done:
            code = done.code or 0
    print("".join(line for line in buffer.getvalue().splitlines(keepends=True)
                  if not line.startswith("schema/")), end="")
    return int(code)


def _is_multirun(overrides: list[str]) -> bool:
    return "-m" in overrides or "--multirun" in overrides


def _refuse_finished_run_dir(overrides: list[str]) -> None:
    """An explicit `hydra.run.dir` holding a finished run fails before Hydra writes anything
    into it. An explicit `hydra.sweep.dir` may hold finished jobs of the same sweep (they are
    skipped), but not a finished run of any other config."""
    from heads_lab.errors import finished_run

    sweep = _is_multirun(overrides)
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
        jobs = _sweep_jobs(overrides) or []  # unknown (unparsable) jobs: refuse, to be safe
        for path in finished:
            try:
                done = _by_key(json.loads(path.read_text()).get("overrides", []))
            except (OSError, json.JSONDecodeError):
                done = {}
            if done not in jobs:  # a finished job of this very sweep is skipped, not refused
                raise finished_run(path.parent)


def _by_key(overrides: list[str]) -> dict[str, str]:
    """Overrides as {key: value}, the last one of a key winning (as Hydra applies them)."""
    return dict(o.split("=", 1) if "=" in o else (o, "") for o in overrides)


def _job_overrides(overrides: list[str]) -> list[list[str]]:
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


def _sweep_jobs(overrides: list[str]) -> list[dict[str, str]] | None:
    """Every job's task overrides as {key: value} (None when they cannot be worked out)."""
    try:
        return [_by_key([o for o in job if not o.startswith("hydra.")])
                for job in _job_overrides(overrides)]
    except Exception:
        return None


def _check_writable_run_dir(overrides: list[str]) -> None:
    """An explicit run or sweep dir that cannot be created fails in one line before Hydra
    tries (a path under a file, a read-only or full filesystem)."""
    from heads_lab.runner import ensure_writable

    for item in overrides:
        if item.startswith(("hydra.run.dir=", "hydra.sweep.dir=")):
            key, where = item.split("=", 1)
            ensure_writable(Path(where), key)


def _check_sweep(overrides: list[str]) -> None:
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
        jobs = _job_overrides(plain)
    except Exception:  # sweep syntax only Hydra's sweeper understands, or a composition error
        return  # Hydra reports it itself, in one line through _one_line
    varying = [i for i in range(len(jobs[0])) if len({job[i] for job in jobs}) > 1]
    for job in jobs:
        try:
            validate(to_object(compose(job)))
        except (HeadsLabError, HydraException, OmegaConfBaseException) as err:
            label = ",".join(job[i] for i in varying) or " ".join(job)
            raise ConfigError(f"sweep job {label}: {_one_line(err)} (no job was run)") from None


def _one_line(err: BaseException) -> str:
    """A user error as one line: what is wrong and how to fix it."""
    from heads_lab.errors import HeadsLabError

    if isinstance(err, HeadsLabError):
        return str(err)
    text = str(err).strip()
    cause = str(err.__cause__).strip().splitlines()[0] if err.__cause__ else ""
    first = text.splitlines()[0] if text else type(err).__name__
    unknown = re.match(r"Could not override '([^']+)'", first)
    if unknown:
        key = unknown.group(1)
        return (f"unknown config key '{key}' ({cause}); check the spelling against "
                "`heads-lab train --cfg job`")
    if "Ambiguous value for argument" in first:
        return f"{first} (to sweep over the values, add -m, e.g. heads-lab train -m ...)"
    options = re.search(r"Could not find '([^']+)'.*?Available options in '([^']+)':\s*(.*?)"
                        r"(?:Config search path|$)", text, re.S)
    if options:
        choices = ", ".join(o.strip() for o in options.group(3).split() if o.strip())
        return (f"unknown config option '{options.group(1)}'; choose {options.group(2)}= one of: "
                f"{choices}")
    merge = re.match(r"Error merging override (\S+)", first)
    if merge:
        return f"bad value in override {merge.group(1)}: {cause}; fix the value's type or spelling"
    return f"{first}{': ' + cause if cause else ''}"


def train_task(cfg) -> float | None:
    """`heads-lab train`: data → model → training → evaluation → results.json (+ wandb)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from heads_lab.config import to_dict, to_object, validate
    from heads_lab.runner import run_training
    from heads_lab.tracking import short_name

    hydra_cfg = HydraConfig.get()
    with _user_errors(hydra_cfg):
        run_dir = Path(hydra_cfg.runtime.output_dir)
        finished = _finished_job(run_dir, hydra_cfg)
        if finished is not None:
            return finished
        run = to_object(cfg)
        validate(run)
        overrides = list(hydra_cfg.overrides.task)
        name, group = short_name(overrides), None
        if hydra_cfg.mode == RunMode.MULTIRUN:  # named by what varies; grouped by the sweep
            keys = os.environ.get(SWEEP_KEYS_ENV)
            name = short_name(overrides, json.loads(keys) if keys else None)
            group = f"{run.name}/{'/'.join(Path(hydra_cfg.sweep.dir).parts[-2:])}"
        results = run_training(run, config=to_dict(cfg), run_dir=run_dir, overrides=overrides,
                               name=name, group=group)
        return results.get("metrics", {}).get("valid/loss")  # what Hydra sweepers minimise
    return None


def _finished_job(run_dir: Path, hydra_cfg) -> float | None:
    """A sweep run again into the same dir (hydra.sweep.dir=...) skips the jobs whose results
    are complete, so a crashed or timed-out sweep resumes where it stopped; unfinished jobs
    resume from their checkpoints. With --rerun a finished job's results, outputs and
    checkpoints move into <job dir>/previous-<time>/ and the job runs afresh."""
    import time

    done = run_dir / "results.json"
    if not done.is_file():
        return None
    if _RERUN:  # keep the earlier results: move them into previous-<time>/ in the run dir
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


_RERUN: list[str] = []
SWEEP_KEYS_ENV = "HEADS_LAB_SWEEP_KEYS"
_FAILED_JOBS: list[str] = []
_FIXED_OVERRIDES: set[str] = set()  # a sweep's overrides that every job shares


@contextlib.contextmanager
def _user_errors(hydra_cfg):
    """A user error inside a job: one line on stderr. A single run exits 2 at once; in a sweep
    the job is recorded as failed and the other jobs run (main() exits 2 at the end)."""
    from hydra.types import RunMode

    from heads_lab.errors import HeadsLabError
    from heads_lab.train import Preempted

    try:
        yield
    except Preempted as err:  # a stop signal: the whole command stops, resumable, not failed
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(128 + _signal_number(err.signal_name)) from None
    except HeadsLabError as err:
        if os.environ.get("HEADS_LAB_TRACEBACK"):
            raise
        if hydra_cfg.mode != RunMode.MULTIRUN:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        varying = [o for o in hydra_cfg.overrides.task if o not in _FIXED_OVERRIDES]
        job = ",".join(varying) or str(hydra_cfg.job.num)
        print(f"error: job {hydra_cfg.job.num} ({job}): {err}", file=sys.stderr)
        _FAILED_JOBS.append(job)
        _record_failure(Path(hydra_cfg.runtime.output_dir), str(err))


def _record_failure(run_dir: Path, error: str) -> None:
    """A failed sweep job says so in its run dir (failed.json), for `heads-lab report`."""
    from heads_lab.tracking import write_json

    try:
        write_json(run_dir / "failed.json", {"status": "failed", "error": error})
    except OSError:
        pass


def _signal_number(name: str) -> int:
    import signal

    try:
        return signal.Signals[name].value
    except KeyError:
        return signal.SIGTERM.value


def train_command(args: list[str]) -> int:
    return _run_hydra(train_task, "train", args)


def info_command(args: list[str]) -> int:
    """`heads-lab info [overrides] [--json]`: the cost account of one config, or of each config
    of a comma-list sweep side by side; composes the config only (no data, no training)."""
    if "-h" in args or "--help" in args:
        print(USAGE, end="")
        return 0
    from heads_lab.config import compose, expand_sweeps, to_object, validate
    from heads_lab.cost import Lengths, account

    overrides = [a for a in args if a != "--json"]
    jobs = expand_sweeps(overrides)
    varying = [i for i in range(len(overrides)) if len({tuple(job)[i] for job in jobs}) > 1]
    columns = []
    for job in jobs:
        run = to_object(compose(job))
        validate(run)
        label = " ".join(job[i] for i in varying) or " ".join(job) or "defaults"
        lengths = Lengths(run.cost.src_len, run.cost.tgt_len)
        columns.append((label, run.model, account(run.model, run.data.vocab_size, lengths)))
    if "--json" in args:
        print(json.dumps([{"config": label, **acct} for label, _, acct in columns], indent=2))
        return 0
    from heads_lab.tracking import console, cost_table

    console.print(cost_table(columns))
    return 0


def eval_command(args: list[str]) -> int:
    from heads_lab.eval_run import main as eval_main

    return eval_main(args)


def report_command(args: list[str]) -> int:
    from heads_lab.report import main as report_main

    return report_main(args)


def analyze_command(args: list[str]) -> int:
    from heads_lab.analyze_run import main as analyze_main

    return analyze_main(args)


def prune_command(args: list[str]) -> int:
    from heads_lab.prune import main as prune_main

    return prune_main(args)


def bench_command(args: list[str]) -> int:
    from heads_lab.bench import main as bench_main

    return bench_main(args)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "train": train_command, "eval": eval_command, "report": report_command, "info": info_command,
    "bench": bench_command, "analyze": analyze_command, "prune": prune_command}


if __name__ == "__main__":
    raise SystemExit(main())
