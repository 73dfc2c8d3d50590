"""What `heads-lab analyze` writes and prints of an analysis, for heads-lab's own runs and for
pretrained models alike: the figures (metric grids, the function map, distances, the head map,
attention heatmaps), the interactive head view, analysis.json and the tables (analysis.md and the
console)."""

from __future__ import annotations

import time
from pathlib import Path

from heads_lab.config.sites import SITE
from heads_lab.errors import ConfigError
from heads_lab.model.heads import KIND_NAMES
from heads_lab.output import figures
from heads_lab.output.files import write_atomic, write_json
from heads_lab.output.tables import Table, markdown, to_rich, wide_console

LETTER = {"positional": "P", "syntactic": "S", "rare": "R", "other": "·"}


def publish(result: dict, sentences, cfg, chosen, tok, out: Path, what: str, started: float,
            said: str) -> None:
    """Everything `analyze` writes into `out` and prints: the figures, heatmaps and head view,
    analysis.json, the tables (analysis.md and the console); `said` is printed before the paths
    (which weights were analysed)."""
    pngs = _figures(result, out)
    pngs += _heatmaps(result, sentences, cfg.sentences, chosen, tok, out)
    first = sentences[cfg.sentences[0]] if cfg.sentences else sentences[0]
    html = _head_views(result, first, tok, out)
    result["files"] = ["analysis.md"] + [p.name for p in pngs + html]
    result["seconds"] = time.perf_counter() - started
    write_json(out / "analysis.json", result)
    parts = tables(result)
    write_tables(out / "analysis.md", parts, f"heads-lab analyze {what} "
                 f"({result['source']}, {result['sentences']:,} sentences)")
    console = wide_console(160)
    for part in parts:
        console.print(part if isinstance(part, str) else to_rich(part[1], part[0]))
    console.print(said)
    console.print(f"analysis: {out / 'analysis.json'}, {out / 'analysis.md'}")
    console.print(f"figures: {', '.join(p.name for p in pngs)}")
    console.print(f"head view: {', '.join(str(p) for p in html)}")


def _figures(result: dict, out: Path) -> list[Path]:
    """The per-head figures: metric grids, the function map, distances and the head map."""
    titles = {site: panel_title(site, kinds, result["map_kind"][site])
              for site, kinds in result["head_kinds"].items()}
    pngs = figures.metric_grids(result["grids"], out, _grid_titles(result))
    offsets = {site: [[None] * len(row) for row in rows]
               for site, rows in result["functions"].items()}
    for h in result["heads"]:
        if h.get("positional"):
            offsets[h["site"]][h["layer"]][h["head"]] = h["positional"]["offset"]
    pngs.append(figures.function_map(result["functions"], out, offsets, titles))
    pngs += figures.distance_matrices(result["distances"], result["diversity"], out, titles)
    pngs.append(figures.head_map(result["head_map"], {site: len(v) for site, v in
                                                      result["diversity"].items()}, out, titles))
    return pngs


def _heatmaps(result: dict, sentences, chosen_sentences, chosen, tok, out: Path) -> list[Path]:
    """analysis.heatmaps: one attention map per chosen head and sentence."""
    pngs = []
    for i in chosen_sentences:
        sent = sentences[i]
        src, tgt = token_labels(sent, tok)
        tokens = {"src": src, "tgt": tgt}
        axes = {name: (tokens[s.query], tokens[s.key]) for name, s in SITE.items()}
        for (site, layer), heads in chosen.items():
            if site not in sent.maps:
                continue  # a treebank without translations: the encoder alone
            kind = result["map_kind"][site]
            name = "head" if kind == "head" else f"{kind} head"
            for head in heads:
                q, k = axes[site]
                pngs.append(figures.attention_heatmap(
                    sent.maps[site][layer, head], q, k,
                    f"{site} layer {layer} {name} {head} · sentence {i}",
                    out / f"attention_s{i}_{site}_l{layer}_{FILE_KIND[kind]}{head}.png"))
    return pngs


def token_labels(sent, tok) -> tuple[list[str], list[str]]:
    """A sentence's source and target tokens as the figures and head view label them. A
    pretrained model's (its tokenizer is `pretrained`) are its own pieces, special ones included
    as it has them ([CLS] ... [SEP]; Marian's </s> and decoder start; a language model's BOS);
    an encoder or a language model has no target. heads-lab's own: the pieces, the source's end
    </s> and the target's start <s>."""
    if getattr(tok, "pretrained", False):
        return tok.pieces(sent.src), tok.pieces(sent.tgt_in) if len(sent.tgt_in) else []
    return tok.pieces(sent.src[:-1]) + ["</s>"], ["<s>"] + tok.pieces(sent.tgt_in[1:])


def _head_views(result: dict, first, tok, out: Path) -> list[Path]:
    """The interactive head view of the first chosen sentence (and bertviz's, where installed)."""
    src, tgt = token_labels(first, tok)
    talking = [s for s, k in result["map_kind"].items() if k != "head"]
    view_title = "heads-lab head view" + (f" ({', '.join(talking)}: talking heads, the maps of "
                                          f"the {KIND_NAMES['softmax']})" if talking else "")
    html = [figures.head_view_html(first.maps, src, tgt, out / "head_view.html", view_title,
                                   head_notes(result))]
    extra = figures.bertviz_head_view(first.maps, src, tgt, out / "bertviz_head_view.html")
    if extra:
        html.append(extra)
    return html


def head_notes(result: dict) -> dict[str, list[list[str]]]:
    """Per site, [layer][head] the head view's tooltip: role, confidence, importance and LRP of
    the maps' heads (LRP only where they are the heads the output projection reads)."""
    notes: dict[str, list[list[str]]] = {}
    for h in result["heads"]:
        if "function" not in h:
            continue  # talking heads' query/key and value heads have no map
        rows = notes.setdefault(h["site"], [])
        while len(rows) <= h["layer"]:
            rows.append([])
        text = (f"{h['function']}, confidence {h['confidence']:.2f}, importance "
                f"{_num(h['importance'])}" + (f", LRP {_num(h['lrp'])}" if "lrp" in h else ""))
        rows[h["layer"]].append(text)
    return notes


def check_sentences(chosen: list[int], count: int) -> None:
    bad = [i for i in chosen if not 0 <= i < count]
    if bad:
        raise ConfigError(f"analysis.sentences has {bad[0]}: choose sentence numbers below "
                          f"{count} (the sentences analysed; analysis.max_sentences)")


FILE_KIND = {"head": "h", "softmax": "softmax-h", "qk": "qk-h", "value": "value-h"}


def panel_title(site: str, kinds: dict[str, int], kind: str) -> str:
    """A site's panel title naming the heads it shows: "enc-self" for multi-head attention,
    "enc-self · softmax heads (h = 16)" for talking heads."""
    if kind == "head":
        return site
    name, symbol = {"qk": ("query/key", "h_K"), "softmax": ("softmax", "h"),
                    "value": ("value", "h_V")}[kind]
    return f"{site} · {name} heads ({symbol} = {kinds[kind]})"


def _grid_titles(result: dict) -> dict[str, dict[str, str]]:
    return {metric: {site: panel_title(site, result["head_kinds"][site], kind)
                     for site, kind in by_site.items()}
            for metric, by_site in result["grid_kinds"].items()}


def tables(result: dict) -> list[tuple[str, Table] | str]:
    """(title, table) per site: one row per layer, each head as role letter + confidence +
    importance + LRP relevance (of the same heads: the maps' kind); for talking heads also the
    importance of the query/key and value heads and the value heads' LRP; the rank correlation
    of LRP and importance; the positions, distances, role counts and syntactic relations. A str
    is a note."""
    out: list[tuple[str, Table] | str] = []
    grid = result["grids"]
    for site, layers in result["functions"].items():
        kind = result["map_kind"][site]
        heads = "heads" if kind == "head" else f"{kind} heads (h = {len(layers[0])})"
        lrp = grid.get("lrp", {}).get(site)
        rows = [[str(layer), *(f"{LETTER[fn]} {grid['confidence'][site][layer][h]:.2f} "
                               f"{_num(grid['importance'][site][layer][h])}"
                               + (f" {_num(lrp[layer][h] if lrp else None)}" if kind == "head"
                                  else "")
                               for h, fn in enumerate(labels)),
                 f"{result['diversity'][site][layer]:.2f}"] for layer, labels in enumerate(layers)]
        out.append((f"{site} {heads}: role (P positional, S syntactic, R rare) · confidence · "
                    f"importance{' · LRP' if kind == 'head' else ''}",
                    {"header": ["layer", *_head_columns(len(layers[0])), "diversity"],
                     "rows": rows}))
        for other in result["head_kinds"][site]:
            scores = grid.get(f"importance_{other}", {}).get(site)
            if other == kind or scores is None:
                continue
            relevance = grid.get(f"lrp_{other}", {}).get(site)
            title = (f"{panel_title(site, result['head_kinds'][site], other)}: importance"
                     + (" · LRP" if relevance else "")
                     + (" (what gates, masks and removal act on)" if other == "value" else ""))
            out.append((title, {"header": ["layer", *_head_columns(len(scores[0]))],
                                "rows": [[str(layer), *(_num(v) + (f" {_num(relevance[layer][h])}"
                                                                   if relevance else "")
                                                        for h, v in enumerate(row))]
                                         for layer, row in enumerate(scores)]}))
    if not any(v is not None for key, by_site in grid.items() if key.startswith("lrp")
               for rows in by_site.values() for row in rows for v in row):
        reason = (result.get("not_measured") or {}).get("lrp")  # e.g. a pretrained model's
        out.append(f"LRP: {reason} (–)" if reason else
                   "LRP: not measured (–): its seeds are the decoder's predictions, so it needs "
                   "target sentences (analysis.treebank_ref=... for a treebank), and "
                   "analysis.lrp=true")
    for name, reason in (result.get("not_measured") or {}).items():
        if name != "lrp":
            out.append(f"{name}: not measured: {reason}")
    rho = result.get("lrp_vs_importance") or {}
    if rho:
        out.append(f"LRP (on the first {result.get('lrp_sentences', 0):,} sentences, "
                   "analysis.lrp_sentences) vs importance, Spearman's rank correlation over each "
                   "site's heads: " + ", ".join(f"{site} {_num(v)}" for site, v in rho.items()))
    if not any(v is not None for rows in grid["importance"].values() for row in rows
               for v in row):
        out.append("importance: not measured (–): it is the loss's gradient, so it needs target "
                   "sentences, and this treebank was read without its translations; add "
                   "analysis.treebank_ref=<the comment key holding them, e.g. text_en>")
    out += role_tables(result)
    out += position_tables(result)
    out.append(distance_table(result))
    roles = ("positional", "syntactic", "rare", "other")
    out.append(("head roles per attention type", {
        "header": ["site", *roles],
        "rows": [[site, *(str(counts.get(k, 0)) for k in roles)]
                 for site, counts in result["counts"].items()]}))
    return out + syntax_tables(result)


ROLES = ("previous_token", "duplicate_token", "induction", "sink")


def role_tables(result: dict) -> list[tuple[str, Table] | str]:
    """Per language-model site, each head's previous-token, duplicate-token and induction scores
    on repeated random tokens and its attention-sink α₀ on the analysed text (analysis/roles.py),
    a mark where a score passes its bar; and the sink's largest α past the first token."""
    grid, out = result["grids"], []
    for site in result["functions"]:
        if any(grid.get(r, {}).get(site) is None or grid[r][site][0][0] is None for r in ROLES):
            continue
        layers = grid["previous_token"][site]
        sinks = {(h["layer"], h["head"]): h["sink_max"] for h in result["heads"]
                 if h["site"] == site and "sink_max" in h}
        rows = [[str(layer), *(" ".join(_num(grid[r][site][layer][h]) + _mark(r, grid[r][site][
                    layer][h]) for r in ROLES) for h in range(len(row)))]
                for layer, row in enumerate(layers)]
        out.append((f"{site} roles: previous-token · duplicate-token · induction (on "
                    f"{result.get('roles', {}).get('sequences', '?')} repeated random sequences; * > "
                    f"{ROLE_MARK:.1f}) · sink α₀ (* > {SINK_MARK:.1f}, Gu et al.)",
                    {"header": ["layer", *_head_columns(len(layers[0]))], "rows": rows}))
        top = max(sinks.items(), key=lambda kv: -1 if kv[1]["alpha"] is None else kv[1]["alpha"],
                  default=None)
        if top:
            (layer, head), best = top
            out.append(f"{site}: the largest sink past the first token: L{layer} H{head}, "
                       f"α = {_num(best['alpha'])} at position {best['position']} (most often "
                       f"{best['token']!r})")
    return out


ROLE_MARK, SINK_MARK = 0.5, 0.3


def _mark(role: str, value) -> str:
    bar = SINK_MARK if role == "sink" else ROLE_MARK
    return "*" if value is not None and value > bar else ""


def position_tables(result: dict) -> list[tuple[str, Table]]:
    """Per self-attention site, each head's most common offset k ≠ 0 with its share, and apart
    from it the share of queries whose maximum is their own token (offset 0, not a position)."""
    out = []
    cells: dict[str, dict[int, dict[int, str]]] = {}
    for h in result["heads"]:
        p = h.get("positional")
        if p:
            mark = "P" if p["is_positional"] else ""
            # a head whose maximum is always its own token has no offset ≠ 0 at all: "–"
            where = f"{p['offset']:+d} {p['share']:.2f}{mark}" if p["offset"] else "–"
            cells.setdefault(h["site"], {}).setdefault(h["layer"], {})[h["head"]] = (
                f"{where} · self {p['self_share']:.2f}")
    for site, layers in cells.items():
        n = max(len(row) for row in layers.values())
        out.append((f"{site} positions: most common offset ≠ 0 and its share (P ≥ "
                    f"{result['thresholds']['positional']:.2f}) · share at the query's own token",
                    {"header": ["layer", *_head_columns(n)],
                     "rows": [[str(layer), *(row[h] for h in sorted(row))]
                              for layer, row in sorted(layers.items())]}))
    return out


def distance_table(result: dict) -> tuple[str, Table]:
    """Per site and layer: mean ± std of the JS distance between the layer's own heads, and the
    mean distance to the other layers' heads (Clark et al.: do deeper layers' heads differ
    less?)."""
    rows = [[site, str(layer), f"{v['mean']:.3f} ± {v['std']:.3f}",
             _num(v["to_other_layers"], ".3f")]
            for site, layers in result["within_layer"].items() for layer, v in enumerate(layers)]
    return ("distance between heads (Jensen–Shannon per query, nats; head_map.png)",
            {"header": ["site", "layer", "within the layer", "to other layers"], "rows": rows})


def _head_columns(count: int) -> list[str]:
    return [f"h{head}" for head in range(count)]


def syntax_tables(result: dict) -> list[tuple[str, Table] | str]:
    """The syntactic relations: arcs, offset baseline, best encoder head and its accuracy, and
    the sentences matched (or why syntactic heads were not measured)."""
    syntax = result["syntax"]
    if syntax["source"] is None:
        return ["syntactic heads: not measured, this split has no dependency arcs (real data: "
                "analysis.treebank=<a CoNLL-U treebank of the source language>, or "
                "analysis.conllu=<a CoNLL-U parse of the split's source sentences>)"]
    site = syntax.get("site") or "enc-self"
    kind = result["map_kind"].get(site, "head")
    heads = "head" if kind == "head" else f"{kind} head"
    margin = result["thresholds"]["syntactic_margin"]
    earlier = (", arcs to earlier words only (causal)"
               if syntax.get("arcs_counted", "all") != "all" else "")
    title = (f"syntactic heads ({site}, {syntax['source']}, word level{earlier}): best {heads} "
             f"per relation vs the most-frequent-word-offset baseline (* ≥ {margin:.2f} "
             f"above it with ≥ {result['thresholds']['min_arcs']} arcs)")
    rows = []
    for rel, info in syntax["relations"].items():
        best = info["best"]
        mark = "*" if info["heads_above_margin"] else ""
        rows.append([rel, f"{info['arcs']:,}", f"{info['baseline']:.2f}",
                     f"L{best['layer']} H{best['head']}", f"{best['accuracy']:.2f}",
                     f"{best['gain']:+.2f}{mark}", str(info["heads_above_margin"])])
    syn = {"header": ["relation", "arcs", "baseline", f"best {heads}", "accuracy", "gain",
                      "heads above"], "rows": rows}
    matched = (f"sentences matched to their trees: {syntax['matched']:,} of "
               f"{syntax['sentences']:,} ({100 * syntax['matched_share']:.1f} %)"
               if syntax.get("sentences") else "")
    if syntax.get("unmatched"):
        first = syntax["unmatched"][0]
        matched += (f"; unmatched listed in analysis.json (first: #{first['index']}"
                    f"{' ' + first['sent_id'] if first.get('sent_id') else ''}, {first['reason']})")
    return [(title, syn), matched] if matched else [(title, syn)]


def write_tables(path: Path, parts: list[tuple[str, Table] | str], heading: str) -> Path:
    """The tables printed on the console, as Markdown (analysis.md)."""
    lines = [f"# {heading}", ""]
    for part in parts:
        if isinstance(part, str):
            lines += [part, ""]
        else:
            lines += [f"## {part[0]}", "", *markdown(part[1]), ""]
    return write_atomic(path, "\n".join(lines))


def _num(v, fmt: str = ".2f") -> str:
    return "–" if v is None or v != v else format(v, fmt)
