"""`info`, `analyze` and `prune` of a pretrained Hugging Face model: `hf:<hub name or
save_pretrained dir>` in place of a run dir (heads_lab.hf).

    heads-lab info hf:bert-base-uncased hf:distilbert-base-uncased
    heads-lab analyze hf:Helsinki-NLP/opus-mt-de-en analysis.treebank=<de PUD> analysis.treebank_ref=text_en
    heads-lab analyze hf:bert-base-cased analysis.treebank=<en PUD>
    heads-lab prune hf:Helsinki-NLP/opus-mt-de-en data=multi30k      # BLEU as heads go
    heads-lab prune hf:bert-base-uncased data=multi30k data.src=en    # masked-LM loss as heads go

Outputs go to outputs/hf/<model>/{analysis,prune}/<time>_<overrides>/, as a run's do.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from heads_lab.analysis.publish import check_sentences, publish
from heads_lab.config.compose import cache_dir, compose, to_object
from heads_lab.config.sites import parse_head_mask
from heads_lab.config.unread import unread_analysis_settings, unread_prune_settings
from heads_lab.config.validate import validate
from heads_lab.errors import ConfigError
from heads_lab.hf import analysis as hf_analysis
from heads_lab.hf import prune as hf_prune
from heads_lab.hf.models import Pretrained, account, load
from heads_lab.output.curves import plot_curves
from heads_lab.output.files import output_dir, write_json
from heads_lab.output.tables import show, to_rich, write_csv, write_markdown
from heads_lab.output.tracking import console

ALLOWED = {"analyze": ("analysis.", "data", "trainer.device=", "trainer.threads=", "paths."),
           "prune": ("prune.", "data", "eval.beam=", "trainer.device=", "trainer.threads=",
                     "paths.")}


def _config(command: str, args: list[str]):
    """The composed config of an hf: command's overrides (only the keys it reads)."""
    for item in args:
        if "=" not in item or not item.startswith(ALLOWED[command]):
            raise ConfigError(f"{command} hf:...: {item!r} is not a setting it takes; give "
                              f"key=value overrides of {', '.join(ALLOWED[command])}")
    run = to_object(compose(args))
    validate(run)
    return run


def _device(run):
    import torch  # lazy: start-up time (torch)

    from heads_lab.training.device import resolve_device  # lazy: start-up time (torch)

    if run.trainer.threads:
        torch.set_num_threads(run.trainer.threads)
    return resolve_device(run.trainer.device)


def _out(pre: Pretrained, kind: str, overrides: list[str]) -> Path:
    """outputs/hf/<the model's name as one path part>/<kind>/...: hf:. and hf:.. are named by
    the dir they mean (as one part they would climb out of outputs/hf)."""
    def part(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "-", text.strip("/")).strip("-")

    safe = part(pre.name)
    if not safe.strip("."):
        safe = part(Path(pre.name).expanduser().resolve().name).strip(".")
    return output_dir(Path("outputs") / "hf" / (safe or "model"), kind, overrides)


def _texts(run, overrides: list[str], split: str) -> tuple[list[str], list[str] | None] | None:
    """A data set's split texts (sources, references), where the command line names a data set."""
    if not any(o.startswith("data") for o in overrides):
        return None
    from heads_lab.data import prepare  # lazy: start-up time (torch)

    corpus = prepare(run.data, cache_dir(run.paths))
    part = corpus.splits[split]
    if part.src_text is None:
        raise ConfigError(f"the {split} split's texts are not kept (only valid and test are): "
                          "use valid or test")
    return list(part.src_text), list(part.tgt_text) if part.tgt_text is not None else None


def info_hf(names: list[str], as_json: bool) -> int:
    """Heads, layers, widths, parameters and FLOPs per token of pretrained models side by side."""
    rows = [account(load(name)) for name in names]
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ["", *[r["name"] for r in rows]]
    body = [["family", *[r["family"] for r in rows]],
            ["layers (enc+dec)", *[r["layers"] for r in rows]],
            ["heads (enc / dec-self / dec-enc)",
             *[" / ".join(str(v) for v in r["heads"].values()) for r in rows]],
            ["d_model", *[str(r["d_model"]) for r in rows]],
            ["d_k = d_model / h (per site, as heads)",
             *[" / ".join(str(v) for v in r["d_k"].values()) for r in rows]],
            ["parameters", *[f"{r['params']:,}" for r in rows]],
            ["  of them attention", *[f"{r['params_attention']:,}" for r in rows]],
            ["MFLOP per token (forward)", *[f"{r['flops_per_token'] / 1e6:,.1f}" for r in rows]]]
    note = ("FLOPs counted by torch.utils.flop_counter on a forward of one 20-token sentence "
            "(translators: per target token, 20 of them)")
    show(to_rich({"header": header, "rows": body, "note": note}, "heads-lab info"), width=160)
    return 0


def analyze_hf(spec: str, args: list[str], started: float) -> int:
    run = _config("analyze", args)
    cfg = run.analysis
    for warning in unread_analysis_settings(args, cfg, pretrained=True):
        console.print(f"warning: {warning}")
    device = _device(run)
    pre = load(spec, device)
    chosen = parse_head_mask(",".join(cfg.heatmaps), pre.heads)  # early errors
    texts = _texts(run, args, cfg.split) if not cfg.treebank else None
    src = hf_analysis.source(pre, cfg, texts, run.data.cleaning.normalize)
    result, sentences = hf_analysis.analyze(pre, cfg, src, device)
    check_sentences(cfg.sentences, len(sentences))
    out = _out(pre, "analysis", args)
    result.update({"checkpoint": f"hf:{pre.name}", "overrides": args})
    publish(result, sentences, cfg, chosen, pre.tokens, out, f"hf:{pre.name}", started,
            f"model: hf:{pre.name} ({pre.family.name}); not measured: "
            + "; ".join(f"{k}: {v}" for k, v in result["not_measured"].items()))
    return 0


def prune_hf(spec: str, args: list[str]) -> int:

    args = [f"prune.{a}" if a.startswith("method=") else a for a in args]  # as prune <run> takes
    run = _config("prune", args)
    p = run.prune
    if p.method.value != "importance":
        raise ConfigError("prune hf:... runs method=importance (Michel et al.); Hard Concrete "
                          "gates need fine-tuning, which heads-lab does for its own models only")
    for warning in unread_prune_settings(args, "prune hf", p):
        console.print(f"warning: {warning}")
    device = _device(run)
    pre = load(spec, device)
    imp = _texts(run, args, p.split)
    ev = _texts(run, args, p.eval_split)
    if imp is None or ev is None:
        raise ConfigError("prune hf:... needs a data set to measure on: data=multi30k (a "
                          "translator: its source and reference; an encoder: data.src=en for "
                          "English text)")
    n = p.eval_sentences
    imp_src, imp_tgt = _encoded(pre, imp, n)
    ev_src, ev_tgt = _encoded(pre, ev, n)
    refs = ev[1][:len(ev_src)] if pre.family.seq2seq and ev[1] is not None else None
    out = _out(pre, "prune", args)
    curves = hf_prune.curves(pre, (imp_src, imp_tgt), (ev_src, ev_tgt, refs), list(p.sites),
                             p.step, run.eval.beam, device, say=console.print)
    table = _curve_table(pre, curves)
    write_markdown(out / "prune.md", {**table, "note": "heads masked (outputs zeroed), not "
                                      f"removed; {p.eval_split}: first {len(ev_src)} sentences"})
    write_csv(out / "prune.csv", table)
    left = ("bleu", f"{p.eval_split} BLEU") if pre.family.seq2seq else (
        "accuracy", f"{p.eval_split} masked-LM accuracy")
    png = plot_curves(curves, out / "prune_importance.png", p.eval_split, left=left)
    write_json(out / "prune.json", {"method": "importance", "model": f"hf:{pre.name}",
                                    "family": pre.family.name, "eval_split": p.eval_split,
                                    "curves": curves, "overrides": args,
                                    "files": ["prune.md", "prune.csv", png.name]})
    show(to_rich(table, f"importance pruning of hf:{pre.name} (Michel et al. 2019)"), width=160)
    console.print(f"prune: {out / 'prune.json'}, {out / 'prune.md'}, {png}")
    return 0


def _encoded(pre: Pretrained, texts: tuple, n: int | None) -> tuple[list, list | None]:
    src_text, tgt_text = texts
    n = len(src_text) if n is None else min(n, len(src_text))
    src = pre.tokens.encode(src_text[:n])
    tgt = (pre.tokens.encode_target(tgt_text[:n])
           if pre.family.seq2seq and tgt_text is not None else None)
    return src, tgt


def _curve_table(pre: Pretrained, curves: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    metrics = ["bleu", "chrf", "ppl"] if pre.family.seq2seq else ["accuracy", "loss", "ppl"]
    sites = list(next(iter(curves.values()))[0]["kept"])
    header = ["curve", "% masked", *[f"kept {s}" for s in sites], *metrics]
    rows = [[name, f"{100 * r['fraction']:.0f}", *[str(r["kept"][s]) for s in sites],
             *[f"{r[m]:.3f}" if m in ("accuracy", "loss") else f"{r[m]:.2f}" for m in metrics]]
            for name, rs in curves.items() for r in rs]
    return {"header": header, "rows": rows}
