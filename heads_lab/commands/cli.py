"""`heads-lab <command> [hydra overrides]`: the dispatcher. train runs here (under Hydra, its
sweep plumbing in heads_lab/sweeps/jobs.py); info, eval, analyze, prune, report and bench are
a module each. User errors (config, data, checkpoint) become one line on stderr and exit 2."""

from __future__ import annotations

import contextlib
import datetime
import difflib
import io
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf.errors import OmegaConfBaseException

from heads_lab._version import __version__
from heads_lab.config.compose import (
    compose,
    config_dir,
    describe_keys,
    register_configs,
    start_time,
    to_dict,
    to_object,
)
from heads_lab.config.messages import one_line
from heads_lab.config.validate import validate
from heads_lab.errors import ConfigError, HeadsLabError
from heads_lab.output.files import lock_dir
from heads_lab.sweeps import end as sweep_end
from heads_lab.sweeps import jobs as sweeps
from heads_lab.sweeps import signals as sweep_signals

USAGE = """usage: heads-lab <command> [overrides]

Attention head-count ablations for Transformer translators.

commands:
  train    train a translator, then evaluate PPL, BLEU and chrF (Hydra overrides, -m to sweep)
           e.g. heads-lab train model.heads=8
                heads-lab train -m model.heads=1,2,4,8
  info     what a config costs (parameters, FLOPs per token, attention memory), without data
           or training; comma lists compare configs side by side, run dirs their configs
           (--json for JSON)
           e.g. heads-lab info model.heads=1,8,32
  eval     evaluate a finished or partial run again from its checkpoints (another beam, split
           or test set; eval.average_last=N averages the last N checkpoints)
           e.g. heads-lab eval outputs/runs/2026-11-22/14-03-12_model.heads=8 eval.beam=5
  report   a study's table from its runs: settings, params, PPL, BLEU, chrF (mean ± std over
           seeds), paired-bootstrap p vs the base row, speed; Markdown, CSV and PNG plots
           e.g. heads-lab report outputs/multiruns/2026-11-22/14-05-40
  analyze  what each head of a trained run does: confidence, positional / syntactic / rare-word
           heads, importance, distances between heads; analysis.json, PNGs, an HTML head view
           e.g. heads-lab analyze outputs/runs/2026-11-22/14-03-12 'analysis.heatmaps=[enc:0:*]'
  prune    remove heads: method=importance (Michel et al., iterative, BLEU/PPL curve) or
           method=gates (Voita et al., Hard Concrete gates with an L0 penalty; -m over λ)
           e.g. heads-lab prune outputs/runs/2026-11-22/14-03-12 method=gates prune.l0_lambda=0.05
  bench    training and decoding speed side by side (MHA at h = 1..32, talking heads,
           multi-query, bf16, torch.nn.Transformer), MFU, memory; --depth: Liu et al. curves

info, analyze and prune also take a pretrained Hugging Face model (Marian, BERT, DistilBERT) as
hf:<hub name or save_pretrained dir> in place of a run (pip install 'heads-lab[hf]'):
           e.g. heads-lab info hf:bert-base-uncased hf:distilbert-base-uncased
                heads-lab analyze hf:Helsinki-NLP/opus-mt-de-en \\
                    analysis.treebank=de_pud-ud-test.conllu.gz analysis.treebank_ref=text_en
                heads-lab prune hf:bert-base-uncased data=multi30k data.src=en

`heads-lab train --help` shows the config groups and every key; `heads-lab <command> --help` what a
command does and takes; `heads-lab --version` the version.
"""


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader of stdout left (`heads-lab info --json | head`)
        # Python's own advice: point stdout at devnull, so that its flush at exit raises nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command its pipe's reader left


def _main(argv: list[str] | None) -> int:
    # Token-budget batches give a new tensor shape nearly every step; oneDNN's default cache of
    # 1024 compiled kernels then holds GBs that are rarely reused (bf16: 3.2 vs 2.4 GB after 90
    # Multi30k steps, no slower). Set before torch loads; the user's own setting wins.
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "128")
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    if args[0] in ("-V", "--version"):
        print(f"heads-lab {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, list(COMMANDS), n=1, cutoff=0.6)
        print(f"error: unknown command {command!r}"
              f"{f' (did you mean {close[0]}?)' if close else ''}; commands: "
              f"{', '.join(COMMANDS)} (see heads-lab --help)", file=sys.stderr)
        return 2
    return _reporting_user_errors(lambda: COMMANDS[command](rest))


def _reporting_user_errors(run: Callable[[], int]) -> int:
    """Run a command; a user error (config, data, checkpoint, a Hydra composition error) becomes
    one line on stderr and exit code 2. HEADS_LAB_TRACEBACK=1 (or HYDRA_FULL_ERROR=1) re-raises."""
    traces = bool(os.environ.get("HYDRA_FULL_ERROR") or os.environ.get("HEADS_LAB_TRACEBACK"))
    try:
        return run()
    except (HeadsLabError, HydraException, OmegaConfBaseException) as err:
        if traces:
            raise
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def _run_hydra(task: Callable, command: str, overrides: list[str]) -> int:
    """Run `task` under Hydra (output dirs, multirun, --help) with the packaged config tree."""
    overrides = sweeps.prepare(overrides)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun: every rank uses rank 0's run dir
        from heads_lab.training.parallel import from_env  # lazy: start-up time (torch)

        if sweeps.is_multirun(overrides):
            raise ConfigError("data-parallel training (torchrun) runs one job; drop -m, or "
                              "sweep with a launcher that starts one torchrun per job")
        timeout = to_object(compose([o for o in overrides if not o.startswith("-")])
                            ).trainer.dist_timeout_s
        os.environ["HEADS_LAB_START_TIME"] = from_env(timeout).broadcast(
            datetime.datetime.now().isoformat())
    register_configs()
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra raise, so we can report in one line
    sys.argv = [f"heads-lab {command}", *overrides]
    entry = hydra.main(config_path=str(config_dir()), config_name="train", version_base="1.3")(task)
    if "--help" in overrides or "-h" in overrides:
        return _hydra_help(entry, [o for o in overrides if o not in ("--help", "-h", "-m",
                                                                      "--multirun")])
    try:
        with _shared_start_time(), sweep_signals.forward_stop_signals():
            entry()
    finally:
        _leave_process_group()
    return sweep_end.failures()


@contextlib.contextmanager
def _shared_start_time():
    """This command's start time in the environment while it runs, so that a launcher's worker
    processes (joblib, submitit, SLURM jobs) resolve the same dated sweep dir as this process."""
    given = os.environ.get("HEADS_LAB_START_TIME")
    os.environ["HEADS_LAB_START_TIME"] = start_time().isoformat()
    try:
        yield
    finally:
        if given is None:
            os.environ.pop("HEADS_LAB_START_TIME", None)
        else:
            os.environ["HEADS_LAB_START_TIME"] = given


def _leave_process_group() -> None:
    if "torch" in sys.modules:
        import torch.distributed as dist  # lazy: start-up time (torch; only once loaded)

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _hydra_help(entry: Callable, overrides: list[str]) -> int:
    """Hydra's help, without the internal schema/ groups (they hold the typed schemas), then
    every key of the config these overrides compose with its value and its help."""
    buffer, code = io.StringIO(), 0
    with contextlib.redirect_stdout(buffer):
        try:
            entry()
        except SystemExit as done:
            code = done.code or 0
    print("".join(line for line in buffer.getvalue().splitlines(keepends=True)
                  if not line.startswith("schema/")), end="")
    print("== Keys == (value, then what it does; choices are checked when the config composes)\n")
    print("\n".join(describe_keys(to_object(compose(overrides)))))
    return int(code)


def train_task(cfg) -> float | None:
    """`heads-lab train`: data → model → training → evaluation → results.json (+ trackers)."""
    from heads_lab.commands.train import run_training  # lazy: start-up time (torch)

    # lazy: start-up time (rich); bench's spawned peak-RSS children re-import this module
    from heads_lab.output.trackers import check_installed
    from heads_lab.output.tracking import short_name

    hydra_cfg = HydraConfig.get()
    if sweeps.not_started(hydra_cfg):  # a worker of a stopping sweep
        return None
    with sweeps.user_errors(hydra_cfg):
        run_dir = Path(hydra_cfg.runtime.output_dir)
        if hydra_cfg.mode == RunMode.MULTIRUN:  # a job's dir, as a single run's: one writer
            lock_dir(run_dir, "hydra.sweep.dir")
        finished = sweeps.finished_job(run_dir, hydra_cfg)
        if finished is not None:
            return finished
        run = to_object(cfg)
        validate(run)
        check_installed(run.logger)
        overrides = list(hydra_cfg.overrides.task)
        name, group = short_name(overrides), None
        if hydra_cfg.mode == RunMode.MULTIRUN:  # named by what varies; grouped by the sweep
            keys = os.environ.get(sweeps.SWEEP_KEYS_ENV)
            name = short_name(overrides, json.loads(keys) if keys else None)
            group = f"{run.name}/{'/'.join(Path(hydra_cfg.sweep.dir).parts[-2:])}"
        results = run_training(run, config=to_dict(cfg), run_dir=run_dir, overrides=overrides,
                               name=name, group=group)
        return results.get("metrics", {}).get("valid/loss")  # what Hydra sweepers minimise
    return None


def train_command(args: list[str]) -> int:
    return _run_hydra(train_task, "train", args)


def info_command(args: list[str]) -> int:
    # lazy: start-up time (the verb's module)
    from heads_lab.commands.info import main as info_main

    return info_main(args)


def eval_command(args: list[str]) -> int:
    # lazy: start-up time (the verb's module, and torch when it runs)
    from heads_lab.commands.eval import main as eval_main

    return eval_main(args)


def report_command(args: list[str]) -> int:
    # lazy: start-up time (the verb's module: sacrebleu's significance tests, ~0.1 s)
    from heads_lab.commands.report import main as report_main

    return report_main(args)


def analyze_command(args: list[str]) -> int:
    # lazy: start-up time (the verb's module, and torch when it runs)
    from heads_lab.commands.analyze import main as analyze_main

    return analyze_main(args)


def prune_command(args: list[str]) -> int:
    # lazy: start-up time (the verb's module, and torch when it runs)
    from heads_lab.commands.prune import main as prune_main

    return prune_main(args)


def bench_command(args: list[str]) -> int:
    # lazy: start-up time (the verb's module, and torch when it runs)
    from heads_lab.bench import main as bench_main

    return bench_main(args)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "train": train_command, "eval": eval_command, "report": report_command, "info": info_command,
    "bench": bench_command, "analyze": analyze_command, "prune": prune_command}


if __name__ == "__main__":
    raise SystemExit(main())
