"""The analysis figures: PNGs read back, the head-view page's data and escaping, BertViz
optional."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import types

import matplotlib.colors as mcolors
import matplotlib.image as mpimg
import numpy as np
import pytest

from heads_lab.output import figures

NASTY = '<b>&"x'  # must not break the page
SRC = ["▁The", "▁cat", NASTY, "$a$", "</script>", "</s>"]
TGT = ["<s>", "▁Die", "▁Katze", "'q'", "</s>"]


def read_png(path):
    """The image as an array, checked to be a real, non-blank PNG."""
    assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image.shape[2] in (3, 4)
    assert image[..., :3].std() > 0.05  # not a uniform canvas
    return image


def pixels_of(image, colour) -> int:
    """How many pixels have exactly this colour (to PNG precision)."""
    rgb = np.array(mcolors.to_rgb(colour))
    return int((np.abs(image[..., :3] - rgb) < 1.5 / 255).all(axis=-1).sum())


def grid(rng, layers, heads):
    return rng.random((layers, heads)).round(3).tolist()


def attention(rng, layers, heads, n, m):
    return rng.dirichlet(np.ones(m), size=(layers, heads, n))


def test_metric_grids_one_png_per_metric_with_missing_cells_and_sites(tmp_path):
    rng = np.random.default_rng(0)
    enc = grid(rng, 4, 6)
    enc[1][2] = None
    grids = {
        "confidence": {"enc-self": enc, "dec-enc": grid(rng, 2, 6)},  # dec-self absent
        "syntactic_gain": {"dec-self": (rng.normal(size=(2, 6)) * 0.1).tolist()},  # both signs
        "importance": {"enc-self": [[None] * 6] * 4},  # nothing measured: no file
        "lrp": {"enc-self": [[None] * 6] * 4, "dec-enc": [[0.5] * 6] * 2},  # one site measured
        "rare_share": {},  # no site: no file
    }
    paths = figures.metric_grids(grids, tmp_path / "new" / "dir")
    assert [p.name for p in paths] == ["heads_confidence.png", "heads_syntactic_gain.png",
                                       "heads_lrp.png"]
    assert sorted(p.name for p in (tmp_path / "new" / "dir").iterdir()) == sorted(
        p.name for p in paths)
    images = {p.stem: read_png(p) for p in paths}
    # the None cell is a grey block; with every cell measured there is none
    assert pixels_of(images["heads_confidence"], figures.MISSING_COLOUR) > 1000
    assert pixels_of(images["heads_syntactic_gain"], figures.MISSING_COLOUR) < 300
    assert pixels_of(images["heads_lrp"], figures.MISSING_COLOUR) > 24 * 1000  # enc-self
    # two sites side by side make a wider figure than one
    assert images["heads_confidence"].shape[1] > images["heads_syntactic_gain"].shape[1]


def test_metric_grids_refuses_ragged_layers_and_unknown_sites(tmp_path):
    with pytest.raises(ValueError, match="same number of heads"):
        figures.metric_grids({"confidence": {"enc-self": [[0.1, 0.2], [0.3]]}}, tmp_path)
    with pytest.raises(ValueError, match="unknown attention sites"):
        figures.metric_grids({"confidence": {"encoder": [[0.1]]}}, tmp_path)


def test_many_heads_draw_without_cell_values(tmp_path, monkeypatch):
    """Cell values are written up to ANNOTATE_HEADS (16) heads a panel, one text per cell, and
    left out above it, where they would not fit."""
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", kept.append)  # keep the figures to read their axes back
    rng = np.random.default_rng(1)
    for heads in (16, 32):
        (path,) = figures.metric_grids({"importance": {"enc-self": grid(rng, 3, heads)}},
                                       tmp_path / str(heads))
        read_png(path)
    few, many = (fig.axes[0] for fig in kept)
    assert len(few.texts) == 3 * 16 and few.texts[0].get_text() != ""
    assert len(many.texts) == 0


def test_function_map_colours_each_role_and_skips_absent_sites(tmp_path):
    functions = {"dec-enc": [["positional", "other", "syntactic"], ["other", "other", "rare"]],
                 "enc-self": [["other"] * 3, ["positional"] * 3, ["syntactic"] * 3]}
    path = figures.function_map(functions, tmp_path)
    assert path == tmp_path / "head_functions.png"
    image = read_png(path)
    for role, colour in figures.FUNCTION_COLOURS.items():
        assert pixels_of(image, colour) > 500, role

    only_positional = {"dec-self": [["positional", "other"]] * 2}
    image = read_png(figures.function_map(only_positional, tmp_path / "b"))
    assert pixels_of(image, figures.FUNCTION_COLOURS["positional"]) > 500
    # the legend's swatch only: no cell is rare or syntactic
    assert pixels_of(image, figures.FUNCTION_COLOURS["rare"]) < 500
    assert pixels_of(image, figures.FUNCTION_COLOURS["syntactic"]) < 500


def test_function_map_labels_positional_heads_with_their_offset(tmp_path):
    assert [figures.function_label("positional", k) for k in (-1, 0, 2)] == ["P−1", "P0", "P+2"]
    assert figures.function_label("positional") == "P"
    assert figures.function_label("syntactic", 3) == "S"  # only positional heads carry one
    assert figures.function_label("other", -1) == ""
    functions = {"enc-self": [["positional", "other"], ["syntactic", "positional"]]}
    path = figures.function_map(functions, tmp_path, {"enc-self": [[-1, None], [None, 1]]})
    assert pixels_of(read_png(path), figures.FUNCTION_COLOURS["positional"]) > 500


def test_function_map_refuses_unknown_roles_and_empty_input(tmp_path):
    with pytest.raises(ValueError, match="'copy'"):
        figures.function_map({"enc-self": [["positional", "copy"]]}, tmp_path)
    with pytest.raises(ValueError, match="no attention site"):
        figures.function_map({}, tmp_path)


def distances(rng, layers, heads):
    m = rng.random((layers * heads, layers * heads)) * 0.6  # every head against every head
    m = (m + m.T) / 2
    np.fill_diagonal(m, 0.0)
    return m.tolist()


def test_distance_matrices_and_diversity(tmp_path):
    rng = np.random.default_rng(2)
    d = {"enc-self": distances(rng, 3, 4), "dec-enc": distances(rng, 2, 4)}
    diversity = {"enc-self": [0.1, 0.2, 0.3], "dec-enc": [0.2, 0.1]}
    paths = figures.distance_matrices(d, diversity, tmp_path)
    assert [p.name for p in paths] == ["head_distance.png", "head_diversity.png"]
    for p in paths:
        read_png(p)
    # a panel per site, side by side: two sites stand wider than one
    (single,) = figures.distance_matrices({"enc-self": d["enc-self"]}, {}, tmp_path / "one")
    assert read_png(paths[0]).shape[1] > read_png(single).shape[1]
    assert figures.distance_matrices({}, {"dec-self": [0.2, 0.3]}, tmp_path / "div")[0].name == \
        "head_diversity.png"


def test_distance_matrices_refuse_non_square(tmp_path):
    with pytest.raises(ValueError, match="square"):
        figures.distance_matrices({"enc-self": [[0.0, 0.1, 0.2], [0.1, 0.0, 0.3]]}, {}, tmp_path)


def test_attention_heatmap_draws_tokens_and_checks_shape(tmp_path):
    rng = np.random.default_rng(3)
    w = rng.dirichlet(np.ones(len(SRC)), size=len(TGT))
    path = figures.attention_heatmap(w, TGT, SRC, "dec-enc layer 1 head 2 $x$",
                                     tmp_path / "sub" / "heat.png")
    image = read_png(path)
    assert image.shape[0] > 300  # room for the rotated key tokens
    with pytest.raises(ValueError, match=r"shape \(6, 5\).*expected \(5, 6\)"):
        figures.attention_heatmap(w.T, TGT, SRC, "t", tmp_path / "bad.png")
    with pytest.raises(ValueError, match="expected"):
        figures.attention_heatmap(w[0], TGT, SRC, "t", tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


def page_parts(text):
    """The JSON data block and the page without it."""
    match = re.search(r'<script type="application/json" id="heads-lab-data">(.*?)</script>',
                      text, re.S)
    assert match, "no data block"
    return match.group(1), text[:match.start()] + text[match.end():]


def test_head_view_html_is_self_contained_and_round_trips_the_data(tmp_path):
    rng = np.random.default_rng(4)
    att = {"dec-enc": attention(rng, 2, 3, len(TGT), len(SRC)),  # order given is not drawn order
           "enc-self": attention(rng, 3, 4, len(SRC), len(SRC))}  # dec-self absent
    notes = {"enc-self": [[f"<b>{layer}.{h}</b>" for h in range(4)] for layer in range(3)]}
    path = figures.head_view_html(att, SRC, TGT, tmp_path / "v" / "view.html",
                                  title='heads <i>"view"</i>', notes=notes)
    text = path.read_text(encoding="utf-8")
    assert "http://" not in text and "https://" not in text
    assert not re.search(r"""<(script|link|img|iframe)[^>]*\s(src|href)\s*=""", text, re.I)
    assert text.count("</script>") == 2  # the data block and the code: no token closed one
    blob, rest = page_parts(text)
    data = json.loads(blob)
    assert data["src_tokens"] == SRC and data["tgt_tokens"] == TGT
    assert [s["name"] for s in data["sites"]] == ["enc-self", "dec-enc"]
    for site in data["sites"]:
        np.testing.assert_allclose(np.array(site["weights"]), att[site["name"]], atol=1e-6, rtol=0)
    enc, cross = data["sites"]
    assert enc["notes"] == notes["enc-self"] and "notes" not in cross  # the heads' tooltips
    assert enc["queries"] == SRC and enc["keys"] == SRC
    assert cross["queries"] == TGT and cross["keys"] == SRC
    for token in (NASTY, "<b>", "<s>", "</s>"):
        assert token not in rest and token not in blob
    assert "<i>" not in text and "heads &lt;i&gt;&quot;view&quot;&lt;/i&gt;" in rest
    for control in ('id="site"', 'id="layer"', 'id="heads"', 'id="queries"', 'id="keys"'):
        assert control in rest


@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")
def test_head_view_script_is_valid_javascript(tmp_path):
    rng = np.random.default_rng(5)
    path = figures.head_view_html({"dec-self": attention(rng, 1, 2, len(TGT), len(TGT))}, SRC,
                                  TGT, tmp_path / "view.html")
    code = re.search(r"<script>\n(.*?)</script>", path.read_text(encoding="utf-8"), re.S).group(1)
    (tmp_path / "view.js").write_text(code, encoding="utf-8")
    subprocess.run(["node", "--check", str(tmp_path / "view.js")], check=True)


def test_head_view_html_checks_shapes(tmp_path):
    rng = np.random.default_rng(6)
    with pytest.raises(ValueError, match=r"attention\['dec-enc'\] has shape"):
        figures.head_view_html({"dec-enc": attention(rng, 1, 2, len(SRC), len(TGT))}, SRC, TGT,
                               tmp_path / "view.html")
    with pytest.raises(ValueError, match="no attention site"):
        figures.head_view_html({}, SRC, TGT, tmp_path / "view.html")
    assert not (tmp_path / "view.html").exists()


def test_bertviz_head_view_is_none_without_bertviz(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "bertviz", None)  # import bertviz → ImportError
    rng = np.random.default_rng(7)
    att = {"enc-self": attention(rng, 1, 2, len(SRC), len(SRC))}
    assert figures.bertviz_head_view(att, SRC, TGT, tmp_path / "bv.html") is None
    assert not (tmp_path / "bv.html").exists()


def test_bertviz_head_view_with_the_real_library(tmp_path):
    """BertViz itself (the bertviz extra; make test installs it): its page holds our three
    sites' weights per layer and head, and our tokens, one of which is "</script>", inside its
    data block, which the page's scripts do not end early."""
    pytest.importorskip("bertviz", reason="the bertviz extra: pip install 'heads-lab[bertviz]' "
                        "(make test installs it)")
    rng = np.random.default_rng(9)
    att = {"enc-self": attention(rng, 2, 3, len(SRC), len(SRC)),
           "dec-self": attention(rng, 2, 3, len(TGT), len(TGT)),
           "dec-enc": attention(rng, 2, 3, len(TGT), len(SRC))}
    text = figures.bertviz_head_view(att, SRC, TGT, tmp_path / "bv.html").read_text(
        encoding="utf-8")
    blocks = re.findall(r"<script\b[^>]*>(.*?)</script>", text, re.S)
    (data,) = [b for b in blocks if "params = " in b]
    start = data.index("params = ") + len("params = ")
    params, _ = json.JSONDecoder().raw_decode(data, start)  # whole inside its own script
    sets = {s["name"]: s for s in params["attention"]}
    assert set(sets) == {"Encoder", "Decoder", "Cross"} and params["include_layers"] == [0, 1]
    for name, site in (("Encoder", "enc-self"), ("Decoder", "dec-self"), ("Cross", "dec-enc")):
        np.testing.assert_allclose(np.array(sets[name]["attn"]), att[site], rtol=1e-6)
    assert [t.strip() for t in sets["Encoder"]["left_text"]] == [
        s.replace("▁", "") for s in SRC]
    assert "</script>" in sets["Encoder"]["left_text"]


def test_bertviz_head_view_passes_per_layer_tensors(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    calls = []

    def head_view(**kwargs):
        calls.append(kwargs)
        return types.SimpleNamespace(data="<div id='bertviz'>view</div>")

    monkeypatch.setitem(sys.modules, "bertviz", types.SimpleNamespace(head_view=head_view))
    rng = np.random.default_rng(8)
    att = {"enc-self": attention(rng, 2, 3, len(SRC), len(SRC)),
           "dec-enc": attention(rng, 2, 3, len(TGT), len(SRC))}
    path = figures.bertviz_head_view(att, SRC, TGT, tmp_path / "bv.html")
    assert "<div id='bertviz'>view</div>" in path.read_text(encoding="utf-8")
    (kw,) = calls
    assert kw["html_action"] == "return" and kw["decoder_attention"] is None
    assert kw["encoder_tokens"] == SRC and kw["decoder_tokens"] == TGT
    assert [tuple(t.shape) for t in kw["encoder_attention"]] == [(1, 3, 6, 6)] * 2
    assert [tuple(t.shape) for t in kw["cross_attention"]] == [(1, 3, 5, 6)] * 2
    np.testing.assert_allclose(kw["cross_attention"][1][0].numpy(), att["dec-enc"][1], atol=1e-6)


def _ppl_tick_labels(tmp_path, monkeypatch, ppls):
    import matplotlib.pyplot as plt

    from heads_lab.output.curves import plot_curves

    kept = []
    monkeypatch.setattr(plt, "close", kept.append)  # keep the figure to read its axes back
    rows = [{"fraction": i / (len(ppls) - 1), "bleu": 30.0 - i, "ppl": p}
            for i, p in enumerate(ppls)]
    path = plot_curves({"enc-self": rows}, tmp_path / "curve.png", "test")
    assert path.is_file() and mpimg.imread(path).shape[2] in (3, 4)
    ax = kept[0].axes[1]
    kept[0].canvas.draw()
    shown = [t.get_text() for t in ax.get_yticklabels(minor=False) + ax.get_yticklabels(minor=True)
             if t.get_text() and ax.get_ylim()[0] <= t.get_position()[1] <= ax.get_ylim()[1]]
    return ax.get_yscale(), shown


def test_prune_curve_ppl_axis_reads_as_plain_numbers(tmp_path, monkeypatch):
    scale, narrow = _ppl_tick_labels(tmp_path, monkeypatch, [6.2, 6.5, 7.3])
    assert scale == "log" and narrow and all(re.fullmatch(r"[0-9.]+", t) for t in narrow), narrow
    assert "6.4" in narrow or "7" in narrow
    _, wide = _ppl_tick_labels(tmp_path, monkeypatch, [5.0, 500.0, 5e4])
    steps = {f"{m * 10 ** k:g}" for m in (1, 2, 5) for k in range(6)}  # 1, 2, 5 × 10^k
    assert set(wide) <= steps and {"100", "1000"} <= set(wide), wide
    # a little over a decade (5 to 60) once read "10" alone: now 5, 10, 20, 50
    _, decade = _ppl_tick_labels(tmp_path, monkeypatch, [5.0, 12.0, 60.0])
    assert {"5", "10", "20", "50"} <= set(decade), decade



def test_valid_curves_show_at_least_half_of_every_lines_points(tmp_path, monkeypatch):
    """A run whose valid PPL rises (100 → 1,000, diverging) beside one that settles near 5: the
    axis' top was 3× the lowest point (15), which hid the whole rise; now at least half of every
    line's points are inside the axes, and the label says the top is cut."""
    import matplotlib.pyplot as plt

    from heads_lab.output.curves import draw_valid_curves

    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    steps = list(range(100, 1100, 100))
    rising = [100.0 * 1.29 ** i for i in range(10)]
    settling = [60 / (i + 1) + 5 for i in range(10)]
    draw_valid_curves({"rising": (steps, rising), "settling": (steps, settling)},
                      tmp_path / "curves.png", "two runs")
    ax = kept[0].axes[0]
    low, top = ax.get_ylim()
    for ppl in (rising, settling):
        assert sum(low <= p <= top for p in ppl) >= len(ppl) / 2
    assert "cut at the top" in ax.get_ylabel()


def test_prune_curves_legend_covers_no_curve(tmp_path, monkeypatch):
    """Michel's figure with every site's curve and the all-sites one: the legend lies under the
    panels, over no axes (inside one it covered the all-sites curve)."""
    import matplotlib.pyplot as plt

    from heads_lab.output.curves import plot_curves

    kept = []
    monkeypatch.setattr(plt, "close", kept.append)
    curves = {name: [{"fraction": f, "bleu": 38 - 20 * f * (1 + k), "ppl": 6 + 30 * f * (1 + k)}
                     for f in (0.0, 0.25, 0.5, 0.75, 1.0)]
              for k, name in enumerate(("enc-self", "dec-self", "dec-enc", "all sites"))}
    plot_curves(curves, tmp_path / "curve.png", "test")
    fig = kept[0]
    fig.canvas.draw()
    (legend,) = fig.legends
    box = legend.get_window_extent()
    assert [t.get_text() for t in legend.get_texts()] == list(curves)
    for ax in fig.axes:
        assert ax.get_legend() is None
        assert not box.overlaps(ax.get_window_extent()), ax.get_ylabel()


def _kept_figures(monkeypatch) -> list:
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    return kept


def test_head_map_labels_stay_inside_their_panel(tmp_path, monkeypatch):
    """Heads at the map's right and top edges: their L{layer}H{head} labels turn inwards, so
    every label lies inside its panel's frame (they crossed it)."""
    kept = _kept_figures(monkeypatch)
    corners = [[x, y] for x in (-1.0, 0.0, 1.0) for y in (-1.0, 0.0, 1.0)] + [[0.9, 0.95],
                                                                             [1.0, -0.2],
                                                                             [0.2, 1.0]]
    figures.head_map({"enc-self": corners[:12]}, {"enc-self": 3}, tmp_path)
    fig = kept[0]
    fig.canvas.draw()
    (ax,) = [a for a in fig.axes if a.texts]
    frame = ax.get_window_extent()
    for text in ax.texts:
        box = text.get_window_extent()
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1, text.get_text()
        assert frame.y0 <= box.y0 and box.y1 <= frame.y1, text.get_text()


def test_head_diversity_hides_no_point_under_another(tmp_path, monkeypatch):
    """Two sites with the same diversity at a layer: each has its own marker and they stand a
    little apart, so neither point hides the other."""
    kept = _kept_figures(monkeypatch)
    figures.distance_matrices({}, {"enc-self": [0.2, 0.3], "dec-enc": [0.2, 0.1]}, tmp_path)
    (ax,) = kept[0].axes
    lines = [line for line in ax.get_lines() if line.get_label() in ("enc-self", "dec-enc")]
    assert len({line.get_marker() for line in lines}) == 2
    first = {(line.get_xdata()[0], line.get_ydata()[0]) for line in lines}
    assert len(first) == 2  # layer 0, both 0.2: two places
