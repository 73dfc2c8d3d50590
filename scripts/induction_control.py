"""The trained induction-head control (docs/analysis.md): a two-layer attention-only language
model trained on random repeats grows induction heads, `heads-lab analyze` finds them, a
one-layer model has none, and masking them stops the in-context copying.

    python scripts/induction_control.py --out outputs/induction_control   # ~10 min on 1 core

The setting that grows them: no absolute positions (model.positions=none) and relative-position
biases clipped at ±2 (model.relative_positions=2, their own learning rate 0.05), so that the only
way to copy a token from far back is by content: a previous-token head in layer 0 (its bias at
offset −1) and heads in layer 1 whose keys read its output. With sinusoidal positions the same
model copies as well, through a duplicate-token head and positional hops, and no head scores on
the induction pattern. Training: data=repeats (vocabulary 64, a random prefix of 0-16 tokens,
then 8-24 distinct tokens twice), d_model 64, 4 heads, AdamW at 3e-3 with a cosine over 8,000
steps of 4,096 tokens; the loss sits near ln 60 until the copying appears at once (about step
3,300 with seed 1). Prints each model's induction and previous-token scores and its copy
accuracy with and without its induction heads (those of layer 1 scoring > 0.5) masked, and
writes them to <out>/control.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

EXE = str(Path(sys.executable).with_name("heads-lab"))
SETTING = ["task=lm", "data=repeats", "model=tiny", "model.d_ff=0", "model.heads=4",
           "model.d_model=64", "model.positions=none", "model.relative_positions=2",
           "model.dropout=0", "trainer.max_tokens=4096", "trainer.lr=3e-3",
           "trainer.warmup_steps=200", "trainer.valid_every=500", "logger=none",
           "trainer.threads=1"]
ANALYSE = ["analysis.split=valid", "analysis.max_sentences=50", "analysis.role_length=16",
           "analysis.lrp=false"]


def _run(*args: str, cwd: Path) -> None:
    proc = subprocess.run([EXE, *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"heads-lab {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def _copy(run: Path, cwd: Path, *extra: str) -> float:
    _run("eval", str(run), *extra, cwd=cwd)
    found = sorted((run / "evals").glob("*/eval.json"))[-1]
    return json.loads(found.read_text())["metrics"]["test/copy_accuracy"]


def measure(out: Path, seed: int = 1) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    result = {}
    for layers, steps in ((2, 8000), (1, 3000)):
        run = out / f"layers{layers}_seed{seed}"
        if not (run / "results.json").is_file():
            _run("train", *SETTING, f"model.layers={layers}", f"trainer.max_steps={steps}",
                 f"seed={seed}", f"hydra.run.dir={run}", cwd=out)
        for old in (run / "analysis").glob("*"):
            subprocess.run(["rm", "-rf", str(old)], check=True)
        _run("analyze", str(run), *ANALYSE, cwd=out)
        (found,) = (run / "analysis").glob("*/analysis.json")
        heads = json.loads(found.read_text())["heads"]
        induction = [f"lm:{h['layer']}:{h['head']}" for h in heads
                     if h["layer"] == layers - 1 and h["induction"] > 0.5 and layers > 1]
        result[f"{layers} layers"] = {
            "induction": {f"L{h['layer']}H{h['head']}": round(h["induction"], 3) for h in heads},
            "previous_token": {f"L{h['layer']}H{h['head']}": round(h["previous_token"], 3)
                               for h in heads},
            "copy_accuracy": _copy(run, out),
            "induction_heads": induction,
            "copy_accuracy_masked": (_copy(run, out, "eval.head_mask=" + "+".join(induction))
                                     if induction else None)}
    (out / "control.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/induction_control"))
    parser.add_argument("--seed", type=int, default=1)
    opts = parser.parse_args(argv)
    result = measure(opts.out, opts.seed)
    for name, r in result.items():
        print(f"{name}: copy accuracy {r['copy_accuracy']:.3f}"
              + (f", {r['copy_accuracy_masked']:.3f} with {'+'.join(r['induction_heads'])} "
                 "masked" if r["induction_heads"] else ", no induction head")
              + f"; induction {r['induction']}; previous-token {r['previous_token']}")
    print(f"control: {opts.out / 'control.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
