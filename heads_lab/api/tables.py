"""`heads_lab.runs(paths)` and `heads_lab.rows(paths)`: a study's runs and the report's rows as
pandas DataFrames, read by the reader `heads-lab report` uses (heads_lab/report/rows.py: run
dirs, sweep dirs, dirs holding them, or a report's runs.csv files) and grouped, tested and
labelled as the report does. pandas comes with `datasets`, a dependency already."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heads_lab.report import lm as lm_report
from heads_lab.report.choose import choose as pick
from heads_lab.report.rows import collect, comparisons, data_sets, group
from heads_lab.report.seeds import p_text, significance

# the settings a row is known by, before the other config keys: the heads and their shape
FIRST = ("task", "model.attention", "model.heads", "model.kv_heads", "model.heads_k",
         "model.heads_v", "model.head_dim", "model.d_model", "model.layers",
         "model.encoder_layers", "model.decoder_layers", "data.name", "seed")


def _paths(paths) -> list[Path]:
    return [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]


def runs(paths) -> Any:
    """One row per run: its settings (the flattened config, the heads' first), every metric
    results.json holds (valid/ppl, test/bleu, test/bits_per_byte, cost/params, ...), how its
    training ended, what it ran on and where it is (`dir`)."""
    import pandas as pd  # lazy: start-up time (pandas)

    found, _ = collect(_paths(paths))
    records = []
    for run in found:
        train, env = run.results.get("train") or {}, run.results.get("env") or {}
        record = {k: run.config.get(k) for k in FIRST}
        record |= {k: v for k, v in sorted(run.config.items()) if k not in FIRST}
        record |= dict(run.metrics)
        record |= {"steps": train.get("steps"), "stopped_by": train.get("stopped_by"),
                   "train_s": train.get("seconds"), "precision": run.results.get("precision"),
                   "device": run.results.get("device"), "cpu": env.get("cpu"),
                   "commit": (env.get("git") or {}).get("commit"),
                   "dir": str(run.results.get("run_text") or run.dir)}
        records.append(record)
    return pd.DataFrame.from_records(records)


def rows(paths, samples: int = 1000, choose: str | None = None) -> Any:
    """The report's rows: one per setting (seeds pooled), the settings that vary, the number of
    runs, each metric's mean and standard deviation over them, and the p against the base row
    the report prints (over the seeds where both rows have two or more; `p_test` says which
    test, `p` its text as the report writes it). `choose="trainer.lr"`: as `heads-lab report
    --choose`, each setting's best value's row only (heads_lab/report/choose.py)."""
    import pandas as pd  # lazy: start-up time (pandas)

    found, _ = collect(_paths(paths))
    grouped, varying = group(found)
    lm = lm_report.is_lm(found)
    if choose:
        grouped, varying, _ = pick(grouped, varying, choose, lm)
    split = lm_report.split_of(found[0])
    records = []
    for subset in data_sets(grouped).values():
        _, tested = comparisons(subset, found)
        for c in tested:
            if c.base is not None and lm:
                lm_report.significance(c.rows, c.base, split, samples)
            elif c.base is not None:
                significance(c.rows, c.base, split, samples)
        bases = [c.base for c in tested if c.base is not None]
        for row in subset:
            first = row.runs[0].config
            record = {"setting": row.label, **{k: first.get(k) for k in varying},
                      "runs": len(row.runs), "base": any(row is b for b in bases)}
            for key in sorted({k for r in row.runs for k in r.metrics}):
                values = pd.Series([r.metrics.get(key) for r in row.runs], dtype=float)
                record[key] = values.mean()
                record[f"{key} sd"] = values.std(ddof=1) if len(values) > 1 else float("nan")
            record |= {"p_value": row.p_value, "p_test": row.p_test,
                       "p": (lm_report.p_text if lm else p_text)(row)}
            records.append(record)
    return pd.DataFrame.from_records(records)
