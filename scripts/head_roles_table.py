"""Several `heads-lab analyze` results side by side: do any heads reach Voita et al.'s bars?

    python scripts/head_roles_table.py \
        'Multi30k seed 1, PUD=results/head_analysis/mha_h8/pud/analysis.md' \
        'Tatoeba seed 1, PUD=results/head_analysis_tatoeba/mha_h8_seed1/pud/analysis.md'

Each argument is LABEL=analysis.md (the file `analyze` writes beside analysis.json; published
under results/). Prints one Markdown table, a row per analysis: the heads with a role (P
positional, S syntactic, R rare, of all heads), the encoder's most positional head (the largest
share of queries whose maximum is at one offset ≠ 0: Voita's bar is 0.90) and the largest share
on the query's own token, the encoder head closest to a syntactic role (its relation and its
word-level accuracy minus the word-offset baseline: Voita's bar, as heads-lab applies it, is
+0.10), the encoder's confidence range and its largest LRP share, and the mean Jensen–Shannon
distance within each encoder layer. Every number is read from the file, as `analyze` rounded it.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

SITES = ("enc-self", "dec-self", "dec-enc")


@dataclass
class Summary:
    label: str
    roles: dict[str, int] = field(default_factory=dict)  # positional, syntactic, rare, other
    positional: tuple[float, str, str] = (0.0, "", "")  # share, offset, L{layer} H{head}
    self_share: tuple[float, str] = (0.0, "")
    syntactic: tuple[float, str, str] | None = None  # gain, relation, head (None: no trees)
    confidence: tuple[float, float] = (0.0, 0.0)
    lrp: float = 0.0
    within: dict[str, list[float]] = field(default_factory=dict)  # site → per layer


def tables(text: str) -> dict[str, list[list[str]]]:
    """Each `## title` of a Markdown file → its table's body rows (cells stripped)."""
    out: dict[str, list[list[str]]] = {}
    title = None
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
            out[title] = []
        elif title and line.startswith("|") and not set(line) <= set("|-: "):
            out[title].append([c.strip() for c in line.strip().strip("|").split("|")])
    return {k: rows[1:] for k, rows in out.items() if rows}  # without the header row


def _section(found: dict[str, list[list[str]]], prefix: str,
             optional: bool = False) -> list[list[str]]:
    """The rows of the first section whose title starts with `prefix` (a regular expression)."""
    for title, rows in found.items():
        if re.match(prefix, title):
            return rows
    if optional:  # e.g. the syntactic table of an analysis without trees
        return []
    raise SystemExit(f"error: no section '## {prefix}...' in the analysis.md: not written by "
                     "heads-lab analyze?")


def summarise(label: str, text: str) -> Summary:
    found = tables(text)
    s = Summary(label)
    for site, positional, syntactic, rare, other in _section(found, "head roles per attention type"):
        if site == "all":
            s.roles = {"positional": int(positional), "syntactic": int(syntactic),
                       "rare": int(rare), "other": int(other)}
    confidence, lrp = [], []
    # multi-head: 'enc-self heads: role ...'; talking heads: 'enc-self softmax heads (h = 8):
    # role ...', their LRP in the value heads' section
    for row in _section(found, r"enc-self (softmax )?heads( \(h = \d+\))?: role"):
        for cell in row[1:-1]:  # role · confidence · importance (· LRP)
            parts = cell.split()
            confidence.append(float(parts[1]))
            if len(parts) > 3 and parts[3] not in ("-", "–"):  # analyze writes – (none)
                lrp.append(float(parts[3]))
    for row in _section(found, r"enc-self · value heads", optional=True):
        for cell in row[1:]:  # importance · LRP
            parts = cell.split()
            if len(parts) > 1 and parts[1] not in ("-", "–"):
                lrp.append(float(parts[1]))
    s.confidence = (min(confidence), max(confidence))
    s.lrp = max(lrp) if lrp else float("nan")
    for row in _section(found, "enc-self positions"):
        for head, cell in enumerate(row[1:]):
            # '-1 0.91P · self 0.00' (P: above the bar); '– · self 1.00': no offset ≠ 0 at all
            match = re.match(r"(?:([+-]?\d+) ([0-9.]+)P?|–) · self ([0-9.]+)", cell)
            if not match:
                raise SystemExit(f"error: {label}: cannot read the positions cell {cell!r}")
            where = f"L{row[0]} H{head}"
            offset = match.group(1)
            if offset and offset.lstrip("+-") != "0" and float(match.group(2)) > s.positional[0]:
                s.positional = (float(match.group(2)), offset, where)
            if float(match.group(3)) > s.self_share[0]:
                s.self_share = (float(match.group(3)), where)
    for relation, _, _, head, _, gain, _ in _section(found, "syntactic heads", optional=True):
        value = float(gain.rstrip("*"))  # * marks a head above the bar
        if s.syntactic is None or value > s.syntactic[0]:
            s.syntactic = (value, relation, head)
    for site, _, within, _ in _section(found, "distance between heads"):
        s.within.setdefault(site, []).append(float(within.split("±")[0]))
    return s


def markdown(summaries: list[Summary]) -> str:
    header = ("| analysis | heads with a role (P / S / R of all) | most positional enc. head "
              "(offset ≠ 0; bar 0.90) | largest own-token share | closest to syntactic: gain "
              "over the word baseline (bar +0.10) | enc. confidence | largest enc. LRP share | "
              "enc. within-layer JS, layer by layer |")
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        r = s.roles
        total = sum(r.values())
        share, offset, where = s.positional
        syntactic = ("– (no trees)" if s.syntactic is None else
                     f"{s.syntactic[0]:+.2f} ({s.syntactic[1]}, {s.syntactic[2]})")
        lines.append(
            f"| {s.label} | {r['positional']} / {r['syntactic']} / {r['rare']} of {total} | "
            f"{share:.2f} at {offset} ({where}) | {s.self_share[0]:.2f} ({s.self_share[1]}) | "
            f"{syntactic} | {s.confidence[0]:.2f}–{s.confidence[1]:.2f} | "
            f"{s.lrp:.2f} | {' / '.join(f'{x:.3f}' for x in s.within.get('enc-self', []))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("analyses", nargs="+", help="LABEL=analysis.md")
    opts = parser.parse_args(argv)
    summaries = []
    for item in opts.analyses:
        label, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"error: {item!r}: expected LABEL=analysis.md, an existing file")
        summaries.append(summarise(label, Path(path).read_text(encoding="utf-8")))
    print(markdown(summaries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
