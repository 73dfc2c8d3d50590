"""Training tokens/s of talking heads relative to multi-head attention, side by side in one run.

    python scripts/bench_heads.py                 # h = 8 and 32, d_model 256, 3+3 layers
    python scripts/bench_heads.py --heads 4 16 --steps 20

Prints a table (and --json writes the numbers). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json

import torch
from rich.console import Console
from rich.table import Table

from heads_lab.bench import Variant, Workload, train_throughput
from heads_lab.config import AttentionKind, ModelConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()
    base = dict(d_model=256, d_ff=1024, encoder_layers=3, decoder_layers=3, dropout=0.1)
    variants = []
    for h in args.heads:
        variants.append(Variant(f"mha h={h}", ModelConfig(heads=h, **base)))
        variants.append(Variant(f"talking_heads h={h}",
                                ModelConfig(heads=h, attention=AttentionKind.talking_heads, **base)))
    results = train_throughput(variants, Workload(), steps=args.steps, warmup=args.warmup)
    by_name = {r["name"]: r for r in results}
    table = Table(title=f"training throughput, fp32, {torch.get_num_threads()} threads, "
                  "64 pairs × 20 tokens, vocab 8000", title_justify="left")
    for col in ("variant", "tokens/s", "vs mha", "MFLOP/token", "GFLOP/s"):
        table.add_column(col, justify="right" if col != "variant" else "left")
    for r in results:
        mha = by_name[r["name"].replace("talking_heads", "mha")]
        table.add_row(r["name"], f"{r['tokens_per_s']:,.0f}",
                      f"{r['tokens_per_s'] / mha['tokens_per_s']:.2f}×",
                      f"{r['flops_per_token'] / 1e6:.1f}", f"{r['gflops_per_s']:.1f}")
    Console().print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
