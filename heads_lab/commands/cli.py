"""`heads-lab <command> [hydra overrides]`: the dispatcher. train and info run here (train under
Hydra, its sweep plumbing in heads_lab/commands/sweeps.py); eval, analyze, prune, report and bench are a
module each. User errors (config, data, checkpoint) become one line on stderr and exit 2."""

from __future__ import annotations

import contextlib
import datetime
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

from heads_lab import __version__
from heads_lab.commands import sweep_signals, sweeps
from heads_lab.config.compose import (
    compose,
    config_dir,
    describe_keys,
    register_configs,
    start_time,
    to_dict,
    to_object,
)
from heads_lab.config.cost import Lengths, account
from heads_lab.config.validate import validate
from heads_lab.errors import ConfigError, HeadsLabError, one_line
from heads_lab.hf import is_hf

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
           e.g. heads-lab analyze outputs/runs/2026-11-22/14-03-12 analysis.heatmaps=[enc:0:*]
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
        print(f"error: unknown command {command!r}; commands: {', '.join(COMMANDS)} "
              "(see heads-lab --help)", file=sys.stderr)
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
    return sweeps.failures()


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


INFO_HELP = """usage: heads-lab info [overrides | run dirs | hf:<model>s] [--json]

What a config costs, from the config alone (no data, no training): parameters (embeddings,
attention, talking-heads mixes, feed-forward), FLOPs per target token for training and greedy
decoding, and the attention weights' memory per layer, at cost.src_len / cost.tgt_len tokens.
Comma lists compare configs side by side, as `train -m` would run them, and so does a preset's
own sweep (+experiment=table_a: one column per head count); configs that differ only in
settings no cost depends on (seed, data size, trainer) are shown once. Run dirs are accounted
from their saved configs; hf:<hub name or dir>s show pretrained models' heads, layers,
parameters and forward FLOPs (the hf extra).
--json prints the accounts as JSON, each with the model settings the table shows.
  e.g. heads-lab info model=base model.heads=1,8,32
       heads-lab info +experiment=table_a_tatoeba --json
       heads-lab info outputs/runs/<date>/<time>
       heads-lab info hf:bert-base-uncased hf:distilbert-base-uncased
"""


def info_command(args: list[str]) -> int:
    """`heads-lab info [overrides | run dirs] [--json]`: the cost account of one config, of each
    config of a comma-list sweep side by side, or of trained runs (their saved configs); composes
    the config only (no data, no training)."""
    if "-h" in args or "--help" in args:
        print(INFO_HELP, end="")
        return 0
    unknown = [a for a in args if a.startswith("-") and a != "--json"]
    if unknown:
        raise ConfigError(f"info: unknown option {unknown[0]}; info takes config overrides "
                          "(model.heads=1,8,32), hf:<model>s or run dirs, and --json")
    overrides = [a for a in args if a != "--json"]
    if overrides and all(not is_hf(a) and Path(a).is_dir() for a in overrides):
        return _info_runs([Path(a) for a in overrides], "--json" in args)
    if any(is_hf(a) for a in overrides):  # pretrained Hugging Face models side by side
        if not all(is_hf(a) for a in overrides):
            raise ConfigError("info: give either hf: models (heads-lab info hf:bert-base-uncased "
                              "hf:distilbert-base-uncased) or config overrides, not both")
        from heads_lab.commands.hf import info_hf  # lazy: start-up time (torch, transformers)

        return info_hf(overrides, "--json" in args)
    return _print_accounts(*_sweep_columns(overrides), as_json="--json" in args)


def _sweep_columns(overrides: list[str]) -> tuple[list, list[int], str | None]:
    """Every config of the sweep (the command line's lists and a preset's own sweep), one
    column per distinct account; how many configs each stands for; the note saying so."""
    jobs, accounts, counts = [], {}, {}
    every = sweeps.job_overrides(overrides)
    for job in every:
        run = to_object(compose(job))
        validate(run)
        column = _account_column("", run)
        key = json.dumps([_model_fields(column[1]), column[2]], sort_keys=True, default=str)
        if key not in accounts:  # seeds, data sizes, trainer settings: the same account
            jobs.append(job)
            accounts[key] = column
        counts[key] = counts.get(key, 0) + 1
    varying = [i for i in range(len(jobs[0])) if len({job[i] for job in jobs}) > 1]
    fixed = [i for i in range(len(jobs[0])) if len({job[i] for job in every}) == 1]
    columns = [(" ".join(job[i] for i in varying or fixed) or "defaults", *column[1:])
               for job, column in zip(jobs, accounts.values(), strict=True)]
    note = None if len(every) == len(jobs) else (
        f"{len(every)} configs, {len(jobs)} distinct accounts: configs that differ only in "
        "settings no cost depends on (seed, data size, trainer) are shown once")
    return columns, list(counts.values()), note


def _info_runs(run_dirs: list[Path], as_json: bool) -> int:
    """`heads-lab info <run dir> ...`: each run's account, from its saved config."""
    from heads_lab.commands.runs import compose_run  # lazy: the runs module (yaml, torch-free)

    return _print_accounts([_account_column(str(d), compose_run(d, [])[1]) for d in run_dirs],
                           as_json=as_json)


def _account_column(label: str, run):
    lengths = Lengths(run.cost.src_len, run.cost.tgt_len)
    return label, run.model, account(run.model, run.data.vocab_size, lengths)


def _print_accounts(columns: list, counts: list[int] | None = None, note: str | None = None,
                    as_json: bool = False) -> int:
    """The accounts side by side (a table) and the note under it, or as JSON: each with the
    model settings the table shows (attention, heads, d_k, layers) and how many of the
    sweep's configs it stands for (`counts`; 1 each by default)."""
    if as_json:
        counts = counts or [1] * len(columns)
        print(json.dumps([{"config": label, "configs": n, "model": _model_fields(model), **acct}
                          for (label, model, acct), n in zip(columns, counts, strict=True)],
                         indent=2))
        return 0
    # lazy: start-up time (rich); bench's spawned peak-RSS children re-import this module
    from heads_lab.output.tracking import console, cost_table

    console.print(cost_table(columns))
    if note:
        console.print(note)
    return 0


def _model_fields(model) -> dict:
    return {"attention": getattr(model.attention, "value", model.attention), "heads": model.heads,
            "heads_k": model.heads_k, "heads_v": model.heads_v, "kv_heads": model.kv_heads,
            "d_model": model.d_model, "d_k": model.d_head, "d_ff": model.d_ff,
            "encoder_layers": model.encoder_layers, "decoder_layers": model.decoder_layers}


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
