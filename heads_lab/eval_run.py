"""`heads-lab eval <run dir> [overrides]`: evaluate a finished or partial run again from its
checkpoints, e.g. with another beam, split or test set, or with the weights of the last N
checkpoints averaged (`eval.average_last=N`, as fairseq's average_checkpoints does). The run's
own overrides (from .hydra/overrides.yaml) rebuild its config; only evaluation settings may be
changed. Results go to <run dir>/evals/<time>_<overrides>/ and never replace earlier ones."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
import yaml

from heads_lab import checkpoint
from heads_lab.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)
USAGE = "heads-lab eval <run dir> [eval.KEY=VALUE ...] [data.root=DIR] [trainer.device=...]"
ALLOWED = ("eval.", "data.root=", "trainer.device=", "trainer.precision=", "trainer.threads=",
           "trainer.max_tokens=", "paths.")


def main(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(f"usage: {USAGE}\n\n{__doc__}")
        return 0 if args else 2
    run_dir, overrides = Path(args[0]), args[1:]
    bad = [o for o in overrides if not o.startswith(ALLOWED)]
    if bad:
        raise ConfigError(f"heads-lab eval changes evaluation settings only, not {bad[0]!r}; "
                          f"allowed: eval.*, data.root, trainer.device/precision/threads/max_tokens")
    cfg, run = compose_run(run_dir, overrides)
    files = checkpoint.step_files(run_dir)
    if not files:
        raise CheckpointError(NO_CHECKPOINTS.format(run_dir=run_dir))
    from heads_lab.config import to_dict

    return _evaluate(run, to_dict(cfg), run_dir, overrides, files)


NO_CHECKPOINTS = ("{run_dir} holds no checkpoints (checkpoints/step_*.pt); was it trained with "
                  "trainer.save_checkpoint=false?")


def compose_run(run_dir: Path, overrides: list[str]):
    """(composed config, validated run config) of a train run dir: its saved overrides
    (.hydra/overrides.yaml) followed by `overrides`."""
    from heads_lab.config import compose, to_object, validate

    if not run_dir.is_dir():
        raise CheckpointError(f"no run dir {run_dir}; give the dir of a heads-lab train run")
    saved = run_dir / ".hydra" / "overrides.yaml"
    if not saved.is_file():
        raise CheckpointError(f"{run_dir} is not a heads-lab run dir (no .hydra/overrides.yaml)")
    cfg = compose(list(yaml.safe_load(saved.read_text()) or []) + overrides)
    run = to_object(cfg)
    validate(run)
    return cfg, run


def _evaluate(run, config: dict, run_dir: Path, overrides: list[str], files) -> int:
    from heads_lab.config import cache_dir
    from heads_lab.data import prepare
    from heads_lab.model import Transformer
    from heads_lab.runner import evaluate_on_split
    from heads_lab.tracking import console, summary_table, write_json
    from heads_lab.train import check_precision, resolve_device

    started = time.perf_counter()
    if run.trainer.threads:
        torch.set_num_threads(run.trainer.threads)
    device = resolve_device(run.trainer.device)
    check_precision(device, run.trainer.precision)
    states, used = [], []
    for _, path in files:  # newest first; corrupt ones are skipped with a warning
        if len(states) == run.eval.average_last:
            break
        try:
            states.append(checkpoint.load(path)["model"])
            used.append(path.name)
        except CheckpointError as err:
            log.warning("skipping %s", err)
    if len(states) < run.eval.average_last:
        raise CheckpointError(
            f"eval.average_last={run.eval.average_last} but {run_dir} has only {len(states)} valid "
            f"checkpoint(s); train with trainer.keep_last >= {run.eval.average_last}")
    corpus = prepare(run.data, cache_dir(run.paths))
    model = Transformer(run.model, len(corpus.tokenizer), corpus.tokenizer.pad)
    if any(k.startswith("gates.") for k in states[0]):  # trained with head gates: evaluated
        from heads_lab.heads import install_gates  # with the test-time gates

        install_gates(model, run.prune)
    model.load_state_dict(average(states))
    model.to(device).eval()
    label = ",".join(overrides) or "defaults"
    out_dir = run_dir / "evals" / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{_safe(label)}"
    out_dir.mkdir(parents=True, exist_ok=False)
    split, ppl, scores = evaluate_on_split(run, model, corpus, device, out_dir, "")
    name = run.eval.split
    result = {
        "run_dir": str(run_dir), "overrides": overrides, "checkpoints": used,
        "metrics": {f"{name}/loss": ppl["loss"], f"{name}/ppl": ppl["ppl"],
                    f"{name}/bleu": scores["bleu"], f"{name}/chrf": scores["chrf"]},
        "sacrebleu": {k: scores[k] for k in ("bleu_signature", "chrf_signature", "bleu_detail")},
        "decoding": {"split": name, "beam": run.eval.beam, "lenpen": run.eval.lenpen,
                     "sentences": len(split)},
        "seconds": time.perf_counter() - started, "config": config,
    }
    write_json(out_dir / "eval.json", result)
    console.print(summary_table("heads-lab eval", [
        ("checkpoints", ", ".join(used)),
        (f"{name} PPL", f"{ppl['ppl']:.2f}"),
        (f"{name} BLEU (beam {run.eval.beam})", f"{scores['bleu']:.2f}"),
        (f"{name} chrF", f"{scores['chrf']:.2f}"),
    ]))
    console.print(f"BLEU signature: {scores['bleu_signature']}")
    console.print(f"results: {out_dir / 'eval.json'}")
    return 0


def average(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of model state dicts (in float64, cast back)."""
    if len(states) == 1:
        return states[0]
    out = {}
    for key, first in states[0].items():
        if first.is_floating_point():
            total = sum(s[key].double() for s in states)
            out[key] = (total / len(states)).to(first.dtype)
        else:
            out[key] = first
    return out


def _safe(text: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "=.,-_" else "-" for c in text)
    return cleaned[:80]


def load_trained(run_dir: Path, overrides: list[str], allowed: tuple[str, ...], usage: str):
    """A trained run for analysis or pruning: (run config, config dict, model with the newest
    valid checkpoint on its device in eval mode, corpus, device). Only overrides starting with
    `allowed` may change the run's config."""
    from heads_lab.config import cache_dir, to_dict
    from heads_lab.data import prepare
    from heads_lab.model import Transformer
    from heads_lab.train import check_precision, resolve_device

    bad = [o for o in overrides if not o.lstrip("+").startswith(allowed)]
    if bad:
        raise ConfigError(f"{bad[0]!r} cannot change here; allowed: "
                          f"{', '.join(a.rstrip('=') + ('*' if a.endswith('.') else '') for a in allowed)}"
                          f" (usage: {usage})")
    cfg, run = compose_run(run_dir, overrides)
    found = checkpoint.latest(run_dir)
    if found is None:
        raise CheckpointError(NO_CHECKPOINTS.format(run_dir=run_dir))
    state, path = found
    if run.trainer.threads:
        torch.set_num_threads(run.trainer.threads)
    device = resolve_device(run.trainer.device)
    check_precision(device, run.trainer.precision)
    corpus = prepare(run.data, cache_dir(run.paths))
    model = Transformer(run.model, len(corpus.tokenizer), corpus.tokenizer.pad)
    if any(k.startswith("gates.") for k in state["model"]):  # trained with head gates: they
        from heads_lab.heads import install_gates  # decide which heads count

        install_gates(model, run.prune)
    model.load_state_dict(state["model"])
    log.info("loaded %s", path)
    return run, to_dict(cfg), model.to(device).eval(), corpus, device, path
