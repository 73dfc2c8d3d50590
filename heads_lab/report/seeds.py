"""The report's seeds: each row's p against the base row — Welch's t over seeds with the test
set's variance where both have two or more seeds (heads_lab/report/significance.py), else
sacrebleu's paired bootstrap on the seed they share — with the note's words on it, and each
run's own p against the base row's run of its seed, with its numbers before they are pooled
(runs.csv). Torch-free."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from heads_lab.output.tracking import short_key
from heads_lab.report import runs_csv
from heads_lab.report import significance as sig
from heads_lab.report.labels import as_written
from heads_lab.report.rows import Comparison, Row, Run, train_pairs

NO_SHARED_SEED = "no seed of the base row"  # a row's p_reason: no p (significance)
NO_TEXTS = "no {split} translations (hyps.{split}.txt, refs.{split}.txt) in {whose} run dir"
SECOND_RUN = "another run of its seed in its row is the one paired"  # a run's: seed_p_values
ONE_SEED = "one seed"  # a row's p_test: sacrebleu's paired bootstrap on the seed(s) it shares


def significance(rows: list[Row], base: Row, split: str, samples: int) -> list | None:
    """Each row's p against the base row. Where the row and the base each have two or more
    seeds: Welch's t-test of their mean BLEU over seeds, with the test set's sampling variance
    from `samples` paired draws of the test sentences where every run's translations are at
    hand ("seeds and sentences"), over the seeds alone where not ("seeds only"; the row's
    p_test says which). Else (one seed on a side: its seed spread unknown) sacrebleu's paired
    bootstrap on the hypotheses of the seeds the row shares with the base, concatenated in
    seed order (p_test ONE_SEED; a row sharing none has no p: NO_SHARED_SEED). A row is paired
    with the base only on the very same references: a row on another test set has no p ("other
    test set"), and a row whose hypotheses are the base's has none either ("same hypotheses").
    Returns the seeds the bootstrap paired most rows on (None: no bootstrap)."""
    base_runs = one_per_seed(base)
    draws: dict[Path, np.ndarray | None] = {}  # each run's BLEU on the shared sentence draws
    single = []
    for row in rows:
        if row is base:
            continue
        mine = one_per_seed(row)
        if len(mine) >= 2 and len(base_runs) >= 2:
            _seed_test(row, mine, base_runs, split, samples, draws)
        else:
            single.append(row)
    return _bootstrap_rows(single, base, split, samples)


def one_per_seed(row: Row) -> list[Run]:
    """A row's runs, one per seed (a seed run twice: its last run), in seed order."""
    by_seed = {r.config.get("seed"): r for r in row.runs}
    return [by_seed[s] for s in sorted(by_seed, key=_order_seed)]


def _seed_test(row: Row, mine: list[Run], base: list[Run], split: str, samples: int,
               draws: dict[Path, np.ndarray | None]) -> None:
    """significance for a row and a base with two or more seeds each."""
    key = f"{split}/bleu"
    if any(not isinstance(r.metrics.get(key), (int, float)) for r in (*mine, *base)):
        row.p_reason = f"a run without {key}"
        return
    if {_test_set(r) for r in mine} != {_test_set(r) for r in base}:  # as recorded
        row.p_reason = "other test set"
        return
    texts = {r.dir: _texts(r, split) for r in (*mine, *base)}
    complete = all(t is not None for t in texts.values())  # else: over the seeds alone
    if complete:
        if {tuple(texts[r.dir][1]) for r in mine} != {tuple(texts[r.dir][1]) for r in base}:
            row.p_reason = "other test set"
            return
        if [texts[r.dir][0] for r in mine] == [texts[r.dir][0] for r in base]:
            row.p_reason = "same hypotheses"
            return
    test_refs = {tuple(t[1]) for t in texts.values() if t is not None}
    on_sentences = complete and len(test_refs) == 1
    if on_sentences:
        counts = sig.sentence_draws(len(next(iter(test_refs))), samples)
        for r in (*mine, *base):
            if r.dir not in draws:
                hyps, refs = texts[r.dir]
                draws[r.dir] = sig.resampled(sig.bleu_statistics(hyps, [refs], _tokenize(r)),
                                             counts, sig.bleu_rows)
    result = sig.seed_test([r.metrics[key] for r in mine], [r.metrics[key] for r in base],
                           [draws[r.dir] for r in mine] if on_sentences else None,
                           [draws[r.dir] for r in base] if on_sentences else None)
    if result.se == 0.0 and result.diff != 0.0:  # every run of each row scores alike
        row.p_reason = "no spread between seeds to weigh the difference by"
        return
    row.p_value, row.p_test = result.p, result.test


def _test_set(run: Run) -> tuple:
    """What a run was tested on, as its config says (within one data set's table: where the
    translations are gone, the only check that two rows were scored on the same sentences)."""
    return run.config.get("eval.sacrebleu_test"), run.config.get("eval.split")


def _texts(run: Run, split: str) -> tuple[list[str], list[str]] | None:
    """A run's hypotheses and references of the split, or None where its dir lacks them."""
    try:
        return lines(run, "hyps", split), lines(run, "refs", split)
    except OSError:
        return None


def _tokenize(run: Run) -> str | None:
    """The BLEU tokenizer the run was scored with (eval.bleu_tokenize; None: sacrebleu's)."""
    return run.config.get("eval.bleu_tokenize") or None


def _bootstrap_rows(rows: list[Row], base: Row, split: str, samples: int) -> list | None:
    """significance's bootstrap on the seed(s) each row shares with the base row, named in its
    p cell."""
    base_seeds = {r.config.get("seed") for r in base.runs}
    by_seeds: dict[tuple, list[Row]] = {}
    for row in rows:
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
        for row in members:
            row.p_test, row.p_seeds = ONE_SEED, list(seeds)
    return list(most)


def _paired_test(rows: list[Row], base: Row, seeds: list, split: str, samples: int) -> None:
    """The paired bootstrap for rows that share these seeds with the base row."""

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
            recorded = run.results.get("seed_p")  # a run read from a runs.csv: its own p there
            if recorded and out[run.dir].startswith(f"– (no {split} translations"):
                out[run.dir] = recorded
    return out


def p_text(row: Row) -> str:
    """The p column: the p-value ('< 0.001' below that), '-' where untested (the base row), or
    why there is none; marked where its test is not the table's main one: '(seeds only)' where
    the test set's variance could not be resampled, '(seed 1, sentences only)' where a side has
    one seed (sacrebleu's paired bootstrap of the seed it shares with the base row)."""
    marks = [row.p_reason] if row.p_reason else []
    if row.p_test == sig.SEEDS_ONLY:
        marks.append(sig.SEEDS_ONLY)
    if row.p_seeds and row.p_value is not None:
        marks.append(f"seed{'s' if len(row.p_seeds) > 1 else ''} "
                     f"{', '.join(map(str, row.p_seeds))}, sentences only")
    why = "; ".join(marks)
    if row.p_value is None:
        return f"– ({why})" if why else "-"
    return sig.p_text(row.p_value) + (f" ({why})" if why else "")


def p_note(tested: list[Comparison], varying: list[str], x: str | None) -> str:
    """The note's words on p: which test, against which base row (with report.x, the base at
    the row's own x), and what a marked cell means."""
    rows = [row for c in tested for row in c.rows if row.p_value is not None]
    kinds = {row.p_test for row in rows}
    against = "vs the base row"
    if x is not None:
        name = short_key(x)
        base = next(c.base for c in tested if c.base is not None)
        like = ",".join(f"{short_key(k)}={as_written(base.runs[0].config.get(k))}"
                        for k in varying if k != x)
        against = f"vs the base row of the same {name} ({like} at each {name})"
    parts = []
    if kinds & {sig.SEEDS_AND_SENTENCES, sig.SEEDS_ONLY}:
        parts.append(f"p: Welch's t-test of mean BLEU over seeds {against}, its variance the "
                     "seeds' spread plus the test set's (a paired bootstrap of the test "
                     "sentences); seed-aware, docs/significance.md")
        if sig.SEEDS_ONLY in kinds:
            parts.append("(seeds only): the translations are not at hand, so the test set's "
                         "variance is left out")
    if ONE_SEED in kinds:
        lead = "a p marked 'sentences only'" if parts else "p"
        parts.append(f"{lead}: sacrebleu paired bootstrap of BLEU {against} on the seed it "
                     "shares with the base row (seed-matched hypotheses, on the base row's "
                     "references only), where a side has one seed: the seed spread is unknown, "
                     "so it tests the sentences alone")
    if not parts:
        return f"p: {against}, where both have two or more seeds (Welch's t over seeds)"
    return "; ".join(parts)


RUN_COLUMNS = ("setting", "seed", "run", "valid PPL", "{split} BLEU", "{split} chrF",
               "p vs base (its seed)", "best step", "steps", "stopped by", "train s", "tok/s",
               "peak MB", "train pairs", "params", "precision", "device", "cpu", "commit")
MULTIREF_COLUMNS = ("multiref {split} BLEU", "multiref {split} chrF")  # where a run has them


def runs_table(rows: list[Row], split: str, seed_p: dict[Path, str]) -> dict[str, Any]:
    """runs.csv: one line per run of the table, row by row, seed by seed. The report's numbers
    before they are pooled (to four decimals: a mean recomputed from them is off by < 0.0001),
    each run's own p against the base row's run of its seed (seed_p_values; where its
    comparison has no base row, the row's reason), how its training ended and what it ran on,
    its multi-reference scores where it has them, and last its command-line overrides and its
    whole flattened config as JSON, so a published study keeps its per-seed numbers once its run
    dirs are gone and `heads-lab report` can read it back (heads_lab/report/runs_csv.py)."""
    multiref = any(f"{split}/bleu_multiref" in r.metrics for row in rows for r in row.runs)
    columns = RUN_COLUMNS + (MULTIREF_COLUMNS if multiref else ())
    header = [c.format(split=split) for c in columns] + [runs_csv.OVERRIDES, runs_csv.CONFIG]
    home = Path.home().resolve()
    body = []
    for row in rows:
        for run in sorted(row.runs, key=lambda r: _order_seed(r.config.get("seed"))):
            m, train = run.metrics, run.results.get("train", {})
            env = run.results.get("env") or {}
            seed = run.config.get("seed")
            line = [
                row.label, "" if seed is None else str(seed),
                run.results.get("run_text") or _where(run.dir, home),
                _number(m.get("valid/ppl"), 4), _number(m.get(f"{split}/bleu"), 4),
                _number(m.get(f"{split}/chrf"), 4),
                seed_p.get(run.dir) or (f"– ({row.p_reason})" if row.p_reason else ""),
                _number(train.get("best_step"), 0), _number(train.get("steps"), 0),
                str(train.get("stopped_by") or ""),
                _number(train.get("seconds"), 0), _number(m.get("train/tokens_per_s"), 0),
                _number(m.get("cost/peak_mem_mb"), 0), _number(train_pairs(run), 0),
                _number(m.get("cost/params"), 0),
                str(run.config.get("trainer.precision") or ""), str(run.results.get("device") or ""),
                str(env.get("cpu") or ""), str((env.get("git") or {}).get("commit") or "")[:12]]
            if multiref:
                line += [_number(m.get(f"{split}/bleu_multiref"), 4),
                         _number(m.get(f"{split}/chrf_multiref"), 4)]
            line += [json.dumps(run.results.get("overrides") or [], ensure_ascii=False),
                     json.dumps(run.config, sort_keys=True, ensure_ascii=False, default=str)]
            body.append(line)
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
