"""The one table writer: a table is {"header": [...], "rows": [[str, ...], ...], "note": str}
(cells already formatted), shown on the console (rich) and written as Markdown and CSV."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table as Rich

from heads_lab.config.sites import KEPT_COLUMNS, SITES
from heads_lab.output import tracking
from heads_lab.output.files import write_atomic

Table = dict[str, Any]


def to_rich(table: Table, title: str):
    """A rich Table: the first column left-aligned (the row's name), the others right."""
    out = Rich(title=title, caption=table.get("note"), title_justify="left")
    for i, col in enumerate(table["header"]):
        out.add_column(col, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for row in table["rows"]:
        out.add_row(*row)
    return out


def wide_console(width: int = 220):
    """The console for tables: the terminal's, or for output that is piped or captured one
    `width` wide, so no column is cut."""
    console = tracking.console
    return console if console.is_terminal else Console(width=width, soft_wrap=True, markup=False)


def show(table, width: int = 220) -> None:
    """Print a rich table (or a Table dict, untitled) in full (see wide_console)."""
    wide_console(width).print(to_rich(table, "") if isinstance(table, dict) else table)


def markdown(table: Table) -> list[str]:
    """A Markdown table's lines (the first column left-aligned), its note in italics below."""
    lines = ["| " + " | ".join(table["header"]) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(table["header"]) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table["rows"]]
    if table.get("note"):
        lines += ["", f"*{table['note']}*"]
    return lines


def write_markdown(path: Path, table: Table | list[tuple[str, Table]],
                   problems: list[tuple[str, str]] = ()) -> Path:
    """A Markdown table, its note in italics below, and `problems` (dir, why) listed. Several
    (name, table) pairs: a `## data=<name>` section each (one table when there is one)."""
    sections = table if isinstance(table, list) else [("", table)]
    lines = []
    for name, one in sections:
        lines += ([f"## data={name}", ""] if len(sections) > 1 else []) + markdown(one) + [""]
    if problems:
        lines += ["Not in the table:", ""] + [f"- `{d}`: {s}" for d, s in problems] + [""]
    return write_atomic(path, "\n".join(lines))


def write_csv(path: Path, table: Table | list[Table]) -> Path:
    """A table as CSV for programs (`plain`: numbers without thousands separators, a 'mean ±
    sd' column as two); several tables as one, their columns' union in order (a cell a table
    lacks is empty)."""
    tables = [plain(t) for t in (table if isinstance(table, list) else [table])]
    header = list(dict.fromkeys(col for t in tables for col in t["header"]))
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    for t in tables:
        writer.writerows([dict(zip(t["header"], r)).get(col, "") for col in header]
                         for r in t["rows"])
    return write_atomic(path, buffer.getvalue())


NUMBER = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?|[+-]?\d+(\.\d+)?")  # 7,578,624 or 38.48
SPREAD = re.compile(r"(\S+) ± (\S+)")  # mean ± sd


def plain(table: Table) -> Table:
    """The table for programs (CSV): a number written with thousands separators ('7,578,624')
    plain ('7578624'), and a column whose cells are 'mean ± sd' as two columns, '<name>' (the
    mean) and '<name> sd' (empty for a single run); other text stays as it is (a p cell with its
    note, '-')."""
    header, rows = table["header"], table["rows"]
    spread = {i for i in range(len(header))
              if any(SPREAD.fullmatch(r[i]) for r in rows if i < len(r))}

    def number(cell: str) -> str:
        return cell.replace(",", "") if NUMBER.fullmatch(cell) else cell

    out_header, out_rows = [], [[] for _ in rows]
    for i, name in enumerate(header):
        out_header += [name, f"{name} sd"] if i in spread else [name]
        for row, out in zip(rows, out_rows):
            cell = row[i] if i < len(row) else ""
            if i in spread:
                both = SPREAD.fullmatch(cell)
                out += [number(both.group(1)), number(both.group(2))] if both else [number(cell), ""]
            else:
                out.append(number(cell))
    return {**table, "header": out_header, "rows": out_rows}


def gate_table(results: list[dict]) -> Rich:
    """`prune -m prune.l0_lambda=...`'s jobs side by side: heads kept per attention type vs BLEU,
    as Voita et al.'s table."""
    rules = " / ".join(sorted({r.get("gate_eval", "binary") for r in results}))
    table = Rich(title=f"Hard Concrete gates (Voita et al. 2019): heads kept ({rules} rule) vs "
                        "BLEU", title_justify="left")
    for col in ("λ", "from", *KEPT_COLUMNS, "BLEU", "BLEU unpruned", "PPL"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(f"{r['l0_lambda']:g}", "trained", *(str(r["kept"][s]) for s in SITES),
                      f"{r['bleu']:.2f}", f"{r['bleu_before']:.2f}", f"{r['ppl']:.2f}")
    return table
