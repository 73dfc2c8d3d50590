"""`heads-lab info`: what configs cost (parameters, FLOPs per token, attention memory) side by
side, from their configs alone: overrides and comma lists, a preset's own sweep, trained runs'
saved configs, or pretrained hf: models (heads_lab.hf.subject)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from heads_lab.commands.command import is_hf
from heads_lab.config.compose import compose, to_object
from heads_lab.config.cost import Lengths, account, gate_parameters
from heads_lab.config.validate import validate
from heads_lab.errors import ConfigError
from heads_lab.sweeps import jobs as sweeps

INFO_HELP = """usage: heads-lab info [overrides | run dirs | hf:<model>s] [--json]

What a config costs, from the config alone (no data, no training): parameters (embeddings,
attention, talking-heads mixes, feed-forward, and head gates trained from scratch), FLOPs per
target token for training and greedy decoding, and the attention weights' memory per layer, at
cost.src_len / cost.tgt_len tokens. Comma lists compare configs side by side, as `train -m`
would run them, and so does a preset's own sweep (+experiment=table_a: one column per head
count); configs that differ only outside the model and its cost (seed, data size, trainer) are
shown once. Run dirs are accounted from their saved configs, at their training data's mean
lengths (the run's own account in results.json). hf:<hub name or dir>s show pretrained models'
heads, layers, parameters and forward FLOPs (the hf extra).
--json prints the accounts as JSON, each with the model settings the table shows and how many
of the sweep's configs it stands for ("configs").
  e.g. heads-lab info model=base model.heads=1,8,32
       heads-lab info +experiment=table_a_tatoeba --json
       heads-lab info outputs/runs/<date>/<time>
       heads-lab info hf:bert-base-uncased hf:distilbert-base-uncased
"""


def main(args: list[str]) -> int:
    """`heads-lab info [overrides | run dirs | hf:<model>s] [--json]` (INFO_HELP): the cost
    account of one config, of each config of a sweep (comma lists, a preset's own) side by side,
    of trained runs (their saved configs), or of pretrained models; no data, no training."""
    if "-h" in args or "--help" in args:
        print(INFO_HELP, end="")
        return 0
    unknown = [a for a in args if a.startswith("-") and a != "--json"]
    if unknown:
        raise ConfigError(f"info: unknown option {unknown[0]}; info takes config overrides "
                          "(model.heads=1,8,32), hf:<model>s or run dirs, and --json")
    overrides = [a for a in args if a != "--json"]
    dirs = [a for a in overrides if not is_hf(a) and Path(a).is_dir()]
    if overrides and len(dirs) == len(overrides):
        return _info_runs([Path(a) for a in overrides], "--json" in args)
    if dirs:
        raise ConfigError(f"info: give either run dirs or config overrides, not both ({dirs[0]} "
                          "is a dir); a run's own config is accounted as it was trained")
    missing = [a for a in overrides if not is_hf(a) and (
        "=" not in a and not a.startswith("~") or a.startswith(("/", "./", "../")))]
    if missing:
        raise ConfigError(f"info: no run dir {missing[0]}; give the dirs of heads-lab train runs, "
                          "or config overrides (key=value)")
    if any(is_hf(a) for a in overrides):  # pretrained Hugging Face models side by side
        if not all(is_hf(a) for a in overrides):
            raise ConfigError("info: give either hf: models (heads-lab info hf:bert-base-uncased "
                              "hf:distilbert-base-uncased) or config overrides, not both")
        from heads_lab.commands.command import accounts  # lazy: start-up time (torch, transformers)
        from heads_lab.output.tables import show, to_rich  # lazy: start-up time (rich)

        table = accounts(overrides)
        if "--json" in args:
            print(json.dumps(table.pop("accounts"), indent=2))
        else:
            table.pop("accounts")
            show(to_rich(table, "heads-lab info"), width=160)
        return 0
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
        key = json.dumps([dataclasses.asdict(run.model), column[2]], sort_keys=True, default=str)
        if key not in accounts:  # seeds, data sizes, trainer settings: the same model and account
            jobs.append(job)
            accounts[key] = column
        counts[key] = counts.get(key, 0) + 1
    varying = [i for i in range(len(jobs[0])) if len({job[i] for job in jobs}) > 1]
    fixed = [i for i in range(len(jobs[0])) if len({job[i] for job in every}) == 1]
    columns = [(" ".join(job[i] for i in varying or fixed) or "defaults", *column[1:])
               for job, column in zip(jobs, accounts.values(), strict=True)]
    note = None if len(every) == len(jobs) else (
        f"{len(every)} configs shown as {len(jobs)}: configs that differ only outside the model "
        "and its cost (seed, data size, trainer) are shown once")
    return columns, list(counts.values()), note


def _info_runs(run_dirs: list[Path], as_json: bool) -> int:
    """`heads-lab info <run dir> ...`: each run's account, from its saved config."""
    from heads_lab.training.runs import compose_run  # lazy: the runs module (yaml, torch-free)

    return _print_accounts([_account_column(str(d), compose_run(d, [])[1], _trained_lengths(d))
                            for d in run_dirs], as_json=as_json)


def _trained_lengths(run_dir: Path) -> Lengths | None:
    """The mean source and target lengths of the run's training data, which its own account
    (results.json) was computed at; None before the run finished."""
    try:
        recorded = json.loads((run_dir / "results.json").read_text())["cost"]["lengths"]
        return Lengths(float(recorded["src"]), float(recorded["tgt"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _account_column(label: str, run, lengths: Lengths | None = None):
    """(label, model config, account) at `lengths` (default: cost.src_len, cost.tgt_len); the
    parameters include Hard Concrete gates trained from scratch (prune.l0_lambda > 0)."""
    acct = account(run.model, run.data.vocab_size,
                   lengths or Lengths(run.cost.src_len, run.cost.tgt_len), str(run.task))
    gates = gate_parameters(run.model, run.prune.sites) if run.prune.l0_lambda > 0 else 0
    if gates:
        acct["params"] = {**acct["params"], "head_gates": gates,
                          "total": acct["params"]["total"] + gates}
    return label, run.model, acct


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
    from heads_lab.output.tables import wide_console  # lazy: start-up time (rich)
    from heads_lab.output.tracking import cost_table  # lazy: start-up time (rich)

    console = wide_console(2000)  # piped (| cat, > file): the whole table, no column cut at 80
    console.print(cost_table(columns))
    if note:
        console.print(note)
    return 0


def _model_fields(model) -> dict:
    return {"attention": getattr(model.attention, "value", model.attention), "heads": model.heads,
            "heads_k": model.heads_k, "heads_v": model.heads_v, "kv_heads": model.kv_heads,
            "d_model": model.d_model, "d_k": model.d_head, "d_ff": model.d_ff,
            "encoder_layers": model.encoder_layers, "decoder_layers": model.decoder_layers}
