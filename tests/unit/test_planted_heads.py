"""The positive control of the head analysis: a model whose encoder heads are planted (through
heads.planted) to attend to the previous token, to the token itself, to each word's syntactic
head on gold trees, to EOS, and to the sentence's rarest source token (by the training data's
counts). `analyze` must give each its role exactly, on a hand-written
CoNLL-U treebank with multiword tokens (zum = zu dem, im = in dem) and words split into
subwords."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from heads_lab.analysis import read_conllu, word_spans, words_to_subwords
from heads_lab.analysis.subject import analyze
from heads_lab.analysis.syntax import subword_spans, treebank_split
from heads_lab.data import Corpus, Split
from heads_lab.data.tokenizer import EOS, Tokenizer, train_tokenizer
from heads_lab.model import Transformer
from heads_lab.model.heads import planted
from tests.conftest import TINY, compose

ROWS = [  # id, form, head, relation; "a-b" a multiword token
    ("Er geht zum Bahnhof am Montag.",
     [("1", "Er", 2, "nsubj"), ("2", "geht", 0, "root"), ("3-4", "zum"), ("3", "zu", 5, "case"),
      ("4", "dem", 5, "det"), ("5", "Bahnhof", 2, "obl"), ("6-7", "am"), ("6", "an", 8, "case"),
      ("7", "dem", 8, "det"), ("8", "Montag", 2, "obl:tmod"), ("9", ".", 2, "punct")]),
    ("Die kleine Katze schläft im Garten.",
     [("1", "Die", 3, "det"), ("2", "kleine", 3, "amod"), ("3", "Katze", 4, "nsubj"),
      ("4", "schläft", 0, "root"), ("5-6", "im"), ("5", "in", 7, "case"), ("6", "dem", 7, "det"),
      ("7", "Garten", 4, "obl"), ("8", ".", 4, "punct")]),
    ("Der alte Mann liest das Buch.",
     [("1", "Der", 3, "det"), ("2", "alte", 3, "amod"), ("3", "Mann", 4, "nsubj"),
      ("4", "liest", 0, "root"), ("5", "das", 6, "det"), ("6", "Buch", 4, "obj"),
      ("7", ".", 4, "punct")]),
    ("Ein Hund sieht den großen roten Ball.",
     [("1", "Ein", 2, "det"), ("2", "Hund", 3, "nsubj"), ("3", "sieht", 0, "root"),
      ("4", "den", 7, "det"), ("5", "großen", 7, "amod"), ("6", "roten", 7, "amod"),
      ("7", "Ball", 3, "obj"), ("8", ".", 3, "punct")]),
]
COPIES = 6  # each sentence six times: 24 sentences, ≥ 12 arcs per relation counted


def _conllu() -> str:
    out = []
    for copy in range(COPIES):
        for i, (text, rows) in enumerate(ROWS):
            out += [f"# sent_id = s{copy}-{i}", f"# text = {text}"]
            for row in rows:
                if "-" in row[0]:
                    out.append(f"{row[0]}\t{row[1]}" + "\t_" * 8)
                else:
                    out.append(f"{row[0]}\t{row[1]}\t_\t_\t_\t_\t{row[2]}\t{row[3]}\t_\t_")
            out.append("")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planted")
    treebank = tmp / "planted.conllu.gz"
    treebank.write_bytes(gzip.compress(_conllu().encode("utf-8")))
    texts = [text for text, _ in ROWS] * 20
    train_tokenizer(texts, 70, "bpe", tmp / "spm.model")  # small: long words split
    tok = Tokenizer(tmp / "spm.model")
    ids = tok.encode(texts)
    corpus = Corpus(tok, {"train": Split(None, None, ids, ids)})
    run = compose([*TINY, "model.heads=4", "model.encoder_layers=2", "analysis.min_arcs=5",
                   "analysis.rare_top_k=null", f"analysis.treebank={treebank}",
                   "analysis.max_sentences=null"])
    from heads_lab.config.compose import to_object

    run = to_object(run)
    torch.manual_seed(0)
    model = Transformer(run.model, len(tok)).eval()
    return run, model, corpus, tok, treebank


def _plants(tok: Tokenizer, treebank: Path, corpus: Corpus):
    """The planted heads of encoder layer 1 and a rare-word head at layer 0, head 0: weight
    functions of the source ids."""
    trees = read_conllu(treebank)
    split, kept, _, _ = treebank_split(trees, tok, "NFC", None, 200)
    syntactic: dict[tuple[int, ...], np.ndarray] = {}
    for text, tree, src in zip(split.src_text, kept, split.src):
        src = list(src) + [EOS]
        units = words_to_subwords(word_spans(text, tree.tokens),
                                  subword_spans(tok, text, src[:-1]))
        n = len(src)
        w = np.eye(n)  # root, punctuation heads' own pieces and EOS: themselves
        for word, head in enumerate(tree.heads):
            here, there = tree.token_of[word], tree.token_of[head] if head >= 0 else None
            if there is None or there == here or w[units[here][0]].argmax() != units[here][0]:
                continue  # the root, a head inside its own token, or already planted
            for p in units[here]:  # every piece of the word looks at its head word's pieces
                w[p] = 0.0
                w[p, units[there]] = 1.0 / len(units[there])
        syntactic[tuple(src)] = w
    assert any(len(src) - 1 > len(tree.tokens) for tree, src in zip(kept, split.src))  # split
    rng = np.random.default_rng(0)

    def rows(src: torch.Tensor, fill) -> torch.Tensor:
        out = torch.zeros(src.shape[0], src.shape[1], src.shape[1])
        for b in range(src.shape[0]):
            n = int((src[b] != 0).sum())
            out[b, :n, :n] = torch.as_tensor(fill(src[b, :n].tolist(), n))
        return out

    def previous(ids, n):  # the previous token (the first: itself)
        return np.eye(n, k=-1) + np.diag([1.0] + [0.0] * (n - 1))

    def eos(ids, n):  # 0.98 on EOS, the rest spread at random over the real tokens
        w = 0.02 * rng.dirichlet(np.ones(n - 1), size=n)
        return np.concatenate([w, np.full((n, 1), 0.98)], axis=1)

    train = corpus.splits["train"]
    freq = Counter(int(t) for i in range(len(train)) for t in train.src[i])

    def rarest(ids, n):  # each query: one of the least frequent tokens (EOS not one), at random
        f = np.array([freq.get(t, 0) for t in ids[:-1]])
        w = np.zeros((n, n))
        w[np.arange(n), rng.choice(np.flatnonzero(f == f.min()), size=n)] = 1.0
        return w

    return {(0, 0): lambda s: rows(s, rarest), (1, 0): lambda s: rows(s, previous),
            (1, 1): lambda s: rows(s, lambda i, n: np.eye(n)),
            (1, 2): lambda s: rows(s, lambda i, n: syntactic[tuple(i)]),
            (1, 3): lambda s: rows(s, eos)}


def _subject(run, model, corpus):
    """The model as analyze reads a run trained here (heads_lab/subjects/trained.py)."""
    from heads_lab.subjects.trained import TrainedSubject
    from heads_lab.training.runs import Trained

    run.trainer.max_tokens = 4096
    trained = Trained(run, {}, model, corpus, torch.device("cpu"), ["planted"])
    return TrainedSubject(Path("planted"), trained, "analyze")


def test_analyze_finds_every_planted_head_and_only_its_role(setup):
    run, model, corpus, tok, treebank = setup
    with planted(model, _plants(tok, treebank, corpus)):
        result, sentences = analyze(_subject(run, model, corpus), run.analysis)
    assert result["sentences"] == 4 * COPIES and result["syntax"]["matched"] == 4 * COPIES
    assert result["syntax"]["arcs_within_a_token"] == 0  # zu, dem of zum: heads outside it
    assert any(len(u) > 1 for s in sentences for u in s.units)  # words split into subwords
    heads = {(h["layer"], h["head"]): h for h in result["heads"] if h["site"] == "enc-self"}
    prev, own, syn, eos = (heads[1, h] for h in range(4))
    # previous token: positional at −1, exactly
    assert prev["function"] == "positional"
    assert prev["positional"]["offset"] == -1 and prev["positional"]["share"] == 1.0
    # its own token: reported apart, not positional, no role
    assert own["function"] == "other" and own["positional"]["self_share"] == 1.0
    assert not own["positional"]["is_positional"] and own["syntactic_relations"] == []
    from heads_lab.analysis.publish import position_tables  # the positions table shows no offset
    (enc,) = [t for title, t in position_tables(result) if title.startswith("enc-self")]
    assert enc["rows"][1][1 + 1] == "– · self 1.00" and enc["rows"][1][1].startswith("-1 1.00P")
    # each word's syntactic head: every dep→head relation at accuracy 1, and syntactic for the
    # relations whose word-offset baseline it beats by the margin
    assert syn["function"] == "syntactic"
    for key, score in syn["syntactic"].items():
        if key.endswith("dep→head") and not key.startswith("punct"):
            assert score["accuracy"] == 1.0, key
    assert {"det dep→head", "amod dep→head", "obl dep→head"} <= set(syn["syntactic_relations"])
    for always_next in ("nsubj dep→head", "case dep→head"):  # at +1 always: the baseline is 1.0
        assert always_next not in syn["syntactic_relations"]
    relations = result["syntax"]["relations"]
    assert relations["det dep→head"]["best"]["head"] == 2
    assert relations["det dep→head"]["best"]["accuracy"] == 1.0
    assert relations["det dep→head"]["baseline"] < 0.9
    # EOS: no role, and no confidence on the real tokens (EOS is not a key)
    assert eos["function"] == "other" and eos["confidence"] <= 0.02 + 1e-6
    assert eos["syntactic_relations"] == [] and not eos["positional"]["is_positional"]
    # the rarest token, whichever of the tied ones: a rare-word head, and nothing else is
    rare = heads[0, 0]
    assert rare["function"] == "rare" and rare["rare"]["share"] == 1.0 and rare["rare"]["is_rare"]
    assert not any(h["rare"]["is_rare"] for key, h in heads.items() if key != (0, 0))
    # the planted heads, not the random ones of layer 0, are what the measures find
    assert all(heads[0, h]["function"] == "other" for h in range(1, 4))
    # the syntactic-gain grid: each head's best accuracy − baseline over the relations counted
    counted = [k for k, v in relations.items() if v["arcs"] >= run.analysis.min_arcs]
    gain = result["grids"]["syntactic_gain"]["enc-self"]
    assert gain[1][2] == pytest.approx(max(1.0 - relations[k]["baseline"] for k in counted
                                           if k.endswith("dep→head") and not k.startswith("punct")))
    for (layer, head), h in heads.items():
        assert gain[layer][head] == pytest.approx(max(h["syntactic"][k]["gain"] for k in counted))


def test_a_new_map_measure_plugs_in_through_the_declared_list(setup, monkeypatch, tmp_path):
    """analysis/measures.py's recipe: one MEASURES entry (and its function) puts a measure in
    analysis.json's grids, in each head's record (entry=True) and in the metric-grid figures.
    The planted own-token head is the one whose diagonal weight is 1."""
    from heads_lab.analysis import measures, record
    from heads_lab.output import figures

    def diagonal(s):  # mean weight a query gives its own token, [layers, heads]
        return np.mean([np.diagonal(m, axis1=-2, axis2=-1).mean(-1) for m in s.maps], axis=0)

    plugged = (*measures.MEASURES, measures.MapMeasure("own_token", diagonal, entry=True))
    monkeypatch.setattr(record, "MEASURES", plugged)
    monkeypatch.setattr(record, "MAP_MEASURES", tuple(m for m in plugged
                                                      if isinstance(m, measures.MapMeasure)))
    run, model, corpus, tok, treebank = setup
    with planted(model, _plants(tok, treebank, corpus)):
        result, _ = analyze(_subject(run, model, corpus), run.analysis)
    grid = np.array(result["grids"]["own_token"]["enc-self"], dtype=float)
    assert grid.shape == (2, 4) and grid[1, 1] == pytest.approx(1.0)
    assert np.nanmax(np.delete(grid[1], 1)) < 0.5  # the others: previous token, syntax, EOS
    heads = {(h["layer"], h["head"]): h for h in result["heads"] if h["site"] == "enc-self"}
    assert heads[1, 1]["own_token"] == pytest.approx(1.0)
    pngs = figures.metric_grids(result["grids"], tmp_path)
    assert tmp_path / "heads_own_token.png" in pngs
