"""`heads-lab prune <run dir> method=importance|gates [prune.KEY=VALUE ...]`: how many heads can go.

method=importance (Michel et al. 2019): repeatedly compute head importance (|∂L/∂ξ_h| on
prune.split, under the current mask) and prune the least important prune.step of the heads in
scope; one curve per attention type in prune.sites and one over all of them together. Every
point is evaluated on the first prune.eval_sentences of prune.eval_split with the heads removed
for real (smaller projections), so params and decoding time are measured, not assumed.

method=gates (Voita et al. 2019): Hard Concrete gates on every head, trained jointly with the
model from the run's checkpoint for prune.steps steps with λ = prune.l0_lambda times the L0
penalty; then the test-time gates decide which heads stay, those heads are removed and the model
evaluated. `-m prune.l0_lambda=0.01,0.05,0.1` runs one job per λ and prints them side by side
(heads kept per attention type vs BLEU, as Voita's table). Gates from scratch: `heads-lab train
prune.l0_lambda=...` (and `heads-lab report` shows the heads kept).

Attention whose heads cannot go one by one (grouped-query, talking heads) has its pruned heads
masked instead (outputs zeroed; prune.json's heads_pruned_by says which), params unchanged.

Everything goes to <run dir>/prune/<time>_<overrides>/: prune.json, prune.md, prune.csv, the
curve PNG (importance), results.json + hyps/refs (gates; `heads-lab report <run dir>/prune`
reads them).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from heads_lab.commands.command import Command
from heads_lab.config.sites import KEPT_COLUMNS, SITES
from heads_lab.config.unread import unread_prune_settings
from heads_lab.config.variants import variant
from heads_lab.errors import ConfigError
from heads_lab.hf import is_hf
from heads_lab.output.curves import plot_curves
from heads_lab.output.files import output_dir, write_json, write_lines
from heads_lab.output.progress import clock
from heads_lab.output.tables import show, to_rich, write_csv, write_markdown
from heads_lab.output.tracking import console

log = logging.getLogger(__name__)
COMMAND = Command("prune", "pruning", ("prune.", "eval.", "trainer.precision="), __doc__,
                  shorthands=("method=",), sweeps=True)


def main(args: list[str]) -> int:
    if args and is_hf(args[0]):  # a pretrained Hugging Face model (heads_lab.hf)
        from heads_lab.commands.hf import prune_hf  # lazy: start-up time (transformers)

        return prune_hf(args[0], args[1:])
    parsed = COMMAND.parse(args)
    if isinstance(parsed, int):
        return parsed
    run_dir, jobs = parsed
    rows = [prune_run(run_dir, job) for job in jobs]
    gated = [r for r in rows if r.get("method") == "gates"]
    if len(gated) > 1:
        show(gate_table(gated), width=160)
    return 0


def prune_run(run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    from heads_lab.model.heads import gates_of  # lazy: start-up time (torch)
    from heads_lab.training.runs import load  # lazy: start-up time (torch)

    t = load(run_dir, overrides)
    run, model, corpus, device = t.run, t.model, t.corpus, t.device
    if gates_of(model) is not None:
        raise ConfigError(f"{run_dir} was trained with head gates (prune.l0_lambda="
                          f"{run.prune.l0_lambda}); its test-time gates already prune it: "
                          "evaluate it with heads-lab eval")
    p = run.prune
    for warning in unread_prune_settings(overrides, "prune", p):
        log.warning(warning)
    if p.method == "gates" and p.l0_lambda == 0:
        log.warning("method=gates with prune.l0_lambda=0: gates fine-tuned without the L0 "
                    "penalty (the control run for a λ sweep)")
    remove = all(variant(run.model, s).removable(run.model)
                 for s in (SITES if p.method == "gates" else p.sites))
    if not remove:
        kind = getattr(run.model.attention, "value", run.model.attention)
        what = ("talking-heads attention" if kind == "talking_heads" else
                f"grouped-query attention (model.kv_heads={run.model.kv_heads})")
        console.print(f"{what} cannot lose heads one by one: pruned heads are masked (their "
                      "outputs zeroed), not removed; params and speed stay the full model's")
    # what tells prune dirs apart comes first
    out = output_dir(run_dir, "prune", overrides, first=("prune.method=", "prune.l0_lambda="))
    eval_split = _head(corpus.splits[p.eval_split], p.eval_sentences)
    if p.method == "importance":
        result = importance_curves(run, model, corpus, eval_split, device, out, remove)
    else:
        result = gates_from_trained(run, t.config, model, corpus, eval_split, device, out, remove)
    result.update({"heads_pruned_by": "removal" if remove else "mask", "run_dir": str(run_dir),
                   "checkpoint": t.checkpoints[0], "overrides": overrides,
                   "precision": str(run.trainer.precision)})
    write_json(out / "prune.json", result)
    console.print(f"prune: {out / 'prune.json'}")
    return result


def _head(split, n: int | None):
    """The first n sentences of a split."""
    from heads_lab.data import Split  # lazy: start-up time (torch)

    n = len(split) if n is None else min(n, len(split))
    return Split(split.src_text[:n] if split.src_text else None,
                 split.tgt_text[:n] if split.tgt_text else None,
                 [split.src[i] for i in range(n)], [split.tgt[i] for i in range(n)])


FORWARD_REPEATS = 3


def _timed(fn, *args) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def evaluate(model, split, corpus, run, device) -> dict[str, float]:
    """PPL, BLEU, chrF, decoding seconds and teacher-forced forward speed (target tokens/s) of
    `model` on `split`. The forward speed is the fair one to compare across pruned models: every
    model reads the same reference tokens, while decoding time also follows how long each
    model's translations are."""
    from heads_lab.training.device import autocast  # lazy: start-up time (torch)
    from heads_lab.training.evaluate import perplexity, score, translate  # lazy: start-up time (torch)

    model.eval()
    with autocast(device, run.trainer.precision):
        ppl = perplexity(model, split, run.trainer.max_tokens, device)  # also the warm-up
        forward_s = min(_timed(perplexity, model, split, run.trainer.max_tokens, device)
                        for _ in range(FORWARD_REPEATS))  # the best of a few: least noise
        started = time.perf_counter()
        hyps = translate(model, split, corpus.tokenizer, run.eval, device)
        seconds = time.perf_counter() - started
    s = score(hyps, split.tgt_text, run.eval.bleu_tokenize)
    return {"bleu": s["bleu"], "chrf": s["chrf"], "ppl": ppl["ppl"], "decode_s": seconds,
            "forward_tok_s": ppl["tokens"] / max(forward_s, 1e-9), "hyps": hyps,
            "bleu_signature": s["bleu_signature"]}


def _point(base, masked, split, corpus, run, device, remove: bool = True) -> dict[str, Any]:
    """The model with `masked` heads removed for real (the numbers are the smaller model's), or
    where its attention cannot lose heads one by one (remove=False) with their outputs zeroed."""
    from heads_lab.model import heads  # lazy: start-up time (torch)

    if remove:
        pruned = copy.deepcopy(base)
        heads.remove_heads(pruned, masked)
        ev = evaluate(pruned, split, corpus, run, device)
        kept = heads.count_heads(pruned)
    else:
        pruned = base
        with heads.masked(base, masked):
            ev = evaluate(base, split, corpus, run, device)
        kept = heads.kept_after(heads.count_heads(base), masked)
    return {"pruned_heads": sum(len(v) for v in masked.values()), "kept": kept,
            "params": sum(p.numel() for p in pruned.parameters()),
            "bleu": ev["bleu"], "chrf": ev["chrf"], "ppl": ev["ppl"], "decode_s": ev["decode_s"],
            "forward_tok_s": ev["forward_tok_s"], "masked": heads.format_heads(masked)}


def importance_curves(run, model, corpus, eval_split, device, out: Path,
                      remove: bool = True) -> dict[str, Any]:
    from heads_lab.analysis import head_importance, least_important  # lazy: start-up time (torch)
    from heads_lab.model.heads import count_heads  # lazy: start-up time (torch)

    p = run.prune
    imp_split = _head(corpus.splits[p.split], p.eval_sentences)
    scopes = [[s] for s in p.sites] + ([list(p.sites)] if len(p.sites) > 1 else [])
    total = count_heads(model)
    start = _point(model, {}, eval_split, corpus, run, device, remove)
    curves = {}
    for scope in scopes:
        name = "+".join(scope) if len(scope) > 1 else scope[0]
        in_scope = sum(total[s] for s in scope)
        per_step = max(1, round(p.step * in_scope))
        masked: dict[tuple[str, int], list[int]] = {}
        rows = [{**start, "fraction": 0.0}]
        while sum(len(v) for v in masked.values()) < in_scope:
            importance = head_importance(model, imp_split, None, run.trainer.max_tokens, device,
                                         masked, sites=tuple(scope))
            for site, layer, h in least_important(importance, masked, per_step):
                masked.setdefault((site, layer), []).append(h)
            n = sum(len(v) for v in masked.values())
            row = _point(model, masked, eval_split, corpus, run, device, remove)
            rows.append({**row, "fraction": n / in_scope})
            console.print(f"importance pruning {name}: {n}/{in_scope} heads pruned → "
                          f"BLEU {row['bleu']:.2f}, PPL {row['ppl']:.2f}")
        curves[name] = rows
    table = curve_table(curves)
    _write_tables(out, table)
    png = plot_curves(curves, out / "prune_importance.png", p.eval_split)
    show(to_rich(table, "importance pruning (Michel et al. 2019): heads "
                        + ("removed for real" if remove else "masked")))
    return {"method": "importance", "eval_split": p.eval_split,
            "eval_sentences": len(eval_split), "step": p.step, "curves": curves,
            "files": ["prune.md", "prune.csv", png.name]}


def curve_table(curves: dict[str, list[dict]]) -> dict[str, Any]:
    header = ["pruned in", "fraction", *KEPT_COLUMNS, "params", "BLEU", "chrF",
              "PPL", "fwd tok/s", "decode s"]
    rows = []
    for name, points in curves.items():
        for r in points:
            rows.append([name, f"{r['fraction']:.2f}", *(str(r["kept"][s]) for s in SITES),
                         f"{r['params']:,}", f"{r['bleu']:.2f}", f"{r['chrf']:.2f}",
                         f"{r['ppl']:.2f}", f"{r['forward_tok_s']:,.0f}", f"{r['decode_s']:.2f}"])
    return {"header": header, "rows": rows}


def gate_table(results: list[dict]):
    rules = " / ".join(sorted({r.get("gate_eval", "binary") for r in results}))
    table = Table(title=f"Hard Concrete gates (Voita et al. 2019): heads kept ({rules} rule) vs "
                        "BLEU", title_justify="left")
    for col in ("λ", "from", *KEPT_COLUMNS, "BLEU", "BLEU unpruned", "PPL"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(f"{r['l0_lambda']:g}", "trained", *(str(r["kept"][s]) for s in SITES),
                      f"{r['bleu']:.2f}", f"{r['bleu_before']:.2f}", f"{r['ppl']:.2f}")
    return table


def gates_from_trained(run, config, model, corpus, eval_split, device, out: Path,
                       remove: bool = True) -> dict:
    # lazy: start-up time (torch)
    from heads_lab.model.heads import (
        count_heads,
        fold_gates,
        format_heads,
        install_gates,
        kept_after,
        remove_heads,
    )
    from heads_lab.training.loop import train  # lazy: start-up time (torch)
    from heads_lab.training.optim import inverse_sqrt  # lazy: as above

    p, t = run.prune, run.trainer
    before = evaluate(model, eval_split, corpus, run, device)
    gates = install_gates(model, p)
    final_lr = t.lr * inverse_sqrt(t.warmup_steps)(max(t.max_steps or 1, 1))
    tcfg = dataclasses.replace(t, max_steps=p.steps, max_epochs=None, lr=p.lr or final_lr,
                               warmup_steps=max(1, p.steps // 10), save_checkpoint=False,
                               valid_every=p.steps, log_every=max(1, p.steps // 10))

    started = time.perf_counter()

    def on_log(step: int, metrics: dict[str, float]) -> None:
        if "train/l0" in metrics:
            spent = time.perf_counter() - started
            console.print(f"gates step {step}/{p.steps}: loss {metrics['train/loss']:.3f}, L0 "
                          f"{metrics['train/l0']:.2f}, heads open {metrics['train/heads_open']:.0f}"
                          f"  elapsed {clock(spent)}  ETA {clock(spent / step * (p.steps - step))}")

    train(model, corpus.splits["train"], corpus.splits["valid"], tcfg, run.seed, device, on_log,
          extra=gates)
    train_s = time.perf_counter() - started
    closed = fold_gates(model)  # kept heads × their test-time gate (p.gate_eval), gates off
    total = count_heads(model)
    if remove:
        remove_heads(model, closed)
    after = evaluate(model, eval_split, corpus, run, device)  # closed heads' columns are zero
    kept = count_heads(model) if remove else kept_after(total, closed)
    result = {"method": "gates", "l0_lambda": p.l0_lambda, "steps": p.steps, "lr": tcfg.lr,
              "gate_lr": p.gate_lr, "gate_eval": p.gate_eval, "init_keep": p.init_keep,
              "train_s": train_s, "heads": total, "kept": kept,
              "removed": format_heads(closed), "bleu": after["bleu"], "chrf": after["chrf"],
              "ppl": after["ppl"], "bleu_before": before["bleu"], "ppl_before": before["ppl"],
              "params": sum(x.numel() for x in model.parameters()),
              "decode_s": after["decode_s"], "decode_s_before": before["decode_s"],
              "forward_tok_s": after["forward_tok_s"],
              "forward_tok_s_before": before["forward_tok_s"]}
    split = p.eval_split
    write_lines(out / f"hyps.{split}.txt", after["hyps"])
    write_lines(out / f"refs.{split}.txt", eval_split.tgt_text)
    write_json(out / "results.json", {  # read by heads-lab report
        "status": "complete", "name": f"gates λ={p.l0_lambda:g}", "config": config,
        "metrics": {f"{split}/bleu": after["bleu"], f"{split}/chrf": after["chrf"],
                    f"{split}/ppl": after["ppl"], "cost/params": result["params"],
                    **{f"heads_kept/{s}": n for s, n in kept.items()}},
        "decoding": {"split": split, "beam": run.eval.beam, "sentences": len(eval_split)},
        "precision": str(run.trainer.precision),  # what it computed in (report labels rows by it)
        "prune": result})
    table = {"header": ["λ", *KEPT_COLUMNS, "params", "BLEU", "BLEU before",
                        "PPL", "PPL before", "fwd tok/s", "fwd tok/s before", "decode s",
                        "decode s before"],
             "rows": [[f"{p.l0_lambda:g}", *(f"{kept[s]}/{total[s]}" for s in SITES),
                       f"{result['params']:,}", f"{after['bleu']:.2f}", f"{before['bleu']:.2f}",
                       f"{after['ppl']:.2f}", f"{before['ppl']:.2f}",
                       f"{after['forward_tok_s']:,.0f}", f"{before['forward_tok_s']:,.0f}",
                       f"{after['decode_s']:.2f}", f"{before['decode_s']:.2f}"]]}
    _write_tables(out, table)
    show(to_rich(table, f"Hard Concrete gates from the trained model ({p.gate_eval} rule): the "
                        "closed heads " + ("removed for real" if remove else "masked")))
    result["files"] = ["prune.md", "prune.csv", "results.json", f"hyps.{split}.txt"]
    return result


def _write_tables(out: Path, table: dict[str, Any]) -> None:
    write_markdown(out / "prune.md", {**table, "note": "heads removed for real; kept e/d/d-e: "
                                      "encoder self, decoder self, decoder-encoder"})
    write_csv(out / "prune.csv", table)
