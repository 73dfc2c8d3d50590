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
    js_distances,
    piece_spans,
    positional,
    rare_share,
    read_conllu,
    syntactic,
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
    share, offset = positional(maps, skip_last_query=True)
    # query 0 has no previous token: the share is over the 10 queries where −1 exists
    assert offset[0, 0] == -1 and share[0, 0] == 1.0
    assert share[0, 1] == pytest.approx(1 / 11)  # argmax of a uniform row: key 0
    conf = confidence(maps, skip_last_query=True)
    assert conf[0, 0] == 1.0 and conf[0, 1] == pytest.approx(1 / n)


def test_positional_share_counts_only_queries_where_the_offset_exists():
    # previous-token heads on a 4-token and a 7-token sentence (EOS query left out), one miss
    # each (the miss points at the last key)
    def prev_head(n: int, miss: int) -> np.ndarray:
        targets = [max(i - 1, 0) for i in range(n)]
        targets[miss] = n - 1
        return np.stack([np.stack([_one_hot(targets, n)])])

    maps = [prev_head(4, miss=2), prev_head(7, miss=5)]
    share, offset = positional(maps, skip_last_query=True)
    # −1 exists for queries 1..2 and 1..5: 7 of the 9 queries, 5 of them hit
    assert offset[0, 0] == -1 and share[0, 0] == pytest.approx(5 / 7)
    # an independent count: loop over every query, keep those whose key q − 1 exists
    hits = total = 0
    for m in maps:
        a = m[0, 0]
        for q in range(a.shape[0] - 1):
            if q - 1 >= 0:
                total += 1
                hits += int(a[q].argmax() == q - 1)
    assert share[0, 0] == pytest.approx(hits / total)
    # a causal (decoder) map: offset 0 exists for every query, none is left out
    causal = np.stack([np.stack([np.eye(5)])])
    share, offset = positional([causal], skip_last_query=False)
    assert offset[0, 0] == 0 and share[0, 0] == 1.0


def test_rare_word_head_points_at_the_least_frequent_source_token():
    src = [10, 11, 12, 13, 3]  # 3 = EOS
    freq = {10: 500, 11: 2, 12: 40, 13: 7}
    rare = _one_hot([1] * 5, 5)
    first = _one_hot([0] * 5, 5)
    maps = [np.stack([np.stack([rare, first])])]
    share = rare_share(maps, [src], freq, skip_last_query=True)
    assert share[0, 0] == 1.0 and share[0, 1] == 0.0


class _Pieces:
    """A tokenizer stand-in: one piece per word, with SentencePiece's ▁."""

    def __init__(self, words: list[str]):
        self.words = words

    def pieces(self, ids: list[int]) -> list[str]:
        return ["▁" + self.words[i] for i in ids]

    def encode_spans(self, text: str):
        return [], []  # not SentencePiece: the spans come from the pieces (piece_spans)


def test_a_head_on_gold_arcs_is_syntactic_against_the_offset_baseline():
    # "the big dog sees a cat" with det / amod / nsubj / dobj arcs; word i is subword i
    words = ["the", "big", "dog", "sees", "a", "cat", "quickly"]
    heads = [2, 2, 3, -1, 5, 3, 3]
    rels = ["det", "amod", "nsubj", "root", "det", "dobj", "advmod"]
    n = len(words) + 1
    sents = [Sentence(list(range(len(words))) + [3], [2], {}) for _ in range(4)]
    found = attach_arcs(sents, [" ".join(words).capitalize()] * 4,
                        [Tree(words, heads, rels)] * 4, _Pieces(words))
    offsets = found.offsets
    assert found.unmatched == [] and sents[0].arcs[0] == ([2], [0], "det")
    assert ([2], [1], "amod") in sents[0].arcs and ([3], [5], "obj") in sents[0].arcs  # dobj → obj
    gold = [heads[i] if heads[i] >= 0 else i for i in range(len(words))] + [n - 1]
    on_arcs = _one_hot(gold, n)  # every dependent looks at its head
    prev = _one_hot([max(i - 1, 0) for i in range(n)], n)
    maps = [np.stack([np.stack([on_arcs, prev])])] * 4
    result = syntactic(maps, [s.arcs for s in sents], offsets)
    for rel in ("nsubj", "obj", "amod", "advmod", "det"):
        assert result[f"{rel} dep→head"]["accuracy"][0, 0] == 1.0
        assert result[f"{rel} dep→head"]["arcs"] == 4 * (2 if rel == "det" else 1)
    for rel in ("nsubj", "obj", "amod", "advmod"):  # one arc each: one offset
        assert result[f"{rel} dep→head"]["baseline"] == 1.0
    assert result["det dep→head"]["baseline"] == 0.5  # the→dog at +2, a→cat at +1
    assert result["obj dep→head"]["accuracy"][0, 1] == 0.0  # cat→a, not sees
    assert result["det dep→head"]["accuracy"][0, 1] == 0.0  # a→sees, the→the: never the noun
    assert "case dep→head" not in result  # no arcs, no entry
    # a baseline below 1: two amod arcs at different offsets
    off = {"amod dep→head": Counter({1: 3, 2: 1})}
    mixed = syntactic(maps, [s.arcs for s in sents], off)
    assert mixed["amod dep→head"]["baseline"] == 0.75


def test_identical_heads_have_distance_zero_and_disjoint_heads_one_bit_per_query():
    n = 6
    a = _one_hot([0] * n, n)
    b = _one_hot([1] * n, n)
    maps = [np.stack([np.stack([a, a, b])])]
    d = js_distances(maps)[0]
    assert d[0, 1] == pytest.approx(0.0, abs=1e-6)
    assert d[0, 2] == pytest.approx(n * 1.0, rel=1e-6)  # JS of disjoint one-hots: 1 bit
    np.testing.assert_allclose(d, d.T)
    assert diversity(js_distances(maps)) == [pytest.approx((0 + n + n) / 3, rel=1e-6)]


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
    assert sents[0].arcs == [([1], [0], "nsubj"), ([1], [2], "obj")]
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
            "diversity": {"enc-self": [1.0]}, "counts": {"enc-self": {"other": 1, "syntactic": 1}},
            "thresholds": {"syntactic_margin": 0.1, "min_arcs": 20},
            "syntax": {"source": source, "relations": relations, "sentences": 10, "matched": 10,
                       "matched_share": 1.0, "unmatched": []}}


def test_analyze_tables_say_why_there_are_no_syntactic_heads_on_real_data(tmp_path):
    from heads_lab.analyze_run import tables, write_tables

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
