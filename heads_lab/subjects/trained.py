"""A run trained here as a Subject (heads_lab/analysis/subject.py): its checkpoint read back
(heads_lab/training/runs.py), its heads those of heads_lab.model (every kind of them: talking
heads are measured per kind), its evaluation BLEU/chrF and PPL with pruned heads removed for
real where its attention allows (smaller projections: params and speed measured, not assumed),
else masked; and prune's method=gates, which fine-tunes it with Hard Concrete gates."""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections import Counter
from functools import cached_property
from pathlib import Path
from typing import Any

from rich.markup import escape

from heads_lab.analysis.maps import collect_maps
from heads_lab.analysis.measures import GRADIENT_MEASURES
from heads_lab.analysis.pruning import write_tables
from heads_lab.analysis.record import load_source
from heads_lab.config.sites import ALL_SITES, KEPT_COLUMNS, SITES
from heads_lab.config.variants import variant
from heads_lab.errors import ConfigError
from heads_lab.output.files import write_json, write_lines
from heads_lab.output.progress import clock
from heads_lab.output.tables import show, to_rich, wide_console
from heads_lab.output.tracking import console
from heads_lab.training.runs import load

log = logging.getLogger(__name__)
NOTE = "heads removed for real; kept e/d/d-e: encoder self, decoder self, decoder-encoder"


def open_trained(run_dir: Path, verb: str, overrides: list[str]) -> TrainedSubject:
    """The run in `run_dir` read back for `verb`: analyze computes in fp32 whatever the run's
    trainer.precision; prune refuses a run trained with head gates (they prune it already) and
    says where heads can only be masked."""
    return TrainedSubject(run_dir, load(run_dir, overrides, computes="fp32" if verb == "analyze"
                                        else None), verb)


class TrainedSubject:
    """A heads-lab run's model, read back (training.runs.Trained), as analyze and prune see it."""

    pretrained = False
    verb = "pruned"

    def __init__(self, run_dir: Path, trained, verb: str):
        # lazy: start-up time (torch)
        from heads_lab.model.heads import attention_modules, gates_of, head_kinds, map_kind

        self.run_dir, self.trained = run_dir, trained
        self.run, self.model, self.corpus = trained.run, trained.model, trained.corpus
        self.device = trained.device
        self.name, self.home = run_dir.name, run_dir
        self.tokenizer = trained.corpus.tokenizer
        self.identity = {"run_dir": str(run_dir), "checkpoint": trained.checkpoints[0]}
        self.modules = attention_modules(self.model)
        # heatmaps draw attention maps: their heads are the maps' kind (softmax heads, h of them)
        self.map_heads = {key: head_kinds(m)[map_kind(m)] for key, m in self.modules.items()}
        self.groups = {}  # key/value groups are pruned head by head (masked) in a run of its own
        if verb == "prune":
            if gates_of(self.model) is not None:
                raise ConfigError(f"{run_dir} was trained with head gates (prune.l0_lambda="
                                  f"{self.run.prune.l0_lambda}); its test-time gates already "
                                  "prune it: evaluate it with heads-lab eval")
            self._check_pruning()

    def warn(self, line: str) -> None:
        log.warning(line)

    # analyze
    def source(self, cfg):
        _check_treebank_language(cfg.treebank, self.run.data.src, console=wide_console())
        return load_source(self.corpus, cfg, self.run.data.cleaning.normalize,
                           self.model.cfg.max_positions - 1)

    def maps(self, source):
        return collect_maps(self.model, source.split, len(source.indices), self.device,
                            decoder=source.has_target)

    def masked(self, heads):
        from heads_lab.model.heads import masked  # lazy: start-up time (torch)

        return masked(self.model, heads)

    def sequence_maps(self, ids):
        """The encoder's maps of `ids`, read as a source (its EOS after them): a translator
        reads sequences alone there."""
        from heads_lab.data import Split  # lazy: start-up time (torch)

        split = Split(None, None, [list(x) for x in ids], [[] for _ in ids])
        return collect_maps(self.model, split, None, self.device, decoder=False)

    def gradients(self, source, cfg):
        n = len(source.indices)
        return {g.name: g.compute(self.model, source.split, g.sentences(cfg, n), self.device,
                                  self.run.trainer.max_tokens)
                for g in GRADIENT_MEASURES if g.wanted(cfg, source.has_target)}

    def frequencies(self, source) -> Counter:
        train = self.corpus.splits["train"]
        return Counter(int(t) for i in range(len(train)) for t in train.src[i])

    def notes(self, gradient) -> dict[str, Any]:
        return {}

    def said(self, result) -> str:
        return f"weights: {self.trained.checkpoints[0]}"

    # prune
    def _check_pruning(self) -> None:
        run, p = self.run, self.run.prune
        if p.method == "gates" and p.l0_lambda == 0:
            log.warning("method=gates with prune.l0_lambda=0: gates fine-tuned without the L0 "
                        "penalty (the control run for a λ sweep)")
        self.remove = all(variant(run.model, s).removable(run.model)
                          for s in (SITES if p.method == "gates" else
                                    [x for x in p.sites if x in ALL_SITES]))
        if not self.remove:
            kind = getattr(run.model.attention, "value", run.model.attention)
            what = ("talking-heads attention" if kind == "talking_heads" else
                    f"grouped-query attention (model.kv_heads={run.model.kv_heads})")
            console.print(f"{what} cannot lose heads one by one: pruned heads are masked (their "
                          "outputs zeroed), not removed; params and speed stay the full model's")
        self.prune_title = ("importance pruning (Michel et al. 2019): heads "
                            + ("removed for real" if self.remove else "masked"))

    prune_note = NOTE
    task_metric = None  # BLEU
    curve_columns = [
        ("fraction", lambda r: f"{r['fraction']:.2f}"),
        *((column, lambda r, s=s: str(r["kept"][s])) for column, s in zip(KEPT_COLUMNS, SITES)),
        ("params", lambda r: f"{r['params']:,}"), ("BLEU", lambda r: f"{r['bleu']:.2f}"),
        ("chrF", lambda r: f"{r['chrf']:.2f}"), ("PPL", lambda r: f"{r['ppl']:.2f}"),
        ("fwd tok/s", lambda r: f"{r['forward_tok_s']:,.0f}"),
        ("decode s", lambda r: f"{r['decode_s']:.2f}")]

    @cached_property
    def eval_split(self):
        p = self.run.prune
        return _head(self.corpus.splits[p.eval_split], p.eval_sentences)

    @cached_property
    def importance_split(self):
        p = self.run.prune
        return _head(self.corpus.splits[p.split], p.eval_sentences)

    @cached_property
    def pruning(self) -> dict[str, Any]:
        return {"eval_sentences": len(self.eval_split),
                "heads_pruned_by": "removal" if self.remove else "mask", **self.identity,
                "precision": str(self.run.trainer.precision)}

    def heads(self) -> dict[str, int]:
        from heads_lab.model.heads import count_heads  # lazy: start-up time (torch)

        return count_heads(self.model)

    def importance(self, masked, scope, groups: bool = False):
        from heads_lab.analysis import head_importance  # lazy: start-up time (torch)

        if groups:  # (self.groups is empty: the loop never asks)
            raise ConfigError("a run trained here is pruned head by head")

        return head_importance(self.model, self.importance_split, None,
                               self.run.trainer.max_tokens, self.device, masked,
                               sites=tuple(scope))

    def point(self, masked, fraction: float) -> dict[str, Any]:
        return {**_point(self.model, masked, self.eval_split, self.corpus, self.run, self.device,
                         self.remove), "fraction": fraction}

    def summary(self, row) -> str:
        return f"BLEU {row['bleu']:.2f}, PPL {row['ppl']:.2f}"

    def gates(self, out: Path) -> dict[str, Any]:
        return gates_from_trained(self.run, self.trained.config, self.model, self.corpus,
                                  self.eval_split, self.device, out, self.remove)


def _head(split, n: int | None):
    """The first n sentences of a split."""
    from heads_lab.data import Split  # lazy: start-up time (torch)

    n = len(split) if n is None else min(n, len(split))
    return Split(split.src_text[:n] if split.src_text else None,
                 split.tgt_text[:n] if split.tgt_text else None,
                 [split.src[i] for i in range(n)], [split.tgt[i] for i in range(n)],
                 split.open_end, None if split.bytes is None else split.bytes[:n],
                 split.repeats[:n] if split.repeats else None)


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


def gates_from_trained(run, config, model, corpus, eval_split, device, out: Path,
                       remove: bool = True) -> dict:
    """method=gates (see heads_lab/commands/prune.py): Hard Concrete gates fine-tuned with the
    model, the closed heads removed (or masked), the model evaluated before and after."""
    # lazy: start-up time (torch)
    from heads_lab.model.heads import (
        count_heads,
        fold_gates,
        format_heads,
        install_gates,
        kept_after,
        remove_heads,
    )
    from heads_lab.training.loop import seed_everything, train  # lazy: start-up time (torch)
    from heads_lab.training.optim import inverse_sqrt  # lazy: as above

    p, t = run.prune, run.trainer
    before = evaluate(model, eval_split, corpus, run, device)
    seed_everything(run.seed)  # the gates' noise and dropout: the same run, the same numbers
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
    write_tables(out, table, NOTE)
    show(to_rich(table, f"Hard Concrete gates from the trained model ({p.gate_eval} rule): the "
                        "closed heads " + ("removed for real" if remove else "masked")))
    result["files"] = ["prune.md", "prune.csv", "results.json", f"hyps.{split}.txt"]
    return result


def _check_treebank_language(path: str, src: str, console) -> str | None:
    """One line when analysis.treebank's language (UD's file name, <lang>_<name>-ud-<split>.conllu)
    is not the model's source language: its sentences may still match the tokenizer (a joint
    vocabulary reads both), but the heads then read text they were not trained to read. The
    analysis goes on; the line says so. Returns the treebank's language code, if the name has one."""
    if not path:
        return None
    name = Path(path).name
    lang = name.split("_", 1)[0] if "_" in name and "-ud-" in name else None
    if lang and src and lang != src:
        console.print(f"[yellow]analysis.treebank {escape(name)} is in '{lang}', but the model's "
                      f"source language is '{src}' (data.src): its heads are analysed on text of "
                      f"another language; use a {src} treebank (e.g. {src}_pud-ud-test.conllu.gz)[/]",
                      markup=True)
    return lang
