"""runs.csv read back: the runs a report wrote, one line each, as the results.json-like records
`heads-lab report` tabulates, so a study published in parts (per machine, per seed) is one
report: `heads-lab report part1/runs.csv part2/runs.csv <run dirs> ...`. Torch-free.

A line gives its run's numbers (four decimals), what it ran on, and in its `config` column the
run's whole flattened config as JSON (the report groups runs by it, as it does results.json's);
a runs.csv without that column (written before it existed) cannot say which settings its runs
had and is refused with the fix. Run dirs named in the `run` column are read for translations
where they still exist on this machine; where not, the row's p is over the seeds alone.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from heads_lab.errors import DataError

CONFIG = "config"  # the column holding the run's flattened config (JSON)
OVERRIDES = "overrides"  # its command-line overrides (JSON list): the swept settings first
SEED_P = "p vs base (its seed)"


def read(path: Path) -> list[dict[str, Any]]:
    """The runs of a runs.csv: each {"dir": its run dir (~ expanded), "config": flat config,
    "metrics": {...}, "results": {...}} as results.json would give them. DataError, one line,
    for a file that is not a heads-lab runs.csv."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            lines = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DataError(f"{path}: not a readable runs.csv ({err})") from None
    header = list(lines[0]) if lines else []
    split = next((c[:-len(" BLEU")] for c in header if c.endswith(" BLEU")
                  and not c.startswith("multiref")), None)
    split = split or next((c[:-len(" bits/byte")] for c in header  # a language model's
                           if c.endswith(" bits/byte") and not c.startswith("valid")), None)
    if CONFIG not in header or split is None:
        raise DataError(f"{path} is not a runs.csv with a '{CONFIG}' column (a heads-lab report "
                        "writes one beside report.md; an older one lacks it): report the run "
                        "dirs, or write the runs.csv again with `heads-lab report <run dirs>`")
    return [_run(path, i, line, split) for i, line in enumerate(lines, 2)]


def _run(path: Path, lineno: int, line: dict[str, str], split: str) -> dict[str, Any]:
    where = f"{path}:{lineno}"
    try:
        config = json.loads(line[CONFIG])
        overrides = json.loads(line.get(OVERRIDES) or "[]")
    except (json.JSONDecodeError, TypeError) as err:
        raise DataError(f"{where}: its {CONFIG} column is not JSON ({err}); restore the file as "
                        "the report wrote it") from None
    if not isinstance(config, dict):
        raise DataError(f"{where}: its {CONFIG} column is not a JSON object; restore the file "
                        "as the report wrote it")
    if str(config.get("trainer.precision")) == "auto" and line.get("precision"):
        config["trainer.precision"] = line["precision"]  # what the run computed in, as collect

    def number(column: str) -> float | None:
        text = (line.get(column) or "").strip()
        if not text:
            return None
        try:
            value = float(text)
        except ValueError:
            raise DataError(f"{where}: '{column}' is {text!r}, not a number; restore the file "
                            "as the report wrote it") from None
        return value if math.isfinite(value) else None

    def whole(column: str) -> int | None:
        value = number(column)
        return None if value is None else int(value)

    metrics = {key: number(column) for key, column in (
        ("valid/ppl", "valid PPL"), (f"{split}/bleu", f"{split} BLEU"),
        (f"{split}/chrf", f"{split} chrF"), (f"{split}/bleu_multiref", f"multiref {split} BLEU"),
        (f"{split}/chrf_multiref", f"multiref {split} chrF"),
        ("valid/bits_per_byte", "valid bits/byte"), (f"{split}/ppl", f"{split} PPL"),
        (f"{split}/bits_per_byte", f"{split} bits/byte"),
        ("train/tokens_per_s", "tok/s"), ("cost/peak_mem_mb", "peak MB"),
        ("cost/params", "params"))}
    metrics = {k: v for k, v in metrics.items() if v is not None}
    best = whole("best step")
    checkpoint = config.get("eval.checkpoint") or "last"
    train = {"best_step": best, "steps": whole("steps"), "seconds": number("train s"),
             "stopped_by": line.get("stopped by") or None,
             "max_time": config.get("trainer.max_time"),
             "evaluated": {"checkpoint": checkpoint,
                           "step": best if checkpoint == "best" else whole("steps")}}
    kv = whole("kv cache B/token")
    results = {"status": "complete", "decoding": {"split": split}, "train": train,
               **({"cost": {"kv_cache_bytes_per_token": kv}} if kv is not None else {}),
               "data": {"train": {"kept": whole("train pairs")}}, "overrides": overrides,
               "precision": line.get("precision") or None, "device": line.get("device") or None,
               "env": {"cpu": line.get("cpu") or None,
                       "git": {"commit": line.get("commit") or None}},
               "from_csv": where, "run_text": line.get("run") or where,
               "seed_p": line.get(SEED_P) or None}
    run_dir = Path(line["run"]).expanduser() if line.get("run") else Path(where)
    return {"dir": run_dir, "config": config, "metrics": metrics, "results": results}
