"""The report's seeds: each row's paired bootstrap against the base row on the seeds the two
share (the p column and the note's words on it), and each run's own p against the base row's
run of its seed, with its numbers before they are pooled (runs.csv). Torch-free."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from heads_lab.commands.report_rows import Comparison, Row, Run, as_written, train_pairs
from heads_lab.output.tracking import short_key

NO_SHARED_SEED = "no seed of the base row"  # a row's p_reason: no p (significance)
NO_TEXTS = "no {split} translations (hyps.{split}.txt, refs.{split}.txt) in {whose} run dir"
SECOND_RUN = "another run of its seed in its row is the one paired"  # a run's: seed_p_values


def significance(rows: list[Row], base: Row, split: str, samples: int) -> list | None:
    """Paired bootstrap (sacrebleu) of each row's BLEU against the base row, on the hypotheses
    of the seeds the row shares with the base row, concatenated in seed order: a row with other
    or fewer seeds than the others is still tested, on the seeds it shares with the base row
    (its p cell names them), and the others keep all of theirs. (sacrebleu seeds each system's
    resampling alike, so a row's p does not depend on which other rows are tested beside it.)
    A row is paired with the base only on the very same references (its refs files' lines, seed
    by seed, equal to the base's): a row on another test set has no p (p_reason "other test
    set"), whatever its line count. A row whose hypotheses are the base's has none either ("same
    hypotheses"), and a row whose BLEU equals the base's gets p = 1 ("equal BLEU"): sacrebleu's
    bootstrap compares resampled differences with `>`, so a difference of exactly zero
    everywhere reads p = 1/(n + 1), "significant". A row sharing no seed with the base has no p
    (NO_SHARED_SEED). Returns the comparison's seeds, the most any row was paired on (None: no
    test)."""
    base_seeds = {r.config.get("seed") for r in base.runs}
    by_seeds: dict[tuple, list[Row]] = {}
    for row in rows:
        if row is base:
            continue
        shared = tuple(sorted(base_seeds & {r.config.get("seed") for r in row.runs}))
        if shared:
            by_seeds.setdefault(shared, []).append(row)
        else:
            row.p_reason = NO_SHARED_SEED
    if not by_seeds:
        return None
    most = max(by_seeds, key=lambda seeds: (len(seeds), len(by_seeds[seeds])))
    for seeds, members in by_seeds.items():
        _paired_test(members, base, list(seeds), split, samples)
        for row in members if seeds != most else []:
            row.p_seeds = list(seeds)
    return list(most)


def _paired_test(rows: list[Row], base: Row, seeds: list, split: str, samples: int) -> None:
    """significance for rows that share these seeds with the base row."""

    def texts(row: Row, kind: str) -> list[str] | None:
        """None where a run dir lacks them (e.g. only its results.json was copied back)."""
        by_seed = {r.config.get("seed"): r for r in row.runs}
        try:
            return [line for s in seeds for line in lines(by_seed[s], kind, split)]
        except OSError:
            return None

    refs, base_hyps = texts(base, "refs"), texts(base, "hyps")
    if refs is None or base_hyps is None:
        for row in rows:
            row.p_reason = NO_TEXTS.format(split=split, whose="the base row's")
        return
    paired = []
    for row in rows:
        hyps, row_refs = texts(row, "hyps"), texts(row, "refs")
        if hyps is None or row_refs is None:
            row.p_reason = NO_TEXTS.format(split=split, whose="its")
            continue
        row.p_reason = unpaired(row_refs, hyps, refs, base_hyps)
        if row.p_reason is None:
            paired.append((row, hyps))
    for (row, _), p in zip(paired, bootstrap(base_hyps, refs, [h for _, h in paired], samples)):
        if p is None:
            row.p_value, row.p_reason = 1.0, "equal BLEU"
        else:
            row.p_value = p


def lines(run: Run, kind: str, split: str) -> list[str]:
    """A run's hypotheses or references (kind "hyps" / "refs") of the split, line by line."""
    return (run.dir / f"{kind}.{split}.txt").read_text(encoding="utf-8").splitlines()


def unpaired(refs: list[str], hyps: list[str], base_refs: list[str],
             base_hyps: list[str]) -> str | None:
    """Why a system cannot be paired with the base (significance), or None where it can."""
    if refs != base_refs:
        return "other test set"
    if hyps == base_hyps:
        return "same hypotheses"
    return None


def bootstrap(base_hyps: list[str], refs: list[str], systems: list[list[str]],
              samples: int) -> list[float | None]:
    """sacrebleu's paired bootstrap of each system's BLEU against the base's, on these
    references: a p each, None where the BLEU equals the base's exactly (sacrebleu's `>` would
    read a zero difference as p = 1/(n + 1); callers write p = 1, "equal BLEU")."""
    if not systems:
        return []
    test = PairedTest([("base", base_hyps)] + [(f"system {i}", h) for i, h in enumerate(systems)],
                      {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=samples)
    _, scores = test()
    base_bleu = scores["BLEU"][0].score
    return [None if r.score == base_bleu else r.p_value for r in scores["BLEU"][1:]]


def seed_p_values(c: Comparison, split: str, samples: int) -> dict[Path, str]:
    """Each run's own p: sacrebleu's paired bootstrap of its BLEU against the base row's run of
    the same seed, on that seed's test set alone (runs.csv: the per-seed numbers behind a row's
    pooled p). {run dir: "0.0220"}, or why there is none: "base" for the base row's runs,
    NO_SHARED_SEED where the base row has no run of that seed, and the reasons significance
    gives (other test set, same hypotheses, "1.0000 (equal BLEU)")."""
    out: dict[Path, str] = {}
    if c.base is None:
        return out
    base_by_seed = {r.config.get("seed"): r for r in c.base.runs}
    for run in c.base.runs:
        out[run.dir] = "base"
    for seed, base_run in base_by_seed.items():
        mine = [{r.config.get("seed"): r for r in row.runs}.get(seed) for row in c.rows
                if row is not c.base]  # as significance: a row's last run of the seed
        mine = [run for run in mine if run is not None]
        if not mine:  # nothing to pair: the base's files are not read (a lone run has none)
            continue
        singles = [Row((), "", [run]) for run in mine]  # each run a row of its own
        _paired_test(singles, Row((), "", [base_run]), [seed], split, samples)
        for one in singles:
            out[one.runs[0].dir] = p_text(one)
    for row in c.rows:
        for run in row.runs:
            out.setdefault(run.dir, f"– ({NO_SHARED_SEED})" if run.config.get("seed")
                           not in base_by_seed else f"– ({SECOND_RUN})")
    return out


def p_text(row: Row) -> str:
    """The p column: the p-value, '-' where untested (the base row), or why there is none; and
    its seeds where they are not the other rows'."""
    seeds = (f"seed{'s' if len(row.p_seeds) > 1 else ''} {', '.join(map(str, row.p_seeds))}"
             if row.p_seeds else None)
    why = "; ".join(x for x in (row.p_reason, seeds) if x)
    if row.p_value is None:
        return f"– ({why})" if why else "-"
    return f"{row.p_value:.4f}" + (f" ({why})" if why else "")


def p_note(tested: list[Comparison], varying: list[str], x: str | None) -> str:
    """The note's words on p: against which base row, on which seeds (where rows have different
    seeds, a row's p uses those it shares with the base row, and names them where they are
    not the comparison's)."""
    done = [c for c in tested if c.seeds]

    def seeds(c: Comparison) -> str:
        plural = "s" if len(c.seeds) > 1 else ""
        unused = any({r.config.get("seed") for r in row.runs} - set(c.seeds)
                     for row in c.rows if not row.p_seeds and row.p_reason != NO_SHARED_SEED)
        return (f"seed{plural} {', '.join(map(str, c.seeds))}"
                + (f", the seed{plural} shared with the base row" if unused else "")
                + (" (concatenated)" if plural else ""))

    own = ("; a p cell that names seeds is on those alone (all its row shares with the base row)"
           if any(row.p_seeds for c in done for row in c.rows) else "")

    if x is None:
        return ("p: sacrebleu paired bootstrap of BLEU vs the base row (seed-matched hypotheses, "
                "on the base row's references only)" + (f", on {seeds(done[0])}" if done else "")
                + own)
    name = short_key(x)
    base = next(c.base for c in tested if c.base is not None)
    like = ",".join(f"{short_key(k)}={as_written(base.runs[0].config.get(k))}"
                    for k in varying if k != x)
    text = (f"p: sacrebleu paired bootstrap of BLEU vs the base row of the same {name} ({like} "
            f"at each {name}; seed-matched hypotheses, on the base row's references only)")
    if not done:
        return text
    if len({seeds(c) for c in done}) == 1:  # the same seeds at every x: named once
        return text + f", on {seeds(done[0])}" + own
    return text + ", on " + "; ".join(f"{name}={c.x_value}: {seeds(c)}" for c in done) + own


RUN_COLUMNS = ("setting", "seed", "run", "valid PPL", "{split} BLEU", "{split} chrF",
               "p vs base (its seed)", "best step", "steps", "stopped by", "train s", "tok/s",
               "peak MB", "train pairs", "precision", "device", "cpu", "commit")


def runs_table(rows: list[Row], split: str, seed_p: dict[Path, str]) -> dict[str, Any]:
    """runs.csv: one line per run of the table, row by row, seed by seed. The report's numbers
    before they are pooled (to four decimals: a mean recomputed from them is off by < 0.0001),
    each run's own p against the base row's run of its seed (seed_p_values; where its
    comparison has no base row, the row's reason), how its training ended and what it ran on,
    so a published study keeps its per-seed numbers once its run dirs are gone."""
    header = [c.format(split=split) for c in RUN_COLUMNS]
    home = Path.home().resolve()
    body = []
    for row in rows:
        for run in sorted(row.runs, key=lambda r: _order_seed(r.config.get("seed"))):
            m, train = run.metrics, run.results.get("train", {})
            env = run.results.get("env") or {}
            seed = run.config.get("seed")
            body.append([
                row.label, "" if seed is None else str(seed), _where(run.dir, home),
                _number(m.get("valid/ppl"), 4), _number(m.get(f"{split}/bleu"), 4),
                _number(m.get(f"{split}/chrf"), 4),
                seed_p.get(run.dir) or (f"– ({row.p_reason})" if row.p_reason else ""),
                _number(train.get("best_step"), 0), _number(train.get("steps"), 0),
                str(train.get("stopped_by") or ""),
                _number(train.get("seconds"), 0), _number(m.get("train/tokens_per_s"), 0),
                _number(m.get("cost/peak_mem_mb"), 0), _number(train_pairs(run), 0),
                str(run.config.get("trainer.precision") or ""), str(run.results.get("device") or ""),
                str(env.get("cpu") or ""), str((env.get("git") or {}).get("commit") or "")[:12]])
    return {"header": header, "rows": body, "note": ""}


def _where(run_dir: Path, home: Path) -> str:
    """The run's dir, absolute, with ~ for the home dir it is under (the machine's user is no
    part of a published table)."""
    path = run_dir.resolve()
    if path != home and path.is_relative_to(home):
        return f"~/{path.relative_to(home)}"
    return str(path)


def _order_seed(seed: Any) -> tuple:
    return (0, seed, "") if isinstance(seed, (int, float)) else (1, 0, str(seed))


def _number(value: Any, digits: int) -> str:
    """A number for runs.csv: plain (no thousands separators: a CSV for programs), or empty."""
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return ""
    return f"{value:.{digits}f}"
