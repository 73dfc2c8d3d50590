"""`prune method=importance` of any Subject (analysis/subject.py), written once: Michel et al.
2019's curves (importance_curves), their table (prune.md, prune.csv, the console) and figure
(prune_importance.png). What a point measures, and whether heads are removed or masked, is the
subject's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heads_lab.analysis.subject import Subject, importance_curves
from heads_lab.output.curves import plot_curves
from heads_lab.output.tables import show, to_rich, write_csv, write_markdown


def importance_pruning(subject: Subject, out: Path, say) -> dict[str, Any]:
    """The curves of prune.sites' heads, pruned prune.step at a time, written into `out` and
    shown; returns prune.json's record of them (without the subject's identity)."""
    p = subject.run.prune
    curves = importance_curves(subject, list(p.sites), p.step, subject.verb, say)
    table = curve_table(curves, subject)
    write_tables(out, table, subject.prune_note)
    png = plot_curves(curves, out / "prune_importance.png", p.eval_split,
                      left=subject.task_metric)
    show(to_rich(table, subject.prune_title), width=160)
    return {"method": "importance", "eval_split": p.eval_split, "step": p.step, "curves": curves,
            "files": ["prune.md", "prune.csv", png.name]}


def curve_table(curves: dict[str, list[dict[str, Any]]], subject: Subject) -> dict[str, Any]:
    """A row per point of every curve: the curve's name, then the subject's columns."""
    return {"header": ["pruned in", *(name for name, _ in subject.curve_columns)],
            "rows": [[name, *(cell(r) for _, cell in subject.curve_columns)]
                     for name, points in curves.items() for r in points]}


def write_tables(out: Path, table: dict[str, Any], note: str) -> None:
    """prune.md (with `note` under the table) and prune.csv."""
    write_markdown(out / "prune.md", {**table, "note": note})
    write_csv(out / "prune.csv", table)
