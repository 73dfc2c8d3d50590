"""The figures of `heads-lab analyze`: per-head metric grids, head roles, distances between heads,
attention heatmaps and an interactive head view (Voita et al. 2019; Clark et al. 2019).

Every PNG function returns the paths it wrote (creating the folder), closes its figures and
draws the attention sites in the fixed order enc-self, dec-self, dec-enc, skipping the sites
absent from its input. Layers and heads are numbered from 0, as in head specs (enc:0:3) and
analysis.json.
Written files: heads_<metric>.png, head_functions.png, head_distance.png, head_diversity.png,
the heatmap and head-view paths the caller names. head_view_html writes one self-contained HTML
file (inline CSS and JavaScript, the data as JSON in a <script id="heads-lab-data"> block);
bertviz_head_view writes BertViz's own view when the optional bertviz package is installed.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heads_lab.schemas import ATTENTION_SITES

FUNCTIONS = ("positional", "syntactic", "rare", "other")
FUNCTION_COLOURS = {"positional": "#4c72b0", "syntactic": "#55a868", "rare": "#c44e52",
                    "other": "#e6e6e6"}
FUNCTION_LETTERS = {"positional": "P", "syntactic": "S", "rare": "R", "other": ""}
SITE_COLOURS = {"enc-self": "C0", "dec-self": "C1", "dec-enc": "C2"}
SITE_SIDES = {"enc-self": ("src", "src"), "dec-self": ("tgt", "tgt"), "dec-enc": ("tgt", "src")}
SITE_LABELS = {"enc-self": "enc-self: source → source", "dec-self": "dec-self: target → target",
               "dec-enc": "dec-enc: target → source"}
MISSING_COLOUR = "#d0d0d0"
ANNOTATE_HEADS = 16  # cell values written in metric grids and function maps up to this many heads
ANNOTATE_DISTANCE_HEADS = 8  # head×head matrices hold heads² cells: values only when small
DATA_ID = "heads-lab-data"  # id of the JSON block in head_view_html's page


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _sites(data: Mapping[str, Any]) -> list[str]:
    """The sites of `data` in the fixed order, empty ones skipped; unknown names refused."""
    unknown = [s for s in data if s not in ATTENTION_SITES]
    if unknown:
        raise ValueError(f"unknown attention sites {unknown}: choose from {list(ATTENTION_SITES)}")
    return [s for s in ATTENTION_SITES if s in data and len(data[s]) > 0]


def _text(s: str) -> str:
    """A string matplotlib draws as written (no mathtext between $ signs)."""
    return s.replace("$", r"\$")


def _save(fig, path: Path) -> Path:
    plt = _pyplot()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    return path


def _grid(site: str, rows: Sequence[Sequence[Any]], what: str) -> np.ndarray:
    """[layer][head] lists as a float array (None → NaN); every layer must have the same heads."""
    counts = {len(r) for r in rows}
    if len(counts) != 1 or 0 in counts:
        raise ValueError(f"{what}: site {site} has layers with {sorted(counts)} heads; every layer "
                         "needs the same number of heads (at least one)")
    return np.array([[math.nan if v is None else float(v) for v in r] for r in rows], dtype=float)


def _ticks(ax, n: int, axis: str, label: str) -> None:
    """0-based tick labels, as in head specs like enc:0:3 (every k-th when many), and a label."""
    step = 1 if n <= 16 else math.ceil(n / 16)
    pos = list(range(0, n, step))
    labels = [str(p) for p in pos]
    if axis == "x":
        ax.set_xticks(pos, labels)
        ax.set_xlabel(label)
    else:
        ax.set_yticks(pos, labels)
        ax.set_ylabel(label)
    ax.tick_params(length=0, labelsize=8)


def _ink(rgba) -> str:
    """Black or white text, whichever reads on the cell colour."""
    r, g, b = rgba[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def _annotate(ax, values: np.ndarray, cmap, norm, fmt: str, size: float) -> None:
    for (i, j), v in np.ndenumerate(values):
        if math.isnan(v):
            ax.text(j, i, "–", ha="center", va="center", fontsize=size, color="#555555")
        else:
            ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=size,
                    color=_ink(cmap(norm(v))))


def _limits(values: list[np.ndarray]) -> tuple[float, float, bool]:
    """A shared colour range over the finite values; diverging (centred on 0) with both signs."""
    finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.array([])
    if finite.size == 0:
        return 0.0, 1.0, False
    lo, hi = float(finite.min()), float(finite.max())
    if lo < 0 < hi:
        edge = max(-lo, hi)
        return -edge, edge, True
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    return lo, hi, False


def _layer_head_panels(plt, sites: list[str], arrays: list[np.ndarray], cell: tuple[float, float],
                       pad: tuple[float, float], titles: Mapping[str, str] | None = None):
    """A figure with one titled layer×head panel per site, sized by the heads and layers: cell
    is (inches per cell, its floor when there are too many heads to annotate), pad the extra
    (width, height) in inches; `titles` (site → title) name the heads' kind where a site has
    more than one (talking heads). Returns (figure, the row of axes)."""
    heads = [a.shape[1] for a in arrays]
    size = cell[0] if max(heads) <= ANNOTATE_HEADS else max(cell[1], 8 / max(heads))
    layers = max(a.shape[0] for a in arrays)
    fig, axes = plt.subplots(
        1, len(sites), squeeze=False, layout="constrained", gridspec_kw={"width_ratios": heads},
        figsize=(max(5.0, sum(heads) * size + 1.1 * len(sites) + pad[0]), layers * size + pad[1]))
    for ax, site, a in zip(axes[0], sites, arrays):
        ax.set_title(_text((titles or {}).get(site, site)), fontsize=10)
        _ticks(ax, a.shape[1], "x", "head")
        _ticks(ax, a.shape[0], "y", "layer")
    return fig, axes[0]


def metric_grids(grids: Mapping[str, Mapping[str, Sequence[Sequence[float | None]]]],
                 out_dir: Path, titles: Mapping[str, Mapping[str, str]] | None = None
                 ) -> list[Path]:
    """heads_<metric>.png per metric: one layer×head heatmap per site, one colour scale per
    metric, grey cells where nothing was measured (None or NaN); `titles` (metric → site →
    panel title) say which heads a panel shows."""
    import matplotlib.colors as mcolors
    from matplotlib import colormaps

    plt = _pyplot()
    out_dir = Path(out_dir)
    paths = []
    for metric, by_site in grids.items():
        sites = _sites(by_site)
        if not sites:
            continue
        arrays = [_grid(s, by_site[s], metric) for s in sites]
        lo, hi, diverging = _limits(arrays)
        cmap = colormaps["RdBu_r" if diverging else "viridis"].with_extremes(bad=MISSING_COLOUR)
        norm = mcolors.Normalize(lo, hi)
        fig, axes = _layer_head_panels(plt, sites, arrays, (0.5, 0.12), (1.4, 1.8),
                                       (titles or {}).get(metric))
        for ax, values in zip(axes, arrays):
            image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=norm, aspect="equal")
            if values.shape[1] <= ANNOTATE_HEADS:
                _annotate(ax, values, cmap, norm, ".2f", 7 if values.shape[1] <= 8 else 6)
        fig.colorbar(image, ax=list(axes), shrink=0.9, label=_text(metric.replace("_", " ")))
        note = "; grey: not measured" if any(np.isnan(a).any() for a in arrays) else ""
        fig.suptitle(_text(f"{metric.replace('_', ' ')} per head{note}"))
        paths.append(_save(fig, out_dir / f"heads_{metric}.png"))
    return paths


def function_label(function: str, offset: int | None = None) -> str:
    """A cell's text in the function map: the role's letter, and a positional head's offset
    ("P−1", "P0", "P+1")."""
    letter = FUNCTION_LETTERS[function]
    if function != "positional" or offset is None:
        return letter
    return f"{letter}{'+' if offset > 0 else '−' if offset < 0 else ''}{abs(offset)}"


def function_map(functions: Mapping[str, Sequence[Sequence[str]]], out_dir: Path,
                 offsets: Mapping[str, Sequence[Sequence[int | None]]] | None = None,
                 titles: Mapping[str, str] | None = None) -> Path:
    """head_functions.png: each head's role (positional, syntactic, rare, other) as a colour and a
    letter, one layer×head panel per site, as in Voita et al.'s figures; with `offsets`
    (site → layer × head), positional heads also show their relative offset; `titles` (site →
    panel title) name the heads' kind."""
    import matplotlib.colors as mcolors
    from matplotlib.patches import Patch

    plt = _pyplot()
    sites = _sites(functions)
    if not sites:
        raise ValueError("function_map: no attention site to draw")
    codes = []
    for site in sites:
        rows = functions[site]
        bad = sorted({f for r in rows for f in r if f not in FUNCTIONS})
        if bad:
            raise ValueError(f"function_map: site {site} has labels {bad}: choose from "
                             f"{list(FUNCTIONS)}")
        codes.append(_grid(site, [[FUNCTIONS.index(f) for f in r] for r in rows], "functions"))
    cmap = mcolors.ListedColormap([FUNCTION_COLOURS[f] for f in FUNCTIONS])
    norm = mcolors.BoundaryNorm(np.arange(len(FUNCTIONS) + 1) - 0.5, len(FUNCTIONS))
    fig, axes = _layer_head_panels(plt, sites, codes, (0.45, 0.15), (0.5, 2.2), titles)
    for ax, code, site in zip(axes, codes, sites):
        ax.imshow(code, cmap=cmap, norm=norm, aspect="equal")
        size = 9 if code.shape[1] <= 8 else 7 if code.shape[1] <= ANNOTATE_HEADS else 5
        site_offsets = (offsets or {}).get(site)
        for (i, j), k in np.ndenumerate(code):
            f = FUNCTIONS[int(k)]
            label = function_label(f, site_offsets[i][j] if site_offsets else None)
            ax.text(j, i, label, ha="center", va="center", fontsize=size,
                    fontweight="bold", color=_ink(mcolors.to_rgba(FUNCTION_COLOURS[f])))
        ax.set_xticks(np.arange(code.shape[1] + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(code.shape[0] + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="white", linewidth=1)
        ax.tick_params(which="minor", length=0)
    handles = [Patch(facecolor=FUNCTION_COLOURS[f], edgecolor="#888888",
                     label=f"{FUNCTION_LETTERS[f]} {f}".strip()) for f in FUNCTIONS]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(FUNCTIONS), fontsize=8)
    fig.suptitle("head functions")
    return _save(fig, Path(out_dir) / "head_functions.png")


def distance_matrices(distances: Mapping[str, Sequence[Sequence[Sequence[float]]]],
                      diversity: Mapping[str, Sequence[float]], out_dir: Path,
                      titles: Mapping[str, str] | None = None) -> list[Path]:
    """head_distance.png (per site a row of per-layer head×head Jensen–Shannon distance matrices,
    one colour scale) and head_diversity.png (mean pairwise distance against layer, a line per
    site); a figure whose input has no site is not written. `titles` (site → name) name the
    heads' kind."""
    import matplotlib.colors as mcolors
    from matplotlib import colormaps

    plt = _pyplot()
    out_dir = Path(out_dir)
    paths = []
    sites = _sites(distances)
    if sites:
        mats = {}
        for site in sites:
            layers = [np.asarray(m, dtype=float) for m in distances[site]]
            for i, m in enumerate(layers):
                if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
                    raise ValueError(f"distances: site {site} layer {i} has shape {m.shape}; "
                                     "expected a square [heads, heads] matrix")
            mats[site] = layers
        _, hi, _ = _limits([m for layers in mats.values() for m in layers])
        norm = mcolors.Normalize(0.0, hi if hi > 0 else 1.0)
        cmap = colormaps["viridis"].with_extremes(bad=MISSING_COLOUR)
        cols = max(len(layers) for layers in mats.values())
        fig, axes = plt.subplots(len(sites), cols, squeeze=False, layout="constrained",
                                 figsize=(cols * 2.4 + 1.4, len(sites) * 2.5 + 0.8))
        for row, site in zip(axes, sites):
            for col, ax in enumerate(row):
                if col >= len(mats[site]):
                    ax.set_axis_off()
                    continue
                m = mats[site][col]
                image = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, norm=norm)
                ax.set_title(_text(f"{(titles or {}).get(site, site)} layer {col}"),
                             fontsize=9 if not titles or titles.get(site, site) == site else 7)
                _ticks(ax, m.shape[1], "x", "head")
                _ticks(ax, m.shape[0], "y", "head")
                if m.shape[0] <= ANNOTATE_DISTANCE_HEADS:
                    _annotate(ax, m, cmap, norm, ".2f", 6 if m.shape[0] <= 4 else 5)
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="Jensen–Shannon distance")
        fig.suptitle("distance between heads' attention, per layer")
        paths.append(_save(fig, out_dir / "head_distance.png"))
    sites = _sites(diversity)
    if sites:
        fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
        most, top = 0, 0.0
        for site in sites:
            values = [math.nan if v is None else float(v) for v in diversity[site]]
            most = max(most, len(values))
            top = max([top] + [v for v in values if math.isfinite(v)])
            ax.plot(range(len(values)), values, marker="o", color=SITE_COLOURS[site],
                    label=_text((titles or {}).get(site, site)))
        ax.set_xticks(range(most))
        ax.set_xlabel("layer")
        ax.set_ylabel("mean pairwise JS distance between heads")
        ax.set_ylim(0, top * 1.1 if top > 0 else 1.0)
        ax.set_title("head diversity per layer")
        ax.grid(alpha=0.3)
        ax.legend()
        paths.append(_save(fig, out_dir / "head_diversity.png"))
    return paths


def attention_heatmap(weights, query_tokens: Sequence[str], key_tokens: Sequence[str],
                      title: str, path: Path) -> Path:
    """One head's [query, key] attention as a heatmap: keys on x (rotated), queries on y."""
    plt = _pyplot()
    w = np.asarray(weights, dtype=float)
    n, m = len(query_tokens), len(key_tokens)
    if w.ndim != 2 or w.shape != (n, m):
        raise ValueError(f"attention_heatmap: weights have shape {w.shape} but there are {n} query "
                         f"and {m} key tokens: expected ({n}, {m})")
    if n == 0 or m == 0:
        raise ValueError("attention_heatmap: no tokens to draw")
    longest = max(n, m)
    cell = 0.3 if longest <= 40 else 12 / longest
    size = 8 if longest <= 40 else max(4.0, 320 / longest)
    fig, ax = plt.subplots(figsize=(max(4.0, m * cell + 2.8), max(3.0, n * cell + 2.2)),
                           layout="constrained")
    top = float(np.nanmax(w)) if np.isfinite(w).any() else 1.0
    image = ax.imshow(w, cmap="Blues", vmin=0.0, vmax=top if top > 0 else 1.0, aspect="equal")
    ax.set_xticks(range(m), [_text(t) for t in key_tokens], rotation=90, fontsize=size)
    ax.set_yticks(range(n), [_text(t) for t in query_tokens], fontsize=size)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.tick_params(length=0)
    ax.set_title(_text(title))
    fig.colorbar(image, ax=ax, shrink=0.8, label="attention weight")
    return _save(fig, Path(path))


def _attention_arrays(attention: Mapping[str, Any], src_tokens: Sequence[str],
                      tgt_tokens: Sequence[str]) -> dict[str, np.ndarray]:
    """The sites' [layers, heads, n_query, n_key] arrays, checked against the tokens."""
    tokens = {"src": list(src_tokens), "tgt": list(tgt_tokens)}
    arrays = {}
    for site in _sites(attention):
        a = np.asarray(attention[site], dtype=float)
        q, k = (tokens[side] for side in SITE_SIDES[site])
        expected = (len(q), len(k))
        if a.ndim != 4 or a.shape[2:] != expected or 0 in a.shape[:2]:
            raise ValueError(f"attention[{site!r}] has shape {a.shape}: expected [layers, heads, "
                             f"{expected[0]}, {expected[1]}] for {SITE_LABELS[site]} with "
                             f"{len(src_tokens)} source and {len(tgt_tokens)} target tokens")
        if not np.isfinite(a).all():
            raise ValueError(f"attention[{site!r}] has NaN or infinite weights")
        arrays[site] = a
    if not arrays:
        raise ValueError("no attention site to show")
    return arrays


def head_view_html(attention: Mapping[str, Any], src_tokens: Sequence[str],
                   tgt_tokens: Sequence[str], path: Path,
                   title: str = "heads-lab head view") -> Path:
    """One self-contained HTML page (no network) showing every layer and head of one sentence:
    site and layer menus, a coloured toggle per head, query tokens left and key tokens right
    joined by lines whose opacity is the weight; hovering a token keeps only its lines."""
    arrays = _attention_arrays(attention, src_tokens, tgt_tokens)
    tokens = {"src": [str(t) for t in src_tokens], "tgt": [str(t) for t in tgt_tokens]}
    data = {
        "title": title,
        "src_tokens": tokens["src"],
        "tgt_tokens": tokens["tgt"],
        "sites": [{"name": site, "label": SITE_LABELS[site],
                   "queries": tokens[SITE_SIDES[site][0]], "keys": tokens[SITE_SIDES[site][1]],
                   "weights": np.round(a, 6).tolist()} for site, a in arrays.items()],
    }
    # <, > and & as \u escapes: no token can close the block or start markup; JSON.parse and
    # json.loads read them back as the characters.
    blob = (json.dumps(data, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026"))
    fills = {"TITLE": html.escape(title), "DATA_ID": DATA_ID, "DATA": blob}
    page = re.sub(r"@(TITLE|DATA_ID|DATA)@", lambda m: fills[m.group(1)], _PAGE)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def bertviz_head_view(attention: Mapping[str, Any], src_tokens: Sequence[str],
                      tgt_tokens: Sequence[str], path: Path) -> Path | None:
    """BertViz's head view (Vig 2019) written to `path`, or None when bertviz is not installed.
    BertViz takes one layer range for all sites: with unequal depths the shallower one wins.
    Its page loads require.js and d3 from a CDN; head_view_html needs no network."""
    try:
        import bertviz
        import torch
    except ImportError:
        return None
    arrays = _attention_arrays(attention, src_tokens, tgt_tokens)

    def layers(site: str) -> list | None:
        if site not in arrays:
            return None
        return [torch.as_tensor(layer[None], dtype=torch.float32) for layer in arrays[site]]

    depth = min(a.shape[0] for a in arrays.values())
    view = bertviz.head_view(encoder_attention=layers("enc-self"),
                             decoder_attention=layers("dec-self"),
                             cross_attention=layers("dec-enc"),
                             encoder_tokens=list(src_tokens), decoder_tokens=list(tgt_tokens),
                             include_layers=list(range(depth)), html_action="return")
    body = getattr(view, "data", view)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('<!DOCTYPE html>\n<html><head><meta charset="utf-8"></head><body>\n'
                    f"{body}\n</body></html>\n", encoding="utf-8")
    return path


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>@TITLE@</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 0.6em; }
#controls { display: flex; flex-wrap: wrap; gap: 0.8em; align-items: center; user-select: none; }
#heads { display: inline-flex; flex-wrap: wrap; gap: 3px; }
.head { min-width: 26px; height: 22px; border: 2px solid transparent; border-radius: 4px;
        color: #fff; font-weight: bold; font-size: 11px; cursor: pointer; padding: 0 4px; }
.head.off { opacity: 0.2; }
.hint, #status { color: #666; font-size: 0.85em; margin: 0.5em 0; min-height: 1.2em; }
#view { display: flex; align-items: flex-start; margin-top: 0.8em; }
.col { display: flex; flex-direction: column; }
#queries { align-items: flex-end; }
#keys { align-items: flex-start; }
.col-title { font-size: 0.8em; color: #888; height: 20px; }
.tok { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 13px; white-space: pre;
       padding: 0 6px; border-radius: 3px; cursor: default; min-width: 1em; }
.tok.focus { background: #ffe08a; outline: 1px solid #d9a400; }
canvas { margin-top: 20px; }
.sentence { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px;
            color: #444; white-space: pre-wrap; }
</style>
</head>
<body>
<h1>@TITLE@</h1>
<div class="sentence" id="sentences"></div>
<div id="controls">
  <label>Attention <select id="site"></select></label>
  <label>Layer <select id="layer"></select></label>
  <span>Heads <span id="heads"></span></span>
  <button type="button" id="all">all heads</button>
  <button type="button" id="none">no heads</button>
</div>
<p class="hint">Line opacity is the attention weight, one colour per head. Click a head to show or
hide it, double-click to show it alone; hover a token to keep only its lines.</p>
<div id="view">
  <div class="col" id="queries"></div>
  <canvas id="lines"></canvas>
  <div class="col" id="keys"></div>
</div>
<p id="status"></p>
<script type="application/json" id="@DATA_ID@">@DATA@</script>
<script>
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("@DATA_ID@").textContent);
  var ROW = 22, GAP = 280, MIN_WEIGHT = 0.005;
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                 "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  var siteSel = document.getElementById("site"), layerSel = document.getElementById("layer");
  var headBox = document.getElementById("heads"), status = document.getElementById("status");
  var left = document.getElementById("queries"), right = document.getElementById("keys");
  var canvas = document.getElementById("lines"), ctx = canvas.getContext("2d");
  var state = {site: 0, layer: 0, heads: [], focus: null};
  var leftEls = [], rightEls = [];

  function colour(h, n) {
    return n <= PALETTE.length ? PALETTE[h] : "hsl(" + Math.round(360 * h / n) + ", 70%, 45%)";
  }
  function option(sel, value, text) {
    var o = document.createElement("option");
    o.value = String(value);
    o.textContent = text;
    sel.appendChild(o);
  }
  function column(el, title, list, side) {
    el.textContent = "";
    var head = document.createElement("div");
    head.className = "col-title";
    head.textContent = title;
    el.appendChild(head);
    return list.map(function (t, i) {
      var d = document.createElement("div");
      d.className = "tok";
      d.textContent = t === "" ? "\\u2205" : t;
      d.title = side + " " + (i + 1) + ": " + t;
      d.style.height = ROW + "px";
      d.style.lineHeight = ROW + "px";
      d.addEventListener("mouseenter", function () {
        state.focus = {side: side, index: i};
        draw();
      });
      d.addEventListener("mouseleave", function () { state.focus = null; draw(); });
      el.appendChild(d);
      return d;
    });
  }
  function headButton(h, n) {
    var b = document.createElement("button");
    b.type = "button";
    b.className = "head";
    b.textContent = String(h);
    b.style.background = colour(h, n);
    b.title = "head " + h + ": click to show or hide, double-click to show it alone";
    b.addEventListener("click", function () { state.heads[h] = !state.heads[h]; draw(); });
    b.addEventListener("dblclick", function () {
      state.heads = state.heads.map(function (_, k) { return k === h; });
      draw();
    });
    return b;
  }
  function buildSite() {
    var s = data.sites[state.site], l, h;
    layerSel.textContent = "";
    for (l = 0; l < s.weights.length; l++) option(layerSel, l, String(l));
    state.layer = Math.min(state.layer, s.weights.length - 1);
    layerSel.value = String(state.layer);
    var n = s.weights[0].length;
    state.heads = [];
    headBox.textContent = "";
    for (h = 0; h < n; h++) {
      state.heads.push(true);
      headBox.appendChild(headButton(h, n));
    }
    state.focus = null;
    leftEls = column(left, "query", s.queries, "query");
    rightEls = column(right, "key", s.keys, "key");
    var rows = Math.max(s.queries.length, s.keys.length), ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(GAP * ratio);
    canvas.height = Math.round(rows * ROW * ratio);
    canvas.style.width = GAP + "px";
    canvas.style.height = rows * ROW + "px";
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    draw();
  }
  function draw() {
    var s = data.sites[state.site], w = s.weights[state.layer], n = w.length;
    var f = state.focus, h, i, j, shown = [];
    for (h = 0; h < n; h++) {
      headBox.children[h].classList.toggle("off", !state.heads[h]);
      if (state.heads[h]) shown.push(h);
    }
    ctx.save();
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    ctx.restore();
    ctx.lineWidth = f ? 2.5 : 1.5;
    shown.forEach(function (h) {
      ctx.strokeStyle = colour(h, n);
      for (i = 0; i < w[h].length; i++) {
        if (f && f.side === "query" && f.index !== i) continue;
        for (j = 0; j < w[h][i].length; j++) {
          if (f && f.side === "key" && f.index !== j) continue;
          var a = w[h][i][j];
          if (!(a >= MIN_WEIGHT)) continue;
          ctx.globalAlpha = Math.min(1, a);
          ctx.beginPath();
          ctx.moveTo(0, (i + 0.5) * ROW);
          ctx.lineTo(GAP, (j + 0.5) * ROW);
          ctx.stroke();
        }
      }
    });
    ctx.globalAlpha = 1;
    leftEls.forEach(function (el, k) {
      el.classList.toggle("focus", !!f && f.side === "query" && f.index === k);
    });
    rightEls.forEach(function (el, k) {
      el.classList.toggle("focus", !!f && f.side === "key" && f.index === k);
    });
    var where = s.name + ", layer " + state.layer + ": " + shown.length + " of " + n +
        " heads shown";
    if (f && f.side === "query" && shown.length) {
      var best = 0, bestWeight = -1;
      for (j = 0; j < s.keys.length; j++) {
        var mean = 0;
        shown.forEach(function (h) { mean += w[h][f.index][j] / shown.length; });
        if (mean > bestWeight) { best = j; bestWeight = mean; }
      }
      where += "; query \\u201c" + s.queries[f.index] + "\\u201d attends most to key \\u201c" +
          s.keys[best] + "\\u201d (" + bestWeight.toFixed(3) + ", mean over shown heads)";
    }
    status.textContent = where;
  }

  data.sites.forEach(function (s, k) { option(siteSel, k, s.label); });
  document.getElementById("sentences").textContent =
      "source: " + data.src_tokens.join(" ") + "\\ntarget: " + data.tgt_tokens.join(" ");
  siteSel.addEventListener("change", function () { state.site = +siteSel.value; buildSite(); });
  layerSel.addEventListener("change", function () { state.layer = +layerSel.value; draw(); });
  document.getElementById("all").addEventListener("click", function () {
    state.heads = state.heads.map(function () { return true; });
    draw();
  });
  document.getElementById("none").addEventListener("click", function () {
    state.heads = state.heads.map(function () { return false; });
    draw();
  });
  buildSite();
})();
</script>
</body>
</html>
"""
