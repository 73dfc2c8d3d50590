"""`heads-lab report --choose KEY`: a setting tuned per row (the learning rate chosen for each head
count), one value kept per row. Torch-free.

A study that tunes, say, the learning rate for each setting on one seed and then runs more seeds
at the rate each chose (one rate tuned for h = 8 would favour h = 8) reports from all its runs at
once: the runs are grouped by their other settings, and within each group the value of KEY whose
runs have the lowest validation score — a language model's valid bits per byte, a translator's
valid perplexity — is kept; the other values' rows leave the table (they are listed, with their
scores, in chosen.md / chosen.csv). The values of a group are compared on the seeds they all share
(seed 1 where seed 1 tuned the rate and seeds 2 and 3 ran at the chosen one), so adding seeds at
the chosen value never changes the choice (a value run on fewer seeds narrows the comparison to
those). Ties go to the first value in the report's order (the smallest number); a score that is
not finite loses. A choice at the largest or smallest number tried is flagged: the best may lie
beyond the values tried (a run that failed there is listed under the table, not scored).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any

from heads_lab.errors import ConfigError
from heads_lab.output.tracking import short_key
from heads_lab.report.labels import as_written
from heads_lab.report.rows import Row, value_order


@dataclass
class Choice:
    """One group's choice: its other settings' label, each value's (score, runs) on the seeds
    every value has, the value kept, and whether it sits at an end of the values tried."""
    label: str
    scores: dict[str, float]  # value as written -> mean score over `seeds`
    runs: dict[str, int]  # value as written -> runs in its row (all seeds)
    seeds: list[int]
    chosen: str
    edge: str | None  # "largest" / "smallest" value tried, or None


def metric(lm: bool) -> tuple[str, str]:
    """The validation score a choice minimises: (metrics key, its words)."""
    return ("valid/bits_per_byte", "valid bits per byte") if lm else ("valid/ppl", "valid PPL")


def choose(rows: list[Row], varying: list[str], key: str, lm: bool
           ) -> tuple[list[Row], list[str], list[Choice]]:
    """(the rows kept, one per group, in their order; varying, unchanged: the rows' labels keep
    the value each uses; the choices). ConfigError, one line, where KEY does not vary between
    the runs, or a group's values share no seed, or a value's runs lack the score."""
    name, words = metric(lm)
    if key in ("seed", "data.name"):
        why = ("seeds are pooled in a row, never chosen" if key == "seed"
               else "scores on different corpora do not compare")
        raise ConfigError(f"--choose {key}: {why}; choose a training setting (e.g. trainer.lr)")
    if key not in varying:
        raise ConfigError(
            f"--choose {key}: it does not vary between these runs (what varies: "
            f"{', '.join(varying) or 'nothing but the seed'}); name one of those, or leave "
            "--choose out")
    others = [k for k in varying if k != key]
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        config = row.runs[0].config
        groups.setdefault(tuple(json.dumps(config.get(k), sort_keys=True) for k in others),
                          []).append(row)
    kept, choices = [], []
    for members in groups.values():
        config = members[0].runs[0].config
        label = ",".join(f"{short_key(k)}={as_written(config.get(k))}" for k in others) \
            or "all runs"
        seeds = sorted(set.intersection(*({r.config.get("seed") for r in row.runs}
                                          for row in members)),
                       key=value_order)
        if not seeds:
            have = "; ".join(f"{_value(row, key)}: seeds "
                             f"{', '.join(str(r.config.get('seed')) for r in row.runs)}"
                             for row in members)
            raise ConfigError(f"--choose {key}: at {label} its values share no seed to compare "
                              f"them on ({have}); run every value with one same seed")
        scores = {}
        for row in members:
            values = [r.metrics.get(name) for r in row.runs if r.config.get("seed") in seeds]
            if any(v is None for v in values) and len(members) > 1:
                raise ConfigError(f"--choose {key}: a run of {row.label} has no {words} "
                                  f"({name}) to choose by; validate every run "
                                  "(trainer.valid_every)")
            scores[_value(row, key)] = (statistics.fmean(values) if None not in values
                                        else math.nan)
        best = min(members, key=lambda row: _rank(scores[_value(row, key)]))  # ties: the first
        numbers = [row.runs[0].config.get(key) for row in members]
        edge = None
        if len(members) > 1 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                    for v in numbers):
            mine = best.runs[0].config.get(key)
            edge = "largest" if mine == max(numbers) else "smallest" if mine == min(numbers) \
                else None
        kept.append(best)
        choices.append(Choice(label, scores, {_value(r, key): len(r.runs) for r in members},
                              seeds, _value(best, key), edge))
    if all(len(c.scores) == 1 for c in choices):
        raise ConfigError(
            f"--choose {key}: no setting has two values of it to compare: it varies together "
            f"with {', '.join(others) or 'nothing'} (a key set with each value splits the "
            "settings); leave --choose out, or run one setting at several values")
    first = {}  # data sets in the order the report gives them (its first dir's first)
    for row in rows:
        first.setdefault(json.dumps(row.runs[0].config.get("data.name")), len(first))
    ranks = [[first[json.dumps(row.runs[0].config.get(k))] if k == "data.name"
              else value_order(row.runs[0].config.get(k)) for k in others] for row in kept]
    order = sorted(range(len(kept)), key=lambda i: ranks[i])  # as group() orders, KEY left out
    return [kept[i] for i in order], varying, [choices[i] for i in order]


def _rank(score: float) -> float:
    """A score to minimise: one that is not finite (a diverged run's NaN) loses."""
    return score if math.isfinite(score) else math.inf


def _value(row: Row, key: str) -> str:
    return as_written(row.runs[0].config.get(key))


def table(choices: list[Choice], key: str, lm: bool) -> dict[str, Any]:
    """The choices as a table (the report's Table shape): a row per group, a column per value
    tried (its score on the compared seeds; empty where the group did not try it)."""
    _, words = metric(lm)
    values = sorted({v for c in choices for v in c.scores}, key=_value_order)
    header = ["setting", *[f"{short_key(key)}={v}" for v in values], f"chosen {short_key(key)}",
              "compared on seeds", "runs at the chosen value", "note"]
    body = []
    for c in choices:
        note = "" if c.edge is None else (
            f"the {c.edge} value tried: a {'larger' if c.edge == 'largest' else 'smaller'} one "
            "may be better")
        if len(c.scores) == 1:
            note = "one value: nothing compared"
        body.append([c.label, *[f"{c.scores[v]:.4f}" if v in c.scores and not math.isnan(
            c.scores[v]) else "" for v in values],
                     c.chosen, ", ".join(map(str, c.seeds)), str(c.runs[c.chosen]), note])
    note = (f"{short_key(key)} ({key}) chosen per setting by the lowest {words}, the mean over the "
            "seeds every value of the setting has (a value's other seeds do not count, so seeds "
            "added at the chosen value never change the choice); the report's table keeps the "
            "chosen value's row of each setting")
    return {"header": header, "rows": body, "note": note, "varying": [key]}


def _value_order(text: str) -> tuple:
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)
