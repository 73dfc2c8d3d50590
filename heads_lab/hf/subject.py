"""A pretrained Hugging Face model (`hf:<hub name or save_pretrained dir>`) as a Subject
(heads_lab/analysis/subject.py): analyze and prune read it as they read a run trained here.

- The command line: only the settings the verb reads for a pretrained model (ALLOWED), composed
  and validated as a run's; a data set where one is named (data=multi30k: its split's texts,
  re-tokenized by the model's tokenizer).
- Heads: the model's own attention (heads_lab.hf.heads: maps, gates through hooks), one kind
  ("head") per (site, layer); pruned heads are masked (zeroed), never removed.
- Analysis: heads_lab.hf.analysis (sentences, what is not measured); pruning's metric:
  heads_lab.hf.prune, its task's (heads_lab.hf.tasks: a translator's BLEU, chrF and PPL; an
  encoder's masked-LM accuracy; a language model's PPL and bits per byte).
- Grouped-query attention: `groups` (key/value groups per layer), pruned as a second curve.
- Outputs go to outputs/hf/<model>/{analysis,prune}/<time>_<overrides>/.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import cached_property
from pathlib import Path
from typing import Any

from heads_lab.analysis.subject import sites_present
from heads_lab.config.compose import cache_dir, compose, to_object
from heads_lab.config.validate import LM_DATA, validate
from heads_lab.errors import ConfigError
from heads_lab.hf import analysis as hf_analysis
from heads_lab.hf import heads as hf_heads
from heads_lab.hf import prune as hf_prune
from heads_lab.hf.models import Pretrained, account, load
from heads_lab.hf.tasks import TASKS, EvalData
from heads_lab.output.tracking import console

ALLOWED = {"analyze": ("analysis.", "data", "trainer.device=", "trainer.threads=", "paths."),
           "prune": ("prune.", "data", "eval.beam=", "trainer.device=", "trainer.threads=",
                     "paths.")}


def open_pretrained(spec: str, verb: str, overrides: list[str]) -> PretrainedSubject:
    """`spec` read in for `verb` with `overrides`: a setting the verb does not read for a
    pretrained model, prune's method=gates (it fine-tunes: heads-lab's own models only) and a
    prune without a data set are refused before the model is read."""
    run = _config(verb, overrides)
    if verb == "prune":
        if run.prune.method.value != "importance":
            raise ConfigError("prune hf:... runs method=importance (Michel et al.); Hard "
                              "Concrete gates need fine-tuning, which heads-lab does for its "
                              "own models only")
        if not any(o.startswith("data") for o in overrides):
            raise ConfigError("prune hf:... needs a data set to measure on: data=multi30k (a "
                              "translator: its source and reference; an encoder or a language "
                              "model: data.src=en for English text)")
    device = _device(run)
    pre = load(spec, device)
    if not any(o.startswith("prune.sites=") for o in overrides):
        run.prune.sites = list(pre.task.sites)  # by default, every attention type it has
    subject = PretrainedSubject(pre, run, overrides, device)
    if verb == "prune":  # refused, or its data set read, before prune makes its output dir
        sites_present(list(run.prune.sites), subject.heads())
        _ = subject.prune_data
    return subject


def _config(verb: str, args: list[str]):
    """The composed config of an hf: command's overrides (only the keys it reads)."""
    for item in args:
        if "=" not in item or not item.startswith(ALLOWED[verb]):
            raise ConfigError(f"{verb} hf:...: {item!r} is not a setting it takes; give "
                              f"key=value overrides of {', '.join(ALLOWED[verb])}")
    # a language model's documents (data=shakespeare) are read as task=lm's text
    lm = any(a.split("=", 1)[1] in LM_DATA for a in args if a.startswith("data="))
    run = to_object(compose([*args, "task=lm"] if lm else args))
    validate(run)
    return run


def _device(run):
    import torch  # lazy: start-up time (torch)

    from heads_lab.training.device import resolve_device  # lazy: start-up time (torch)

    if run.trainer.threads:
        torch.set_num_threads(run.trainer.threads)
    return resolve_device(run.trainer.device)


def home(name: str) -> Path:
    """outputs/hf/<the model's name as one path part>: hf:. and hf:.. are named by the dir they
    mean (as one part they would climb out of outputs/hf)."""
    def part(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "-", text.strip("/")).strip("-")

    safe = part(name)
    if not safe.strip("."):
        safe = part(Path(name).expanduser().resolve().name).strip(".")
    return Path("outputs") / "hf" / (safe or "model")


class PretrainedSubject:
    """An `hf:` model (heads_lab.hf.models.Pretrained) as analyze and prune see it."""

    pretrained = True
    verb = "masked"
    prune_note_form = "heads masked (outputs zeroed), not removed; {split}: first {n} sentences"

    def __init__(self, pre: Pretrained, run, overrides: list[str], device):
        self.pre, self.run, self.overrides, self.device = pre, run, overrides, device
        self.name = f"hf:{pre.name}"
        self.home = home(pre.name)
        self.tokenizer = pre.tokens
        self.identity = {"checkpoint": self.name}
        self.modules = {key: hf_analysis.HeadsOf(n) for key, n in pre.heads.items()}
        self.map_heads = pre.heads
        self.groups = pre.groups
        key, label = pre.task.metric
        self.task_metric = (key, label.format(split=run.prune.eval_split))
        self.prune_title = f"importance pruning of {self.name} (Michel et al. 2019)"
        self.curve_columns = [
            ("% masked", lambda r: f"{100 * r['fraction']:.0f}"),
            *((f"kept {s}", lambda r, s=s: str(r["kept"][s]))
              for s in dict.fromkeys(site for site, _ in pre.heads)),
            *((("kv groups masked", lambda r: str(r.get("kv_groups_pruned", "–"))),)
              if self.groups else ()),
            *((m.replace("bits_per_byte", "bits/byte"),
               lambda r, m=m: f"{r[m]:.2f}" if m in ("bleu", "chrf", "ppl") else f"{r[m]:.3f}")
              for m in pre.task.columns)]

    def warn(self, line: str) -> None:
        console.print(f"warning: {line}")

    @cached_property
    def _corpus(self):
        """The data set the command line names, prepared once (prune reads two of its splits)."""
        from heads_lab.data import prepare  # lazy: start-up time (torch)

        # a language model's documents (data=shakespeare): their held-out blocks' text
        return prepare(self.run.data, cache_dir(self.run.paths), str(self.run.task))

    def _texts(self, split: str) -> tuple[list[str], list[str] | None] | None:
        """A data set's split texts (sources, references), where the command line names one."""
        if not any(o.startswith("data") for o in self.overrides):
            return None
        part = self._corpus.splits[split]
        if self._corpus.lm is not None:  # a language model's text: on the target side
            if part.tgt_text is None:
                raise ConfigError(f"the {split} split's texts are not kept (only valid and "
                                  "test are): use valid or test")
            return list(part.tgt_text), None
        if part.src_text is None:
            raise ConfigError(f"the {split} split's texts are not kept (only valid and test "
                              "are): use valid or test")
        return (list(part.src_text),
                list(part.tgt_text) if part.tgt_text is not None else None)

    # analyze
    def source(self, cfg):
        texts = self._texts(cfg.split) if not cfg.treebank else None
        return hf_analysis.source(self.pre, cfg, texts, self.run.data.cleaning.normalize)

    def _ids(self, source) -> tuple[list[list[int]], list[list[int]] | None]:
        n = len(source.split)
        ids = [[int(t) for t in source.split.src[i]] for i in range(n)]
        targets = ([[int(t) for t in source.split.tgt[i]] for i in range(n)]
                   if source.has_target and self.pre.task.references else None)
        return ids, targets

    def maps(self, source):
        return hf_heads.maps(self.pre, *self._ids(source), self.device)

    def masked(self, heads):
        return hf_heads.masked(self.pre, heads)

    def sequence_maps(self, ids):
        longest, limit = max(len(x) for x in ids), self.pre.positions
        if limit is not None and longest > limit:
            cfg = self.run.analysis
            raise ConfigError(f"analysis.role_length={cfg.role_length}: the role probe reads "
                              f"{longest:,} tokens (the BOS and the sequence twice), over "
                              f"{self.name}'s {limit:,} positions; give analysis.role_length="
                              f"{(limit - 1) // 2} or less")
        return hf_heads.maps(self.pre, ids, None, self.device)

    def gradients(self, source, cfg):
        ids, targets = self._ids(source)
        if targets is None and self.pre.task.references:  # a translator's loss needs references
            return {}
        return {"importance": hf_heads.importance(self.pre, ids, targets, self.device)}

    def frequencies(self, source) -> Counter:
        return Counter(t for s in self._ids(source)[0] for t in s)

    def notes(self, gradient) -> dict[str, Any]:
        return hf_analysis.notes(self.pre, gradient)

    def said(self, result) -> str:
        return (f"model: {self.name} ({self.pre.family.name}); not measured: "
                + "; ".join(f"{k}: {v}" for k, v in result["not_measured"].items()))

    # prune
    @cached_property
    def prune_data(self) -> tuple[tuple, EvalData]:
        """(src, tgt) where importance is measured, what the metric is measured on."""
        p = self.run.prune
        imp, ev = self._texts(p.split), self._texts(p.eval_split)
        imp_src, imp_tgt = self._encoded(imp, p.eval_sentences)
        ev_src, ev_tgt = self._encoded(ev, p.eval_sentences)
        refs = ev[1][:len(ev_src)] if self.pre.task.references and ev[1] is not None else None
        return (imp_src, imp_tgt), EvalData(ev_src, ev_tgt, refs, list(ev[0][:len(ev_src)]))

    def _encoded(self, texts: tuple, n: int | None) -> tuple[list, list | None]:
        src_text, tgt_text = texts
        n = len(src_text) if n is None else min(n, len(src_text))
        src = hf_analysis.fitted(self.pre, self.pre.tokens.encode(src_text[:n]), None)
        tgt = (self.pre.tokens.encode_target(tgt_text[:n])
               if self.pre.task.references and tgt_text is not None else None)
        return src, tgt

    @property
    def prune_note(self) -> str:
        note = self.prune_note_form.format(split=self.run.prune.eval_split,
                                           n=len(self.prune_data[1].src))
        if self.groups:
            note += ("; a key/value group masked is its key/value head and all its query heads "
                     "(the same output as with them removed)")
        return note + self.pre.task.prune_note

    @property
    def pruning(self) -> dict[str, Any]:
        return {"model": self.name, "family": self.pre.family.name, "task": self.pre.task.name,
                "eval_sentences": len(self.prune_data[1].src), "heads_pruned_by": "mask",
                **({"kv_groups": {f"{s}:{layer}": g for (s, layer), g in self.groups.items()}}
                   if self.groups else {})}

    def heads(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for (site, _), n in self.pre.heads.items():
            total[site] = total.get(site, 0) + n
        return total

    def importance(self, masked, scope, groups: bool = False):
        with hf_heads.masked(self.pre, masked):
            scores = hf_heads.importance(self.pre, *self.prune_data[0], self.device,
                                         groups=groups)
        kind = "group" if groups else "head"
        return {(site, layer): scores[(site, layer, kind)]
                for site, layer in (self.pre.groups if groups else self.pre.heads)
                if site in scope}

    def point(self, masked, fraction: float) -> dict[str, Any]:
        return hf_prune.row(self.pre, masked, self.prune_data[1], self.run.eval.beam,
                            self.device, fraction)

    def summary(self, row) -> str:
        return ", ".join(f"{k} {row[k]:.3f}" for k in ("bleu", "accuracy", "bits_per_byte", "ppl")
                         if k in row)

    def gates(self, out: Path) -> dict[str, Any]:  # refused by open_pretrained
        raise ConfigError("prune hf:... runs method=importance")


def accounts(specs: list[str]) -> dict[str, Any]:
    """Heads, key/value heads, widths, parameters, FLOPs per token and the key/value cache of
    pretrained models side by side: `info`'s table."""
    rows = [account(load(name)) for name in specs]

    def sites(values: dict[str, Any]) -> str:  # one value: it; several: each site named
        if len(set(values.values())) == 1:
            return f"{next(iter(values.values())):,}" + (" each site" if len(values) > 1 else "")
        return " · ".join(f"{site} {v:,}" for site, v in values.items())

    def cache(r: dict[str, Any]) -> str:
        if r["kv_cache_bytes_per_token"] is None:
            return "– (an encoder)"
        return f"{r['kv_cache_bytes_per_token']:,} ({r['dtype']})"

    lengths = sorted({TASKS[r["task"]].flops_said.format(**r["flops_tokens"]) for r in rows})
    body = [["family (task)", *[f"{r['family']} ({r['task']})" for r in rows]],
            ["layers", *[r["layers"] for r in rows]],
            ["query heads per layer", *[sites(r["heads"]) for r in rows]],
            ["key/value heads per layer", *[sites(r["kv_heads"]) for r in rows]],
            ["d_model", *[f"{r['d_model']:,}" for r in rows]],
            ["d_k (head_dim)", *[sites(r["d_k"]) for r in rows]],
            ["parameters", *[f"{r['params']:,}" for r in rows]],
            ["  of them attention", *[f"{r['params_attention']:,}" for r in rows]],
            ["  weights per query head (W_Q, W_O)",
             *[sites(r["weights_per_query_head"]) for r in rows]],
            ["  weights per key/value group (W_K, W_V)",
             *[sites(r["weights_per_kv_group"]) for r in rows]],
            ["MFLOP per token (forward)", *[f"{r['flops_per_token'] / 1e6:,.1f}" for r in rows]],
            ["KV cache bytes per token", *[cache(r) for r in rows]]]
    note = ("FLOPs counted by torch.utils.flop_counter on one forward pass, per token: "
            + "; ".join(lengths) + ". KV cache = 2 · layers · key/value heads · d_k · bytes "
            "of the model's dtype, per token (a translator: per target token, its decoder's "
            "self-attention); biases apart from the per-head weights")
    return {"header": ["", *[r["name"] for r in rows]], "rows": body, "note": note,
            "accounts": rows}
