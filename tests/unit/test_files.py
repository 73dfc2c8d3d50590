"""Files heads-lab writes: atomically, with the permissions of any file the user creates."""

from __future__ import annotations

import json
import os
import stat

import pytest


@pytest.mark.parametrize("umask,expected", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_written_files_follow_the_umask_like_any_other_file(tmp_path, umask, expected):
    """results.json, hyps, reports: readable by colleagues where the umask lets any file be."""
    from heads_lab.output.files import write_atomic, write_json

    old = os.umask(umask)
    try:
        text, js = write_atomic(tmp_path / "a.txt", "x\n"), write_json(tmp_path / "r.json", {"a": 1})
        (tmp_path / "plain.txt").write_text("x")  # what open() gives under the same umask
    finally:
        os.umask(old)
    for path in (text, js, tmp_path / "plain.txt"):
        assert stat.S_IMODE(path.stat().st_mode) == expected, path
    assert json.loads(js.read_text()) == {"a": 1}


def test_csv_tables_are_numbers_a_program_reads(tmp_path):
    """report.csv and prune.csv are for programs: read back with the csv module, a number is a
    number (float() takes it: no thousands separators), a 'mean ± sd' cell is two columns, and
    text cells (a p with its note, '-') stay as they are; the Markdown keeps the formatted form."""
    import csv

    from heads_lab.output.tables import markdown, write_csv

    table = {"header": ["setting", "params", "runs", "test BLEU", "p vs base", "tok/s"],
             "rows": [["h=1", "7,578,624", "3", "38.48 ± 0.43", "0.0277 (seeds only)",
                       "2,249 ± 599"],
                      ["h=8 (base)", "7,578,624", "1", "38.16", "-", "690"]],
             "note": ""}
    write_csv(tmp_path / "report.csv", table)
    with open(tmp_path / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["setting", "params", "runs", "test BLEU", "test BLEU sd",
                             "p vs base", "tok/s", "tok/s sd"]
    assert [float(rows[0][k]) for k in ("params", "test BLEU", "test BLEU sd", "tok/s",
                                        "tok/s sd")] == [7578624, 38.48, 0.43, 2249, 599]
    assert rows[1]["test BLEU sd"] == "" and float(rows[1]["tok/s"]) == 690
    assert rows[0]["p vs base"] == "0.0277 (seeds only)" and rows[1]["p vs base"] == "-"
    assert "| h=1 | 7,578,624 | 3 | 38.48 ± 0.43 |" in "\n".join(markdown(table))
