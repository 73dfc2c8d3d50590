"""`heads-lab analyze <run dir> [analysis.KEY=VALUE ...]`: what each head of a trained run does.

For every head (layer × enc-self / dec-self / dec-enc × head), on analysis.split: confidence,
positional / syntactic / rare-word roles (Voita et al. 2019), importance (Michel et al. 2019)
and the Jensen–Shannon distance between heads (Clark et al. 2019); see heads_lab/analysis.py
for the exact definitions. Writes <run dir>/analysis/<time>_<overrides>/: analysis.json, rich
tables on the console, heads_<metric>.png grids, head_functions.png (the head-function map),
head_distance.png and head_diversity.png, heatmaps of analysis.heatmaps heads on
analysis.sentences, and head_view.html (every layer and head of one sentence; with the bertviz
extra installed also bertviz_head_view.html).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from heads_lab.errors import ConfigError

log = logging.getLogger(__name__)
USAGE = "heads-lab analyze <run dir> [analysis.KEY=VALUE ...] [data.root=DIR] [trainer.device=...]"
ALLOWED = ("analysis.", "data.root=", "trainer.device=", "trainer.threads=", "trainer.max_tokens=",
           "paths.")
LETTER = {"positional": "P", "syntactic": "S", "rare": "R", "other": "·"}


def main(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(f"usage: {USAGE}\n\n{__doc__}")
        return 0 if args else 2
    from heads_lab import figures
    from heads_lab.analysis import analyze
    from heads_lab.eval_run import _safe, load_trained
    from heads_lab.heads import attention_modules, parse_head_mask
    from heads_lab.tracking import console, write_json

    started = time.perf_counter()
    run_dir, overrides = Path(args[0]), args[1:]
    run, config, model, corpus, device, path = load_trained(run_dir, overrides, ALLOWED, USAGE)
    cfg = run.analysis
    chosen = parse_head_mask(",".join(cfg.heatmaps), attention_modules(model))  # early errors
    split = corpus.splits[cfg.split]
    bad = [i for i in cfg.sentences if not 0 <= i < min(len(split), cfg.max_sentences)]
    if bad:
        raise ConfigError(f"analysis.sentences has {bad[0]}: choose sentence numbers below "
                          f"{min(len(split), cfg.max_sentences)} (analysis.max_sentences)")
    label = ",".join(overrides) or "defaults"
    out = run_dir / "analysis" / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{_safe(label)}"
    out.mkdir(parents=True, exist_ok=False)

    result, sentences = analyze(model, corpus, cfg, device, run.trainer.max_tokens)
    result.update({"run_dir": str(run_dir), "checkpoint": path.name, "overrides": overrides})
    pngs = figures.metric_grids(result["grids"], out)
    offsets = {site: [[None] * len(row) for row in rows]
               for site, rows in result["functions"].items()}
    for h in result["heads"]:
        if h["positional"]:
            offsets[h["site"]][h["layer"]][h["head"]] = h["positional"]["offset"]
    pngs.append(figures.function_map(result["functions"], out, offsets))
    pngs += figures.distance_matrices(result["distances"], result["diversity"], out)
    tok = corpus.tokenizer
    for i in cfg.sentences:
        sent = sentences[i]
        src, tgt = tok.pieces(sent.src[:-1]) + ["</s>"], ["<s>"] + tok.pieces(sent.tgt_in[1:])
        axes = {"enc-self": (src, src), "dec-self": (tgt, tgt), "dec-enc": (tgt, src)}
        for (site, layer), heads in chosen.items():
            for head in heads:
                q, k = axes[site]
                pngs.append(figures.attention_heatmap(
                    sent.maps[site][layer, head], q, k,
                    f"{site} layer {layer} head {head} · sentence {i}",
                    out / f"attention_s{i}_{site}_l{layer}_h{head}.png"))
    first = sentences[cfg.sentences[0]] if cfg.sentences else sentences[0]
    src = tok.pieces(first.src[:-1]) + ["</s>"]
    tgt = ["<s>"] + tok.pieces(first.tgt_in[1:])
    html = [figures.head_view_html(first.maps, src, tgt, out / "head_view.html")]
    extra = figures.bertviz_head_view(first.maps, src, tgt, out / "bertviz_head_view.html")
    if extra:
        html.append(extra)
    result["files"] = [p.name for p in pngs + html]
    result["seconds"] = time.perf_counter() - started
    write_json(out / "analysis.json", result)
    for table in tables(result):
        console.print(table)
    console.print(f"analysis: {out / 'analysis.json'}")
    console.print(f"figures: {', '.join(p.name for p in pngs)}")
    console.print(f"head view: {', '.join(str(p) for p in html)}")
    return 0


def tables(result: dict) -> list:
    """Per site: one row per layer, each head as role letter + confidence + importance; and the
    role counts."""
    from rich.table import Table

    out = []
    for site, layers in result["functions"].items():
        grid = result["grids"]
        table = Table(title=f"{site} heads: role (P positional, S syntactic, R rare) · "
                            "confidence · importance", title_justify="left")
        table.add_column("layer")
        for head in range(len(layers[0])):
            table.add_column(f"h{head}", justify="right")
        table.add_column("diversity", justify="right")
        for layer, labels in enumerate(layers):
            cells = [f"{LETTER[fn]} {grid['confidence'][site][layer][h]:.2f} "
                     f"{grid['importance'][site][layer][h]:.2f}" for h, fn in enumerate(labels)]
            table.add_row(str(layer), *cells, f"{result['diversity'][site][layer]:.2f}")
        out.append(table)
    summary = Table(title="head roles per attention type", title_justify="left")
    for col in ("site", "positional", "syntactic", "rare", "other"):
        summary.add_column(col, justify="left" if col == "site" else "right")
    for site, counts in result["counts"].items():
        summary.add_row(site, *(str(counts.get(k, 0)) for k in
                                ("positional", "syntactic", "rare", "other")))
    out.append(summary)
    if result["syntax"]["source"] is None:
        out.append("syntactic heads: not measured, this split has no dependency arcs (real data: "
                   "analysis.conllu=<a CoNLL-U parse of the split's source sentences>)")
        return out
    syn = Table(title="syntactic heads (enc-self): best head per relation vs the offset baseline",
                title_justify="left")
    for col in ("relation", "arcs", "baseline", "best head", "accuracy"):
        syn.add_column(col, justify="left" if col in ("relation", "best head") else "right")
    heads = [h for h in result["heads"] if h["site"] == "enc-self" and h["syntactic"]]
    for rel, info in result["syntax"]["relations"].items():
        best = max(heads, key=lambda h: h["syntactic"][rel]["accuracy"], default=None)
        if best:
            syn.add_row(rel, str(info["arcs"]), f"{info['baseline']:.2f}",
                        f"layer {best['layer']} head {best['head']}",
                        f"{best['syntactic'][rel]['accuracy']:.2f}")
    out.append(syn)
    return out
