"""The guard numbers: what a refactor must leave bit for bit as it was, measured through the
commands a user runs.

    python scripts/guard_numbers.py --out /tmp/guard.json           # measure
    python scripts/guard_numbers.py --out /tmp/after.json --check tests/guard_numbers.json

Eight measurements, each on the CPU, in fp32, on one thread, in a fresh temporary dir (the
tokenizer cache too), on heads-lab's embedded synthetic pair (no data files needed):

- demo: `heads-lab train` as `make demo` runs it (the defaults): test BLEU, chrF and PPL;
- train: a tiny 2+2-layer model for 200 steps (`heads-lab train`): every number of results.json's
  metrics and its per-validation losses;
- analyze: `heads-lab analyze` of that run's checkpoint on 40 sentences: every grid (confidence,
  positional and rare-word shares, importance, LRP, ...), the head distances and each head's role;
- prune: `heads-lab prune ... method=importance` of that run: each curve's points (BLEU, chrF,
  PPL, parameters, heads kept and which were removed; not the times);
- prune hf: the same on the tiny random-weight Marian translator and BERT encoder that
  scripts/hf_tiny_models.py builds (with the `hf` extra): masked-LM accuracy, BLEU, PPL;
- analyze hf: `heads-lab analyze` of the tiny BERT and of the tiny GPT-2 (a causal LM: its
  lm-self grids, the LM roles and sink included): their grids;
- prune hf lm: the tiny Llama (grouped-query): its query-head and key/value-group curves
  (bits per byte, PPL).

With --check FILE the numbers are compared with FILE's: equal bit for bit where FILE was written on
a CPU of the same kind (torch's CPU capability: AVX512, AVX2, ...), else within a relative 1e-4
(another kind's kernels sum in another order, which moves the last digits), and the first
difference is printed; exit 1 if any differs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).with_name("heads-lab"))
# tests/conftest.py's tiny run, 2+2 layers, fp32 on one CPU thread
TRAIN = ["model=tiny", "model.encoder_layers=2", "model.decoder_layers=2", "data.train_size=600",
         "data.valid_size=40", "data.test_size=40", "data.vocab_size=300", "data.nouns=60",
         "data.verbs=20", "data.adjectives=20", "data.adverbs=10", "trainer.max_steps=200",
         "trainer.max_tokens=1024", "trainer.valid_every=50", "trainer.log_every=10",
         "trainer.warmup_steps=2", "eval.beam=2", "logger=none", "trainer.device=cpu",
         "trainer.precision=fp32", "trainer.threads=1", "seed=7"]
DATA = ["data=synthetic", "data.train_size=600", "data.valid_size=40", "data.test_size=40",
        "data.vocab_size=300", "data.nouns=60", "data.verbs=20", "data.adjectives=20",
        "data.adverbs=10"]
RTOL = 1e-4
TIMES = ("decode_s", "forward_tok_s", "seconds", "per_s", "train_s", "elapsed", "peak_mem")


def _run(*args: str, cwd: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HEADS_LAB_CACHE": str(cwd / "cache"),
           "WANDB_MODE": "offline"}
    proc = subprocess.run([EXE, *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"heads-lab {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def _only(pattern: str, root: Path) -> Path:
    found = sorted(root.glob(pattern))
    if len(found) != 1:
        raise SystemExit(f"expected one {pattern} under {root}, found {len(found)}")
    return found[0]


def _untimed(value: Any) -> Any:
    """`value` without timings (they differ every run)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if not any(t in k for t in TIMES)}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _analysis(path: Path) -> dict[str, Any]:
    result = json.loads(path.read_text())
    return {"grids": result["grids"], "distances": result.get("distances"),
            "functions": [h.get("function") for h in result["heads"]],
            "sentences": result["sentences"]}


def _curves(path: Path) -> dict[str, Any]:
    return _untimed(json.loads(path.read_text())["curves"])


def measure(work: Path, hf: bool = True, demo: bool = True) -> dict[str, Any]:
    """Every guard number, measured in `work`."""
    import torch

    out: dict[str, Any] = {"cpu": torch.backends.cpu.get_cpu_capability(),
                           "torch": torch.__version__}
    if demo:
        _run("train", "logger=none", "trainer.device=cpu", "trainer.precision=fp32",
             "trainer.threads=1", "hydra.run.dir=demo", cwd=work)
        metrics = json.loads((work / "demo" / "results.json").read_text())["metrics"]
        out["demo"] = {k: metrics[k] for k in ("test/bleu", "test/chrf", "test/ppl")}
    _run("train", *TRAIN, "hydra.run.dir=run", cwd=work)
    run = work / "run"
    results = json.loads((run / "results.json").read_text())
    out["train"] = {"metrics": _untimed(results["metrics"]),
                    "valid": results["train"]["valid_history"], "tokens": results["train"]["tokens"]}
    _run("analyze", str(run), "analysis.max_sentences=40", cwd=work)
    out["analyze"] = _analysis(_only("analysis/*/analysis.json", run))
    _run("prune", str(run), "method=importance", "prune.eval_sentences=10", "prune.step=0.5",
         cwd=work)
    out["prune"] = _curves(_only("prune/*/prune.json", run))
    if hf:
        sys.path.insert(0, str(ROOT / "scripts"))
        from hf_tiny_models import build

        tiny = build(work / "hf", None)  # tokenizers on the synthetic pair: no data files
        for family, extra in (("marian", []), ("bert", ["data.src=src"])):
            _run("prune", f"hf:{tiny[family]}", *DATA, *extra, "prune.eval_sentences=10",
                 "prune.step=0.5", "prune.sites=[enc-self]", "eval.beam=2",
                 "trainer.device=cpu", "trainer.threads=1", cwd=work)
            out[f"prune_hf_{family}"] = _curves(
                _only(f"outputs/hf/*{family}/prune/*/prune.json", work))
        _run("analyze", f"hf:{tiny['bert']}", *DATA, "data.src=src", "analysis.split=valid",
             "analysis.max_sentences=20", "trainer.device=cpu", "trainer.threads=1", cwd=work)
        out["analyze_hf_bert"] = _analysis(_only("outputs/hf/*bert/analysis/*/analysis.json",
                                                 work))
        _run("analyze", f"hf:{tiny['gpt2']}", *DATA, "analysis.split=valid",
             "analysis.max_sentences=20", "trainer.device=cpu", "trainer.threads=1", cwd=work)
        out["analyze_hf_gpt2"] = _analysis(_only("outputs/hf/*gpt2/analysis/*/analysis.json",
                                                 work))
        _run("prune", f"hf:{tiny['llama']}", *DATA, "prune.eval_sentences=10", "prune.step=0.5",
             "trainer.device=cpu", "trainer.threads=1", cwd=work)
        out["prune_hf_llama"] = _curves(_only("outputs/hf/*llama/prune/*/prune.json", work))
    return out


def differences(now: Any, pinned: Any, exact: bool, where: str = "") -> list[str]:
    """Where `now` and `pinned` differ: bit for bit if `exact`, else floats within RTOL."""
    if isinstance(pinned, dict) and isinstance(now, dict):
        if set(now) != set(pinned):
            return [f"{where or '.'}: keys {sorted(set(now) ^ set(pinned))} differ"]
        return [d for k in pinned for d in differences(now[k], pinned[k], exact, f"{where}.{k}")]
    if isinstance(pinned, list) and isinstance(now, list):
        if len(now) != len(pinned):
            return [f"{where}: {len(now)} items, pinned {len(pinned)}"]
        return [d for i, (a, b) in enumerate(zip(now, pinned, strict=True))
                for d in differences(a, b, exact, f"{where}[{i}]")]
    if (isinstance(pinned, float) and isinstance(now, float | int) and not exact
            and not isinstance(now, bool)):
        same = (math.isnan(pinned) and math.isnan(now)) or math.isclose(now, pinned,
                                                                       rel_tol=RTOL, abs_tol=1e-9)
        return [] if same else [f"{where}: {now!r}, pinned {pinned!r}"]
    return [] if now == pinned or (now != now and pinned != pinned) else [
        f"{where}: {now!r}, pinned {pinned!r}"]


def check(now: dict[str, Any], pinned: dict[str, Any]) -> list[str]:
    exact = now["cpu"] == pinned["cpu"]
    parts = [k for k in pinned if k not in ("cpu", "torch")]
    return [d for k in parts for d in differences(now.get(k), pinned[k], exact, k)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the numbers go (JSON)")
    parser.add_argument("--check", type=Path, help="pinned numbers to compare with")
    parser.add_argument("--no-hf", action="store_true", help="leave out the hf: models")
    parser.add_argument("--no-demo", action="store_true", help="leave out the demo (2-3 min)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="heads-lab-guard-") as tmp:
        now = measure(Path(tmp), hf=not args.no_hf, demo=not args.no_demo)
    args.out.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
    print(f"guard numbers: {args.out}")
    if args.check:
        pinned = json.loads(args.check.read_text())
        pinned = {k: v for k, v in pinned.items()
                  if not (args.no_hf and "_hf_" in k or args.no_demo and k == "demo")}
        found = check(now, pinned)
        how = "bit for bit" if now["cpu"] == pinned["cpu"] else f"within {RTOL:g} (another CPU)"
        if found:
            print(f"{len(found)} differ from {args.check} ({how}); the first: " + "; ".join(found[:5]))
            return 1
        print(f"the same as {args.check}, {how}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
