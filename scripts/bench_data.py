"""Preprocessing benchmark: throughput, cold vs cached load, and peak memory.

    python scripts/bench_data.py                       # Multi30k (needs HEADS_LAB_DATA) + 2 M pairs
    python scripts/bench_data.py --pairs 200000 2000000 --skip-multi30k

Each phase runs in its own process, so its peak resident memory (VmHWM) is its own:
  build    read + clean + train the tokenizer + encode into a fresh cache
  load     the same corpus from the cache
  train    load the cached corpus and run a few training steps (memory grows with the model,
           not the corpus)
The streamed corpus is the embedded synthetic language pair written to gzipped text files, at
several sizes, to show that memory stays flat as the corpus grows. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def peak_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(phase: str, data_args: str, cache: str) -> None:
    """One measured phase; prints a JSON line."""
    import torch

    from heads_lab.config.compose import compose, to_object
    from heads_lab.data import prepare

    run = to_object(compose(json.loads(data_args)))
    started = time.perf_counter()
    corpus = prepare(run.data, Path(cache))
    seconds = time.perf_counter() - started
    result = {"phase": phase, "seconds": seconds, "pairs": corpus.stats["train"]["read"],
              "kept": corpus.stats["train"]["kept"]}
    if phase == "train":
        from heads_lab.model import Transformer
        from heads_lab.training.loop import train

        run.trainer.max_steps, run.trainer.valid_every = 20, 10_000
        model = Transformer(run.model, len(corpus.tokenizer))
        started = time.perf_counter()
        train(model, corpus.splits["train"], corpus.splits["valid"], run.trainer, 1,
              torch.device("cpu"))
        result["train_seconds"] = time.perf_counter() - started
    result["peak_mb"] = peak_mb()
    print(json.dumps(result))


def measure(phase: str, overrides: list[str], cache: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", phase, json.dumps(overrides),
                          str(cache)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_synthetic(root: Path, pairs: int) -> None:
    """The synthetic language pair as gzipped text files (train: `pairs` lines)."""
    from heads_lab.config.schemas import SyntheticDataConfig
    from heads_lab.data.synthetic import Grammar

    root.mkdir(parents=True, exist_ok=True)
    grammar = Grammar(SyntheticDataConfig())
    import random

    for split, n in (("train", pairs), ("valid", 500), ("test", 500)):
        rng = random.Random(f"bench/{split}")
        with gzip.open(root / f"{split}.src.gz", "wt", encoding="utf-8", compresslevel=1) as s, \
                gzip.open(root / f"{split}.tgt.gz", "wt", encoding="utf-8", compresslevel=1) as t:
            for _ in range(n):
                pair = grammar.sentence(rng)
                s.write(pair.src_text + "\n")
                t.write(pair.tgt_text + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=int, nargs="+", default=[200_000, 2_000_000])
    parser.add_argument("--skip-multi30k", action="store_true")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    from rich.console import Console
    from rich.table import Table

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpora = []
        if not args.skip_multi30k:
            corpora.append(("multi30k de-en", ["data=multi30k", "model=base"]))
        for n in args.pairs:
            root = tmp / f"synthetic-{n}"
            started = time.perf_counter()
            write_synthetic(root, n)
            print(f"wrote {n:,} synthetic pairs in {time.perf_counter() - started:.0f}s", flush=True)
            corpora.append((f"synthetic {n:,}", ["data=local", f"data.root={root}", "data.src=src",
                                                 "data.tgt=tgt", "model=base"]))
        for name, overrides in corpora:
            cache = tmp / f"cache-{len(rows)}"
            for phase in ("build", "load", "train"):
                r = measure(phase, overrides, cache)
                rows.append({"corpus": name, **r})
                print(name, r, flush=True)
    table = Table(title=f"preprocessing, {os.cpu_count()} cores", title_justify="left")
    for col in ("corpus", "phase", "pairs read", "seconds", "pairs/s", "peak MB", "20 train steps"):
        table.add_column(col, justify="left" if col in ("corpus", "phase") else "right")
    for r in rows:
        table.add_row(r["corpus"], r["phase"], f"{r['pairs']:,}", f"{r['seconds']:.1f}",
                      f"{r['pairs'] / r['seconds']:,.0f}" if r["phase"] == "build" else "",
                      f"{r['peak_mb']:,.0f}",
                      f"{r['train_seconds']:.1f}s" if "train_seconds" in r else "")
    Console().print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
