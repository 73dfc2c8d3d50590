"""Every p on the results pages names its test. Two tests have printed p's there: sacrebleu's
paired bootstrap on the seeds' hypotheses pooled, which counts the test sentences but not the
seeds (its floor with 1,000 resamples is 0.001), and the seed-aware Welch's t over the seeds
(docs/significance.md). A reader must see which one a p is: each p (`p = 0.03`, `p=0.03`,
`p < 0.001`, `p ≤ 0.001`, `p 0.03`, `pooled 0.38`, and the cells of a table's p column) needs
a label naming its test in its own sentence, or, in a table, in its cell, its column's header
or the table's note (the paragraph right above the table, or an italic one right below):
'over the seeds' (or 'over seeds', 'over the two/three seeds', not as in 'std over the
seeds'), '(seeds only)', or 'sentences only' ('pooled, sentences only', '(seed 1, sentences
only)'), or a language model's 'rows only'. A p at the bootstrap's floor is written '≤ 0.001'
(or '< 0.001'), never a bare 0.001. A level written 'at p < 0.05' is a threshold, not a p,
and needs no label."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"

NUMBER = r"(\d*\.\d+|\d+)"
# p = 0.03, p=0.03, p < 0.001, p ≤ 0.001, p <= 0.001, p 0.03, p vs 8: 0.03, p down to 0.002 (not
# 'p over the seeds 0.03', which names its test anyway)
P_TOKEN = re.compile(r"(?<![\w.'’-])p(?: vs [^:;()|.]{1,20}?:| down to)?\s*(=|<=|<|≤|>|≥)?\s*"
                     + NUMBER + r"(?![\w])")
# the pooled bootstrap's value written without a 'p': 'pooled 0.38', 'the pooled bootstrap
# said ≤ 0.004', 'the pooled bootstrap's 0.005'
POOLED_TOKEN = re.compile(r"\bpooled(?: bootstrap(?:['’]s)?)?(?: said)?\s+(<=|<|≤)?\s*(\d*\.\d+)")
LABEL = re.compile(r"over (?:the (?:two |three )?)?seeds|seeds only|sentences only|rows only",
                   re.I)  # (a language model's one-seed p: its held-out rows only)
NOT_A_LABEL = re.compile(r"(?:std|sd|mean|average|deviation|±)\s*$", re.I)  # 'std over the seeds'
FLOOR = {"0.001", "0.0010", ".001"}
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*(\[`])")  # unless after an abbreviation:
ABBREVIATION = re.compile(r"(?:\bal|\bvs|\bcf|\be\.g|\bi\.e|\bapprox)\.$")


def labelled(text: str) -> bool:
    """Whether text names a test: a label that is not a mean's or a spread's 'over the seeds'."""
    return any(not NOT_A_LABEL.search(text[:m.start()]) for m in LABEL.finditer(text))


def tokens(text: str) -> list[tuple[str, str, str]]:
    """The p-values in prose: (the token as written, its operator, its number); a threshold
    ('at p < 0.05') is left out."""
    found = []
    for m in P_TOKEN.finditer(text):
        if m.group(1) in ("<", "≤", "<=") and re.search(r"\bat\s*$", text[:m.start()]) \
                and m.group(2) in ("0.05", "0.01", "0.1"):
            continue
        found.append((m.group(0), m.group(1) or "", m.group(2)))
    found += [(m.group(0), m.group(1) or "", m.group(2)) for m in POOLED_TOKEN.finditer(text)]
    return found


def floor_unmarked(op: str, number: str) -> bool:
    return number in FLOOR and op not in ("<", "≤", "<=")


def blocks(lines: list[str]) -> list[tuple[str, int, list[str]]]:
    """The page cut into ('table' | 'text', first line number, lines): tables are runs of lines
    starting with '|'; a text block ends at a blank line, a heading, a fence, a table or a new
    list item (a list item is its own paragraph). A code block's lines are text (its comments
    print p's too)."""
    out: list[tuple[str, int, list[str]]] = []
    kind, start, cur, code, before = "", 0, [], False, ""
    for i, line in enumerate(lines + [""], 1):
        s = line.strip()
        heading = s.startswith("#") and not code
        item = re.match(r"(?:[-*+]|\d+\.) ", s) is not None and not code
        this = "table" if s.startswith("|") and not code else "text"
        # in a code block: a run of comment lines, or one command (its lines joined by '\\')
        new_unit = code and (s.startswith("#") != before.startswith("#")
                             or not s.startswith("#") and not before.endswith("\\"))
        if cur and (not s or s.startswith("```") or heading or this != kind or new_unit
                    or this == "text" and item):
            out.append((kind, start, cur))
            cur = []
        if s.startswith("```"):
            code = not code
        elif s and not heading:
            if not cur:
                kind, start = this, i
            cur.append(line)
        before = s
    return out


def sentences(block: list[str], first: int) -> list[tuple[int, str]]:
    """A text block's sentences, each with the line it starts on."""
    text, starts = "", []
    for n, line in enumerate(block):
        starts.append((len(text), first + n))
        text += line.strip() + " "
    cuts = [0] + [m.end() for m in SENTENCE_END.finditer(text)
                  if not ABBREVIATION.search(text[:m.start()])] + [len(text)]
    return [(max(ln for off, ln in starts if off <= a), text[a:b].strip())
            for a, b in zip(cuts, cuts[1:]) if text[a:b].strip()]


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def table_problems(rows: list[str], first: int, note: str) -> list[tuple[int, str, str]]:
    """A table's p's without a label in their cell, their column's header or the note; floors
    written bare. A p column is one whose header names p ('p vs base', 'pooled p', '... (p)')."""
    head = cells(rows[0])
    p_cols = {j for j, h in enumerate(head) if re.search(r"(?<![\w'’])p(?![\w'’])", h)}
    problems = []
    for k, row in enumerate(rows[2:], first + 2):
        for j, cell in enumerate(cells(row)):
            header = head[j] if j < len(head) else ""
            found = tokens(cell)
            if j in p_cols:
                inner = re.findall(r"\(([^()]*)\)", cell) if "(p)" in header else [cell]
                found += [("cell", op, num) for part in inner for op, num in
                          re.findall(r"(<=|<|≤)?\s*(?<![\w.+−-])" + NUMBER + r"(?![\w])",
                                     re.sub(r"\(seeds? [\d, ]+(?:, sentences only)?\)|seed \d+",
                                            "", part))]
            for token, op, num in found:
                text = cell if token == "cell" else token
                if not (labelled(cell) or labelled(header) or labelled(note)):
                    problems.append((k, "no label naming its test", text))
                if floor_unmarked(op, num):
                    problems.append((k, "a floor written without ≤ or <", text))
    return problems


def page_problems(path: Path, root: Path = ROOT) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    parts = blocks(lines)
    found = []
    for i, (kind, first, block) in enumerate(parts):
        if kind == "text":
            for line, sentence in sentences(block, first):
                for token, op, num in tokens(sentence):
                    if not labelled(sentence):
                        found.append((line, "no label naming its test", sentence))
                    if floor_unmarked(op, num):
                        found.append((line, "a floor written without ≤ or <", token))
            continue
        above = " ".join(parts[i - 1][2]) if i and parts[i - 1][0] == "text" and \
            parts[i - 1][1] + len(parts[i - 1][2]) >= first - 1 else ""  # one blank line between
        below = parts[i + 1] if i + 1 < len(parts) else None
        below = " ".join(below[2]) if below and below[0] == "text" and \
            below[2][0].lstrip().startswith(("*", "(")) else ""
        found += table_problems(block, first, above + " " + below)
    rel = path.relative_to(root)
    return [f"{rel}:{line}: {why}: {text[:160]}" for line, why, text in found]


def all_problems() -> list[str]:
    return [p for path in sorted(RESULTS.rglob("*.md")) for p in page_problems(path)]


def test_every_p_on_the_results_pages_names_its_test():
    problems = all_problems()
    assert not problems, f"{len(problems)} p's unlabelled or at a bare floor:\n" + \
        "\n".join(problems)


def test_the_check_finds_what_it_should(tmp_path):
    """The rule itself: an unlabelled p, a bare floor, a label in another sentence, a mean's
    'over the seeds', a table whose p column has no label, are each found; labelled ones pass."""
    page = tmp_path / "page.md"
    bad = ("h = 32 is behind (p = 0.03). Over the seeds it is level (p = 0.2 over the seeds).\n"
           "\n"
           "- mean ± std over the seeds 38.1, p 0.04.\n"
           "- the pooled bootstrap said 0.002. Then p = 0.001 (pooled, sentences only).\n"
           "\n"
           "The table.\n"
           "\n"
           "| h | BLEU | p vs base |\n|---:|---:|---:|\n| 1 | 38.1 | 0.0010 |\n| 4 | 38.2 | 0.03 |\n")
    good = ("h = 32 is behind (p = 0.03 over the seeds; p ≤ 0.001 (pooled, sentences only)).\n"
            "Rejections at p < 0.05 are counted.\n"
            "\n"
            "| h | BLEU | p vs base |\n|---:|---:|---:|\n| 1 | 38.1 | ≤ 0.001 |\n| 4 | 38.2 | 0.03 |\n"
            "\n*p: sacrebleu paired bootstrap (pooled, sentences only)*\n")
    page.write_text(bad, encoding="utf-8")
    got = [g.split(":")[1] for g in page_problems(page, tmp_path)]
    assert got == ["1", "3", "4", "4", "10", "10", "11"], page_problems(page, tmp_path)
    page.write_text(good, encoding="utf-8")
    assert page_problems(page, tmp_path) == []
