"""The report of language models (task=lm): each row's perplexity and bits per byte, and its p
on bits per byte against the base row. Torch-free.

The p is the translator's seed-aware test (heads_lab/report/significance.py: Welch's t over the
seeds, its variance the seeds' spread plus the test set's), with the test set's variance from a
bootstrap over the held-out rows (blocks or sentences) that recomputes each run's bits per byte
on every draw as Σ NLL / (ln 2 · Σ bytes) of the rows drawn, from the rows' (tokens, bytes, NLL)
each run wrote (scores.<split>.tsv): bits per byte is a ratio of sums, not a mean of the rows'
own. Where a side has one seed, a paired bootstrap of the rows (both runs' bits per byte on the
same draws): p = twice the share of draws on the far side of zero, at least 1 / draws, marked
"rows only". Without the per-row files (a runs.csv alone) the test is over the seeds only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from heads_lab.report import runs_csv
from heads_lab.report import significance as sig
from heads_lab.report.rows import Row, Run, params_text, stat

LN2 = math.log(2)
ONE_SEED = "one seed (rows only)"


def is_lm(runs: list[Run]) -> bool:
    return any(str(r.config.get("task")) == "lm" for r in runs)


def split_of(run: Run) -> str:
    """The split a run was scored on (a translator's decoding, a language model's scoring)."""
    record = run.results.get("scoring") or run.results.get("decoding") or {}
    return record.get("split") or run.config.get("eval.split") or "test"


def row_stats(run: Run, split: str) -> np.ndarray | None:
    """A run's held-out rows' [NLL, bytes] (scores.<split>.tsv), None where it has none."""
    path = run.dir / f"scores.{split}.tsv"
    try:
        rows = [line.split("\t") for line in path.read_text().splitlines()[1:]]
    except OSError:
        return None
    if not rows or rows[0][1] == "":  # no text (repeats): no bytes
        return None
    return np.array([[float(r[2]), float(r[1])] for r in rows])


def bpb_rows(summed: np.ndarray) -> np.ndarray:
    """Bits per byte of each row of summed [NLL, bytes]."""
    return summed[:, 0] / (LN2 * summed[:, 1])


def significance(rows: list[Row], base: Row, split: str, samples: int) -> None:
    """Each row's p on bits per byte against the base row (module doc)."""
    key = f"{split}/bits_per_byte"
    base_runs = _per_seed(base)
    stats = {r.dir: row_stats(r, split) for row in rows for r in row.runs}
    base_text = [stats[r.dir] for r in base_runs if stats[r.dir] is not None]
    counts = sig.sentence_draws(len(base_text[0]), samples) if base_text else None
    for row in rows:
        if row is base:
            continue
        mine = _per_seed(row)
        if any(not isinstance(r.metrics.get(key), (int, float)) for r in (*mine, *base_runs)):
            row.p_reason = f"a run without {key}"
            continue
        have = counts is not None and all(stats[r.dir] is not None for r in (*mine, *base_runs))
        if have and not all(np.array_equal(stats[r.dir][:, 1], base_text[0][:, 1])
                            for r in (*mine, *base_runs)):  # other rows (bytes differ)
            row.p_reason = "other test set"
            continue

        def draws(runs: list[Run]) -> list[np.ndarray]:
            return [sig.resampled(stats[r.dir], counts, bpb_rows) for r in runs]

        if len(mine) >= 2 and len(base_runs) >= 2:
            result = sig.seed_test([r.metrics[key] for r in mine],
                                   [r.metrics[key] for r in base_runs],
                                   draws(mine) if have else None,
                                   draws(base_runs) if have else None)
            row.p_value, row.p_test = result.p, result.test
            continue
        shared = [s for s in {r.config.get("seed") for r in mine}
                  if s in {r.config.get("seed") for r in base_runs}]
        if not shared or not have:
            row.p_reason = ("no seed of the base row" if not shared else
                            f"no scores.{split}.tsv in a run dir")
            continue
        seed = sorted(shared)[0]
        a = next(r for r in mine if r.config.get("seed") == seed)
        b = next(r for r in base_runs if r.config.get("seed") == seed)
        diff = draws([a])[0] - draws([b])[0]
        observed = a.metrics[key] - b.metrics[key]
        far = np.mean(diff <= 0) if observed > 0 else np.mean(diff >= 0)
        row.p_value = min(1.0, max(2 * float(far), 1.0 / samples))
        row.p_test, row.p_seeds = ONE_SEED, [seed]


def _per_seed(row: Row) -> list[Run]:
    by_seed = {r.config.get("seed"): r for r in row.runs}
    return [by_seed[s] for s in sorted(by_seed, key=str)]


def p_text(row: Row) -> str:
    marks = [row.p_reason] if row.p_reason else []
    if row.p_test == sig.SEEDS_ONLY:
        marks.append(sig.SEEDS_ONLY)
    if row.p_test == ONE_SEED and row.p_value is not None:
        marks.append(f"seed {row.p_seeds[0]}, rows only")
    why = "; ".join(marks)
    if row.p_value is None:
        return f"– ({why})" if why else "-"
    return sig.p_text(row.p_value) + (f" ({why})" if why else "")


def render(rows: list[Row], bases: list[Row], shape_cells, shape_header: list[str],
           split: str) -> dict[str, Any]:
    """The table: setting, head shape, params, KV cache bytes per token, runs, valid and test
    PPL and bits per byte (mean ± std over seeds), p of bits per byte vs the base row, tok/s,
    peak MB."""
    shape_header = ["layers" if h == "enc+dec" else h for h in shape_header]
    header = ["setting", *shape_header, "params", "KV cache B/token", "runs", "valid PPL",
              "valid bits/byte", f"{split} PPL", f"{split} bits/byte", "p vs base", "tok/s",
              "peak MB"]
    body = []
    for row in rows:
        m = [r.metrics for r in row.runs]
        kv = {r.results.get("cost", {}).get("kv_cache_bytes_per_token") for r in row.runs}
        body.append([row.label + (" (base)" if any(row is b for b in bases) else ""),
                     *shape_cells(row), params_text([x.get("cost/params") for x in m]),
                     ", ".join(f"{k:,}" for k in sorted(kv - {None})) or "",
                     str(len(row.runs)), stat([x.get("valid/ppl") for x in m], 2),
                     stat([x.get("valid/bits_per_byte") for x in m], 4),
                     stat([x.get(f"{split}/ppl") for x in m], 2),
                     stat([x.get(f"{split}/bits_per_byte") for x in m], 4), p_text(row),
                     stat([x.get("train/tokens_per_s") for x in m], 0),
                     stat([x.get("cost/peak_mem_mb") for x in m], 0)])
    unused = [i for i in range(1, 1 + len(shape_header)) if all(b[i] == "–" for b in body)]
    header = [x for i, x in enumerate(header) if i not in unused]  # e.g. h_K beside mha
    body = [[x for i, x in enumerate(b) if i not in unused] for b in body]
    kinds = {row.p_test for row in rows if row.p_value is not None}
    note = ("mean ± std over the runs (seeds) of a row; bits per byte = Σ NLL / (ln 2 · UTF-8 "
            "bytes scored), lower is better; p of bits per byte vs the base row: ")
    note += ("Welch's t over seeds, its variance the seeds' spread plus the test set's (a "
             "bootstrap over the held-out rows recomputing each run's Σ NLL / Σ bytes; "
             "docs/significance.md)" if kinds & {sig.SEEDS_AND_SENTENCES, sig.SEEDS_ONLY}
             else "where both have two or more seeds, Welch's t over seeds")
    if sig.SEEDS_ONLY in kinds:
        note += "; (seeds only): the per-row scores are not at hand"
    if ONE_SEED in kinds:
        note += ("; (seed k, rows only): a paired bootstrap of the held-out rows on that seed, "
                 "where a side has one seed (its spread unknown)")
    note += ("; KV cache: bytes per token of context in fp32 (layers · (key heads + value heads) "
             "· d_k · 4)")
    return {"header": header, "rows": body, "note": note}


RUN_COLUMNS = ("setting", "seed", "run", "valid PPL", "valid bits/byte", "{split} PPL",
               "{split} bits/byte", "p vs base", "steps", "stopped by", "train s", "tok/s",
               "peak MB", "params", "kv cache B/token", "precision", "device", "cpu")


def runs_table(rows: list[Row], split: str, where) -> dict[str, Any]:
    """runs.csv for language models: each run's numbers before they are pooled, then its
    overrides and whole config as JSON (heads_lab/report/runs_csv.py reads it back)."""
    header = [c.format(split=split) for c in RUN_COLUMNS] + [runs_csv.OVERRIDES, runs_csv.CONFIG]
    body = []
    for row in rows:
        for run in sorted(row.runs, key=lambda r: str(r.config.get("seed"))):
            m, train = run.metrics, run.results.get("train", {})
            seed = run.config.get("seed")
            body.append([
                row.label, "" if seed is None else str(seed), where(run),
                _number(m.get("valid/ppl"), 4), _number(m.get("valid/bits_per_byte"), 6),
                _number(m.get(f"{split}/ppl"), 4), _number(m.get(f"{split}/bits_per_byte"), 6),
                "base" if row.p_value is None and not row.p_reason else p_text(row),
                _number(train.get("steps"), 0), str(train.get("stopped_by") or ""),
                _number(train.get("seconds"), 0), _number(m.get("train/tokens_per_s"), 0),
                _number(m.get("cost/peak_mem_mb"), 0), _number(m.get("cost/params"), 0),
                _number(run.results.get("cost", {}).get("kv_cache_bytes_per_token"), 0),
                str(run.config.get("trainer.precision") or ""),
                str(run.results.get("device") or ""),
                str((run.results.get("env") or {}).get("cpu") or ""),
                json.dumps(run.results.get("overrides") or [], ensure_ascii=False),
                json.dumps(run.config, sort_keys=True, ensure_ascii=False, default=str)])
    return {"header": header, "rows": body, "note": ""}


def _number(value, digits: int) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return ""
    return f"{value:.{digits}f}" if digits else f"{value:.0f}"


def where(run: Run, home: Path) -> str:
    path = run.dir.resolve()
    if path != home and path.is_relative_to(home):
        return f"~/{path.relative_to(home)}"
    return str(path)
