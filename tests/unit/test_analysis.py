"""Head metrics against hand-built attention maps with known answers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from heads_lab.analysis import (
    Sentence,
    Tree,
    attach_arcs,
    confidence,
    diversity,
    head_distances,
    mds_coordinates,
    piece_spans,
    positional,
    rare_sentences,
    rare_share,
    read_conllu,
    syntactic,
    within_layer,
    word_map,
    word_spans,
    words_to_subwords,
)
from heads_lab.errors import DataError


def _one_hot(targets: list[int], n_keys: int) -> np.ndarray:
    m = np.zeros((len(targets), n_keys))
    m[np.arange(len(targets)), targets] = 1.0
    return m


def test_previous_token_head_is_positional_and_uniform_head_is_not():
    n = 12  # 11 words + EOS; the EOS query is left out
    prev = _one_hot([max(i - 1, 0) for i in range(n)], n)
    uniform = np.full((n, n), 1.0 / n)
    maps = [np.stack([np.stack([prev, uniform])])]  # [1 layer, 2 heads, n, n]
    pos = positional(maps, skip_last_query=True, eos_key=True)
    # query 0 has no previous token: the share is over the 10 queries where −1 exists
    assert pos["offset"][0, 0] == -1 and pos["share"][0, 0] == 1.0 and pos["prev"][0, 0] == 1.0
    # query 0, with no previous token, looks at itself: 1 of the 11 queries, reported apart
    assert pos["self"][0, 0] == pytest.approx(1 / 11)
    assert pos["share"][0, 1] == pytest.approx(1 / 10)  # argmax of a uniform row: key 0
    conf = confidence(maps, skip_last_query=True, eos_key=True)
    # EOS is not a key: the uniform head's maximum over the real tokens is still 1/n
    assert conf[0, 0] == 1.0 and conf[0, 1] == pytest.approx(1 / n)


def test_a_head_on_its_own_token_is_not_positional_and_eos_is_no_key():
    n = 6  # 5 words + EOS
    self_head = np.eye(n)
    to_eos = np.full((n, n), 0.02)
    to_eos[:, -1] = 1 - 0.02 * (n - 1)
    maps = [np.stack([np.stack([self_head, to_eos])])]
    pos = positional(maps, skip_last_query=True, eos_key=True)
    assert pos["self"][0, 0] == 1.0 and pos["share"][0, 0] == 0.0  # no offset ≠ 0 at all
    # offset 0 would have won the old "most common offset": it never labels a head now
    conf = confidence(maps, skip_last_query=True, eos_key=True)
    assert conf[0, 1] == pytest.approx(0.02)  # EOS left out, not renormalised
    assert confidence(maps, skip_last_query=True, eos_key=False)[0, 1] == pytest.approx(0.9)


def test_positional_share_counts_only_queries_where_the_offset_exists():
    # previous-token heads on a 4-token and a 7-token sentence (EOS query left out), one miss
    # each (the miss points at the first key)
    def prev_head(n: int, miss: int) -> np.ndarray:
        targets = [max(i - 1, 0) for i in range(n)]
        targets[miss] = 0
        return np.stack([np.stack([_one_hot(targets, n)])])

    maps = [prev_head(4, miss=2), prev_head(7, miss=5)]
    pos = positional(maps, skip_last_query=True, eos_key=True)
    # −1 exists for queries 1..2 and 1..5: 7 of the 9 queries, 5 of them hit
    assert pos["offset"][0, 0] == -1 and pos["share"][0, 0] == pytest.approx(5 / 7)
    # an independent count: loop over every query, keep those whose key q − 1 exists
    hits = total = 0
    for m in maps:
        a = m[0, 0]
        for q in range(a.shape[0] - 1):
            if q - 1 >= 0:
                total += 1
                hits += int(a[q, :-1].argmax() == q - 1)
    assert pos["share"][0, 0] == pytest.approx(hits / total)
    # a next-token head: +1 exists for every query but the last real one (EOS is no key)
    nxt = _one_hot([min(i + 1, 4) for i in range(6)], 6)
    pos = positional([nxt[None, None]], skip_last_query=True, eos_key=True)
    assert pos["offset"][0, 0] == 1 and pos["next"][0, 0] == 1.0


def test_rare_word_head_points_at_the_least_frequent_source_token():
    src = [10, 11, 12, 13, 3]  # 3 = EOS
    freq = {10: 500, 11: 2, 12: 40, 13: 7}
    rare = _one_hot([1] * 5, 5)
    first = _one_hot([0] * 5, 5)
    maps = [np.stack([np.stack([rare, first])])]
    share, used = rare_share(maps, [src], freq, skip_last_query=True)
    assert share[0, 0] == 1.0 and share[0, 1] == 0.0 and used == 1
    # Voita's filter: a sentence whose rarest token is among the top-k most frequent is left out
    common = [10, 12, 3]  # rarest: 12, the 2nd most frequent of the four
    assert rare_sentences([src, common], freq, top_k=2) == [True, False]
    assert rare_sentences([src, common], freq, top_k=None) == [True, True]
    share, used = rare_share(maps * 2, [src, common], freq, skip_last_query=True, top_k=2)
    assert used == 1 and share[0, 0] == 1.0


class _Pieces:
    """A tokenizer stand-in: one piece per word, with SentencePiece's ▁."""

    def __init__(self, words: list[str]):
        self.words = words

    def pieces(self, ids: list[int]) -> list[str]:
        return ["▁" + self.words[i] for i in ids]

    def encode_spans(self, text: str):
        return [], []  # not SentencePiece: the spans come from the pieces (piece_spans)


def test_word_map_sums_attention_to_a_word_and_averages_it_from_a_word():
    rng = np.random.default_rng(0)
    m = rng.dirichlet(np.ones(6), size=(2, 3, 6))  # [L, H, 6 pieces incl. EOS, 6]
    units = [[0], [1, 2], [3, 4]]  # 3 words; piece 5 is EOS
    got = word_map(m, units)
    ref = np.zeros((2, 3, 3, 3))  # an independent loop over words and pieces
    for a, qa in enumerate(units):
        for b, kb in enumerate(units):
            if a != b:
                ref[:, :, a, b] = sum(m[:, :, q, k] for q in qa for k in kb) / len(qa)
    np.testing.assert_allclose(got, ref, atol=1e-12)


def test_a_head_on_gold_arcs_is_syntactic_at_the_word_level_against_the_word_baseline():
    # "the big dog sees a cat quickly"; dog and quickly split in two pieces each, EOS last
    words = ["the", "big", "dog", "sees", "a", "cat", "quickly"]
    pieces = ["the", "big", "do", "g", "sees", "a", "cat", "quick", "ly"]
    heads = [2, 2, 3, -1, 5, 3, 3]
    rels = ["det", "amod", "nsubj", "root", "det", "dobj", "advmod"]
    text = "the big dog sees a cat quickly"

    class Split(_Pieces):
        def pieces(self, ids):
            return [("▁" if pieces[i] not in ("g", "ly") else "") + pieces[i] for i in ids]

    n = len(pieces) + 1
    sents = [Sentence(list(range(len(pieces))) + [99], [2], {}) for _ in range(4)]
    found = attach_arcs(sents, [text] * 4, [Tree(words, heads, rels)] * 4, Split(words))
    units = sents[0].units
    assert found.unmatched == [] and units == [[0], [1], [2, 3], [4], [5], [6], [7, 8]]
    assert (2, 0, "det") in sents[0].arcs and (3, 5, "obj") in sents[0].arcs  # dobj → obj
    # the planted head: every piece of a word looks at the *last* piece of its head word (a
    # subword head scored at its first piece would miss "do g" → "sees", and quickly's pieces
    # look at sees), the root at itself, EOS at EOS
    unit_of = {p: w for w, ps in enumerate(units) for p in ps}
    target = [units[heads[unit_of[p]]][-1] if heads[unit_of[p]] >= 0 else p
              for p in range(len(pieces))] + [n - 1]
    on_arcs = _one_hot(target, n)
    prev = _one_hot([max(i - 1, 0) for i in range(n)], n)
    maps = [np.stack([np.stack([on_arcs, prev])])] * 4
    result = syntactic(maps, [s.units for s in sents], [s.arcs for s in sents], found.offsets)
    for rel in ("nsubj", "obj", "amod", "advmod", "det"):
        assert result[f"{rel} dep→head"]["accuracy"][0, 0] == 1.0
        assert result[f"{rel} dep→head"]["arcs"] == 4 * (2 if rel == "det" else 1)
    for rel in ("nsubj", "obj", "amod", "advmod"):  # one arc each: one offset
        assert result[f"{rel} dep→head"]["baseline"] == 1.0
    assert result["det dep→head"]["baseline"] == 0.5  # the→dog at +2 words, a→cat at +1
    # the previous-piece head, at word level, is the previous word: a→sees is wrong, cat→a too
    assert result["obj dep→head"]["accuracy"][0, 1] == 0.0
    assert result["amod dep→head"]["accuracy"][0, 1] == 0.0  # big → the, not dog
    assert result["nsubj head→dep"]["accuracy"][0, 1] == 1.0  # sees → dog, the previous word
    assert "case dep→head" not in result  # no arcs, no entry
    # a baseline below 1: two amod arcs at different offsets
    off = {"amod dep→head": Counter({1: 3, 2: 1})}
    mixed = syntactic(maps, [s.units for s in sents], [s.arcs for s in sents], off)
    assert mixed["amod dep→head"]["baseline"] == 0.75


def test_head_distances_are_clarks_js_per_query_across_layers():
    from scipy.spatial.distance import jensenshannon

    rng = np.random.default_rng(1)
    n = 5
    a = _one_hot([0] * n, n)
    b = _one_hot([1] * n, n)
    c = rng.dirichlet(np.ones(n), size=n)
    maps = [np.stack([np.stack([a, a]), np.stack([b, c])])]  # 2 layers × 2 heads
    d = head_distances(maps)
    assert d.shape == (4, 4) and d[0, 1] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(d, d.T, atol=1e-12)

    def ref(p, q):  # scipy's JS distance is the square root of the divergence (natural log)
        p, q = 0.999 * p + 0.001 / n, 0.999 * q + 0.001 / n
        return np.mean([jensenshannon(p[i], q[i]) ** 2 for i in range(n)])

    heads = [a, a, b, c]
    for i in range(4):
        for j in range(4):
            assert d[i, j] == pytest.approx(ref(heads[i], heads[j]), rel=1e-9, abs=1e-12)
    assert d[0, 2] < np.log(2) and d[0, 2] == pytest.approx(np.log(2), rel=0.01)
    # per query: a sentence twice as long with the same rows gives the same distance
    long = [np.concatenate([maps[0], maps[0]], axis=2)]
    long = [np.pad(m, ((0, 0), (0, 0), (0, 0), (0, 0))) for m in long]
    assert head_distances(long)[0, 2] == pytest.approx(d[0, 2], rel=1e-9)
    assert diversity(d, 2) == [pytest.approx(0.0, abs=1e-12), pytest.approx(d[2, 3])]


def test_head_map_of_a_non_euclidean_matrix_is_finite():
    """Four heads of a talking-heads model after 40 steps: classical MDS's second eigenvalue is
    negative (scikit-learn's start took its root: NaN, and the analysis failed). The map starts
    from the clipped classical solution and keeps the distances' order."""
    d = np.array([[0.0, 0.043, 0.063, 0.015], [0.043, 0.0, 0.016, 0.1],
                  [0.063, 0.016, 0.0, 0.128], [0.015, 0.1, 0.128, 0.0]])
    xy = mds_coordinates(d)
    assert xy.shape == (4, 2) and np.isfinite(xy).all()
    mapped = np.linalg.norm(xy[:, None] - xy[None], axis=-1)
    far, near = np.unravel_index(np.argmax(d), d.shape), (0, 3)  # 2-3 farthest, 0-3 close
    assert mapped[far] == mapped.max() and mapped[near] < 0.5 * mapped[far]
    np.testing.assert_allclose(mds_coordinates(d), xy)  # the same map each time


def test_head_map_puts_identical_heads_together_and_groups_apart(tmp_path):
    from heads_lab.output import figures

    # two groups of three identical heads, the groups far apart
    d = np.full((6, 6), 0.6)
    d[:3, :3] = d[3:, 3:] = 0.0
    xy = mds_coordinates(d)
    assert xy.shape == (6, 2)
    within = np.linalg.norm(xy[0] - xy[1]) + np.linalg.norm(xy[3] - xy[5])
    across = np.linalg.norm(xy[0] - xy[3])
    assert within < 1e-3 and across == pytest.approx(0.6, rel=0.05)
    np.testing.assert_allclose(mds_coordinates(d), xy)  # the same map each time
    stats = within_layer(d, 2)
    assert stats[0]["mean"] == 0.0 and stats[1]["to_other_layers"] == pytest.approx(0.6)
    path = figures.head_map({"enc-self": xy.tolist(), "dec-self": xy.tolist()},
                            {"enc-self": 2, "dec-self": 3}, tmp_path)
    assert path.name == "head_map.png" and path.stat().st_size > 1000
    with pytest.raises(ValueError, match="layers"):
        figures.head_map({"enc-self": xy.tolist()}, {"enc-self": 4}, tmp_path)


def test_subwords_are_matched_to_words_by_character_spans():
    text = "The dog, runs"
    pieces = ["▁The", "▁do", "g", ",", "▁runs"]
    spans = piece_spans(pieces)
    assert [text[s:e] for s, e in spans] == ["The", "do", "g", ",", "runs"]
    words = word_spans(text, ["the", "dog", ",", "runs"])
    assert words_to_subwords(words, spans) == [[0], [1, 2], [3], [4]]
    assert word_spans(text, ["cat"]) is None


def test_conllu_is_read_with_ud_names_and_bad_lines_are_named(tmp_path: Path):
    good = tmp_path / "ok.conllu"
    good.write_text("# text = Dogs see cats\n"
                    "1\tDogs\tdog\tNOUN\t_\t_\t2\tnsubj\t_\t_\n"
                    "2\tsee\tsee\tVERB\t_\t_\t0\troot\t_\t_\n"
                    "3-4\tcats\t_\t_\t_\t_\t_\t_\t_\t_\n"
                    "3\tcats\tcat\tNOUN\t_\t_\t2\tobj\t_\t_\n\n", encoding="utf-8")
    (tree,) = read_conllu(good)
    assert (tree.words, tree.heads, tree.rels) == (["Dogs", "see", "cats"], [1, -1, 1],
                                                   ["nsubj", "root", "obj"])
    assert tree.text == "Dogs see cats" and tree.tokens == ["Dogs", "see", "cats"]
    words = ["Dogs", "see", "cats"]
    sents = [Sentence([0, 1, 2, 3], [2], {})]
    attach_arcs(sents, ["Dogs see cats"], read_conllu(good), _Pieces(words))
    assert sents[0].arcs == [(1, 0, "nsubj"), (1, 2, "obj")] and sents[0].units == [[0], [1], [2]]
    bad = tmp_path / "bad.conllu"
    bad.write_text("1\tDogs\tdog\n", encoding="utf-8")
    with pytest.raises(DataError, match="bad.conllu:1: a CoNLL-U line has 10"):
        read_conllu(bad)
    with pytest.raises(DataError, match="no CoNLL-U file"):
        read_conllu(tmp_path / "missing.conllu")


def _result(source, relations):
    one = [[0.5, 0.5]]
    return {"functions": {"enc-self": [["other", "syntactic"]]},
            "head_kinds": {"enc-self": {"head": 2}}, "map_kind": {"enc-self": "head"},
            "grids": {"confidence": {"enc-self": one}, "importance": {"enc-self": one}},
            "diversity": {"enc-self": [1.0]}, "heads": [],
            "within_layer": {"enc-self": [{"mean": 1.0, "std": 0.0, "to_other_layers": None}]},
            "counts": {"enc-self": {"other": 1, "syntactic": 1}},
            "thresholds": {"syntactic_margin": 0.1, "min_arcs": 20},
            "syntax": {"source": source, "relations": relations, "sentences": 10, "matched": 10,
                       "matched_share": 1.0, "unmatched": []}}


def test_analyze_tables_say_why_there_are_no_syntactic_heads_on_real_data(tmp_path):
    from heads_lab.analysis.publish import tables, write_tables

    best = {"layer": 0, "head": 1, "kind": "head", "accuracy": 0.7, "baseline": 0.4, "gain": 0.3}
    gold = tables(_result("gold", {"nsubj dep→head": {"arcs": 12, "baseline": 0.4, "best": best,
                                                      "heads_above_margin": 0}}))
    ((title, syn),) = [t for t in gold if isinstance(t, tuple) and t[0].startswith("syntactic")]
    assert syn["rows"] == [["nsubj dep→head", "12", "0.40", "L0 H1", "0.70", "+0.30", "0"]]
    assert "10 of 10 (100.0 %)" in gold[-1]
    md = write_tables(tmp_path / "analysis.md", gold, "run").read_text().splitlines()
    assert f"## {title}" in md and "| nsubj dep→head | 12 | 0.40 | L0 H1 | 0.70 | +0.30 | 0 |" in md
    assert gold[-1] in md
    none = tables(_result(None, {}))
    assert isinstance(none[-1], str) and "analysis.treebank=" in none[-1]
    assert not any(isinstance(t, tuple) and t[0].startswith("syntactic") for t in none)


def test_lrp_against_importance_is_spearmans_rank_correlation():
    """analysis.json's lrp_vs_importance: ranks, not values (a monotone map is 1, a reversing
    one −1, ties take mean ranks as scipy's), and None where no correlation is defined."""
    from heads_lab.analysis.record import _spearman

    lrp = np.array([0.1, 0.4, 0.2, 0.9, 0.3])
    assert _spearman(lrp, np.exp(10 * lrp)) == pytest.approx(1.0)  # monotone, far from linear
    assert _spearman(lrp, -lrp ** 3) == pytest.approx(-1.0)
    # by hand: ranks 1 4 2 5 3 against 2 2 2 4.5 4.5 (ties at their mean rank) -> Pearson of ranks
    tied = np.array([0.0, 0.0, 0.0, 1.0, 1.0])
    r, t = np.array([1, 4, 2, 5, 3.0]), np.array([2, 2, 2, 4.5, 4.5])
    r, t = r - r.mean(), t - t.mean()
    assert _spearman(lrp, tied) == pytest.approx((r @ t) / np.sqrt((r @ r) * (t @ t)))
    assert _spearman(lrp, np.ones(5)) is None and _spearman(np.ones(5), lrp) is None
    assert _spearman(lrp[:2], lrp[:2]) is None  # two heads: no rank correlation worth a number


def test_roles_take_each_bar_at_its_edge():
    """Each role's bar decides the label at its edge, as docs/analysis.md states it: positional
    at ≥ positional_threshold (0.90) of queries on one offset ≠ 0, rare-word above rare_threshold
    (> 0.50), syntactic at ≥ syntactic_margin (0.10) over the relation's baseline, and only for a
    relation with ≥ min_arcs arcs; syntactic before positional before rare. Accuracies and
    baselines are shares of arcs (k / n), so a gain of exactly 0.10 (12/20 − 10/20, which is
    0.09999999999999998 in floating point) must reach the bar."""
    from types import SimpleNamespace

    from heads_lab.analysis.measures import GRADIENT_MEASURES, MAP_MEASURES
    from heads_lab.analysis.record import _site_heads
    from heads_lab.config.schemas import AnalysisConfig

    cfg = AnalysisConfig()
    assert (cfg.positional_threshold, cfg.rare_threshold, cfg.syntactic_margin,
            cfg.min_arcs) == (0.9, 0.5, 0.1, 20)  # Voita et al.'s bars, and the arcs counted
    heads = 9
    share = np.array([[27 / 30, 26 / 30, 1.0, 0.2, 0.2, 0.95, 0.2, 0.2, 0.2]])
    offset = np.array([[-1, 1, 0, -1, -1, 1, -1, -1, -1]])
    rare = np.array([[0.1, 0.1, 0.1, 0.51, 0.5, 0.1, 0.1, 0.1, 0.1]])
    det = np.array([[0.5, 0.5, 0.5, 0.5, 0.5, 12 / 20, 11 / 20, 0.5, 0.5]])
    obj = np.array([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]])
    m = ({x.name: np.zeros((1, heads)) for x in MAP_MEASURES}
         | {g.name: None for g in GRADIENT_MEASURES}
         | {"positional_share": share, "rare_share": rare})
    s = SimpleNamespace(
        syntactic={"det dep→head": {"arcs": 20, "accuracy": det, "baseline": 10 / 20},
                   "obj dep→head": {"arcs": 19, "accuracy": obj, "baseline": 0.0}},
        positional={"offset": offset, "self": np.zeros((1, heads)),
                    "prev": np.zeros((1, heads)), "next": np.zeros((1, heads))})
    labels, entries = _site_heads("enc-self", "qk", m, s, cfg)
    assert labels == [["positional",  # 0.90 at −1: on the bar
                       "other",       # 0.87 at +1: below it
                       "other",       # all on its own token: no position
                       "rare",        # 0.51 on the rarest token
                       "other",       # 0.50: not above half
                       "syntactic",   # det +0.10 exactly; positional too, syntactic first
                       "other",       # det +0.05
                       "other",       # obj +1.00, but on 19 arcs (min_arcs 20)
                       "other"]]
    assert entries[5]["syntactic_relations"] == ["det dep→head"]
    assert entries[5]["positional"]["is_positional"] and entries[0]["positional"]["is_positional"]
    assert [e["rare"]["is_rare"] for e in entries[3:5]] == [True, False]
    # a narrower bar moves exactly the heads at its edge
    strict = AnalysisConfig(positional_threshold=0.91, syntactic_margin=0.11, min_arcs=19)
    labels, _ = _site_heads("enc-self", "qk", m, s, strict)
    assert labels[0][0] == "other" and labels[0][5] == "positional"
    assert labels[0][7] == "syntactic"  # obj now counted
