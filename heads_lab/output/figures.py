"""The figures of `heads-lab analyze`: per-head metric grids, head roles, distances between heads,
attention heatmaps and an interactive head view (Voita et al. 2019; Clark et al. 2019).

Every PNG function returns the paths it wrote (creating the folder), closes its figures and
draws the attention sites in the fixed order enc-self, dec-self, dec-enc, skipping the sites
absent from its input. Layers and heads are numbered from 0, as in head specs (enc:0:3) and
analysis.json.
Written files: heads_<metric>.png, head_functions.png, head_distance.png, head_diversity.png,
head_map.png,
the heatmap and head-view paths the caller names. head_view_html writes one self-contained HTML
file (inline CSS and JavaScript, the data as JSON in a <script id="heads-lab-data"> block);
bertviz_head_view writes BertViz's own view when the optional bertviz package is installed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heads_lab.config.sites import ALL_SITES, present

FUNCTIONS = ("positional", "syntactic", "rare", "other")
FUNCTION_COLOURS = {"positional": "#4c72b0", "syntactic": "#55a868", "rare": "#c44e52",
                    "other": "#e6e6e6"}
FUNCTION_LETTERS = {"positional": "P", "syntactic": "S", "rare": "R", "other": ""}
SITE_COLOURS = {site: f"C{i}" for i, site in enumerate(ALL_SITES)}
MISSING_COLOUR = "#d0d0d0"
ANNOTATE_HEADS = 16  # cell values written in metric grids and function maps up to this many heads
ANNOTATE_DISTANCE_HEADS = 8  # head×head matrices hold heads² cells: values only when small


def _pyplot():
    import matplotlib  # lazy: start-up time (matplotlib)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: start-up time (matplotlib)

    return plt


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


# scores read against a bar on [0, 1] (a language model's roles): drawn on that whole scale, so
# a head at 0.01 is not as bright as one at 0.9
UNIT_SCALE = frozenset({"previous_token", "duplicate_token", "induction", "sink"})


def metric_grids(grids: Mapping[str, Mapping[str, Sequence[Sequence[float | None]]]],
                 out_dir: Path, titles: Mapping[str, Mapping[str, str]] | None = None
                 ) -> list[Path]:
    """heads_<metric>.png per metric: one layer×head heatmap per site, one colour scale per
    metric, grey cells where nothing was measured (None or NaN), and no file for a metric
    measured nowhere; `titles` (metric → site → panel title) say which heads a panel shows."""
    import matplotlib.colors as mcolors  # lazy: start-up time (matplotlib)
    from matplotlib import colormaps  # lazy: start-up time (matplotlib)

    plt = _pyplot()
    out_dir = Path(out_dir)
    paths = []
    for metric, by_site in grids.items():
        sites = present(by_site)
        if not sites:
            continue
        arrays = [_grid(s, by_site[s], metric) for s in sites]
        if all(np.isnan(a).all() for a in arrays):
            continue  # nothing measured (the console and analysis.md say why): no empty figure
        lo, hi, diverging = (0.0, 1.0, False) if metric in UNIT_SCALE else _limits(arrays)
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
    import matplotlib.colors as mcolors  # lazy: start-up time (matplotlib)
    from matplotlib.patches import Patch  # lazy: start-up time (matplotlib)

    plt = _pyplot()
    sites = present(functions)
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


def distance_matrices(distances: Mapping[str, Sequence[Sequence[float]]],
                      diversity: Mapping[str, Sequence[float]], out_dir: Path,
                      titles: Mapping[str, str] | None = None) -> list[Path]:
    """head_distance.png (per site the [layers · heads]² Jensen–Shannon distance matrix between
    every two of its heads, layers marked, one colour scale) and head_diversity.png (each
    layer's mean distance between its own heads, a line per site); a figure whose input has no
    site is not written. The layer count of a site is len(diversity[site]) (else one).
    `titles` (site → name) name the heads' kind."""
    import matplotlib.colors as mcolors  # lazy: start-up time (matplotlib)
    from matplotlib import colormaps  # lazy: start-up time (matplotlib)

    plt = _pyplot()
    out_dir = Path(out_dir)
    paths = []
    sites = present(distances)
    if sites:
        mats = {site: np.asarray(distances[site], dtype=float) for site in sites}
        for site, m in mats.items():
            if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
                raise ValueError(f"distances: site {site} has shape {m.shape}; expected a square "
                                 "[layers · heads, layers · heads] matrix")
        _, hi, _ = _limits(list(mats.values()))
        norm = mcolors.Normalize(0.0, hi if hi > 0 else 1.0)
        cmap = colormaps["viridis"].with_extremes(bad=MISSING_COLOUR)
        fig, axes = plt.subplots(1, len(sites), squeeze=False, layout="constrained",
                                 figsize=(len(sites) * 4.0 + 1.4, 4.2))
        for ax, site in zip(axes[0], sites):
            m = mats[site]
            layers = len(diversity.get(site) or [0])
            heads = m.shape[0] // layers
            image = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, norm=norm)
            for b in range(1, layers):
                ax.axhline(b * heads - 0.5, color="white", linewidth=1)
                ax.axvline(b * heads - 0.5, color="white", linewidth=1)
            ax.set_title(_text((titles or {}).get(site, site)), fontsize=9)
            ticks = [layer * heads + (heads - 1) / 2 for layer in range(layers)]
            ax.set_xticks(ticks, [f"L{layer}" for layer in range(layers)])
            ax.set_yticks(ticks, [f"L{layer}" for layer in range(layers)])
            if m.shape[0] <= ANNOTATE_DISTANCE_HEADS:
                _annotate(ax, m, cmap, norm, ".2f", 6 if m.shape[0] <= 4 else 5)
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8,
                     label="Jensen–Shannon distance per query (nats)")
        fig.suptitle("distance between every two heads' attention (layer blocks)")
        paths.append(_save(fig, out_dir / "head_distance.png"))
    sites = present(diversity)
    if sites:
        fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
        most, top = 0, 0.0
        for i, site in enumerate(sites):  # each site its marker, a little apart: none hidden
            values = [math.nan if v is None else float(v) for v in diversity[site]]
            most = max(most, len(values))
            top = max([top] + [v for v in values if math.isfinite(v)])
            shift = (i - (len(sites) - 1) / 2) * 0.08
            ax.plot([layer + shift for layer in range(len(values))], values,
                    marker=SITE_MARKERS[site], color=SITE_COLOURS[site],
                    label=_text((titles or {}).get(site, site)))
        ax.set_xticks(range(most))
        ax.set_xlabel("layer")
        ax.set_ylabel("mean JS distance between the layer's heads")
        ax.set_ylim(0, top * 1.1 if top > 0 else 1.0)
        ax.set_title("head diversity per layer")
        ax.grid(alpha=0.3)
        ax.legend()
        paths.append(_save(fig, out_dir / "head_diversity.png"))
    return paths


SITE_MARKERS = {"enc-self": "o", "dec-self": "s", "dec-enc": "^", "lm-self": "D"}


def head_map(coords: Mapping[str, Sequence[Sequence[float]]], layers: Mapping[str, int],
             out_dir: Path, titles: Mapping[str, str] | None = None) -> Path:
    """head_map.png: Clark et al. 2019's map, every head a point placed by MDS of the distances
    between heads (analysis.head_map), labelled L{layer}H{head} and coloured by layer, one marker
    per site; a panel per site, since heads of different sites attend from or to different tokens
    and have no distance, all panels on one scale (a distance reads the same in each), and the
    layers' legend below the panels, where it hides no head."""
    plt = _pyplot()
    sites = present(coords)
    if not sites:
        raise ValueError("head_map: no site has coordinates")
    from matplotlib import colormaps  # lazy: start-up time (matplotlib)
    from matplotlib.lines import Line2D  # lazy: as above

    points = {}
    for site in sites:
        xy = np.asarray(coords[site], dtype=float)
        if xy.ndim != 2 or xy.shape[1] != 2 or xy.shape[0] % layers[site]:
            raise ValueError(f"head_map: site {site} has coordinates of shape {xy.shape}; "
                             f"expected [{layers[site]} layers · heads, 2]")
        points[site] = xy
    every = np.concatenate(list(points.values()))
    centre = (every.min(0) + every.max(0)) / 2
    half = (every.max(0) - every.min(0)).max() / 2 * 1.12 + 1e-9  # one scale for every panel
    most = max(layers[site] for site in sites)
    cmap = colormaps["viridis"]
    colours = [cmap(layer / max(most - 1, 1)) for layer in range(most)]
    fig, axes = plt.subplots(1, len(sites), squeeze=False, layout="constrained",
                             figsize=(len(sites) * 3.8 + 0.4, 4.4))
    for ax, site in zip(axes[0], sites):
        xy = points[site]
        heads = xy.shape[0] // layers[site]
        for layer in range(layers[site]):
            part = xy[layer * heads:(layer + 1) * heads]
            ax.scatter(part[:, 0], part[:, 1], color=colours[layer], marker=SITE_MARKERS[site],
                       s=36, edgecolors="#333333", linewidths=0.4)
            for head, (x, y) in enumerate(part):  # labels turn inwards near the right/top edge
                right, high = x > centre[0] + 0.4 * half, y > centre[1] + 0.6 * half
                ax.annotate(f"L{layer}H{head}", (x, y), fontsize=5.5,
                            xytext=(-3 if right else 3, -2 if high else 2),
                            ha="right" if right else "left", va="top" if high else "bottom",
                            textcoords="offset points", color="#333333")
        ax.set_title(_text((titles or {}).get(site, site)), fontsize=9)
        ax.set_xlim(centre[0] - half, centre[0] + half)
        ax.set_ylim(centre[1] - half, centre[1] + half)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
    handles = [Line2D([], [], marker="o", linestyle="", color=colours[layer],
                      markeredgecolor="#333333", label=f"layer {layer}") for layer in range(most)]
    fig.legend(handles=handles, loc="outside lower center", ncol=most, fontsize=8)
    fig.suptitle("head map: MDS of the Jensen–Shannon distances between heads (Clark et al. "
                 "2019), one scale")
    return _save(fig, Path(out_dir) / "head_map.png")


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


# the head view moved to heads_lab.output.head_view; kept here for callers
from heads_lab.output.head_view import bertviz_head_view, head_view_html  # noqa: E402, F401
