"""CoNLL-U treebanks for syntactic heads: multiword tokens, empty nodes, relation subtypes, the
words matched to real SentencePiece subwords, bad files named in one line, and the shared PUD
German treebank."""

from __future__ import annotations

import gzip
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from heads_lab.analysis import RELATIONS, Sentence, attach_arcs, read_conllu, syntactic
from heads_lab.analysis.syntax import relation, subword_spans, treebank_split
from heads_lab.data.tokenizer import Tokenizer, train_tokenizer
from heads_lab.errors import DataError

PUD = Path(os.environ.get("HEADS_LAB_DATA", "/nonexistent")) / "ud-pud" / "de_pud-ud-test.conllu.gz"

# "Er geht zum Bahnhof am Montag." with two multiword tokens (zum = zu dem, am = an dem), an
# empty node, and relation subtypes; a second sentence without a translation; a third without
# text.
CONLLU = """# newdoc id = d1
# sent_id = s1
# text = Er geht zum Bahnhof am Montag.
# text_en = He walks to the station on Monday.
1\tEr\ter\tPRON\t_\t_\t2\tnsubj\t_\t_
2\tgeht\tgehen\tVERB\t_\t_\t0\troot\t_\t_
3-4\tzum\t_\t_\t_\t_\t_\t_\t_\t_
3\tzu\tzu\tADP\t_\t_\t5\tcase\t_\t_
4\tdem\tder\tDET\t_\t_\t5\tdet\t_\t_
5\tBahnhof\tBahnhof\tNOUN\t_\t_\t2\tobl:arg\t_\t_
5.1\tgeht\tgehen\tVERB\t_\t_\t_\t_\t2:conj\t_
6-7\tam\t_\t_\t_\t_\t_\t_\t_\t_
6\tan\tan\tADP\t_\t_\t8\tcase\t_\t_
7\tdem\tder\tDET\t_\t_\t6\tdet\t_\t_
8\tMontag\tMontag\tNOUN\t_\t_\t2\tobl:tmod\t_\tSpaceAfter=No
9\t.\t.\tPUNCT\t_\t_\t2\tpunct\t_\t_

# sent_id = s2
# text = Obamas Hund schläft.
1\tObamas\tObama\tPROPN\t_\t_\t2\tnmod:poss\t_\t_
2\tHund\tHund\tNOUN\t_\t_\t3\tnsubj\t_\t_
3\tschläft\tschlafen\tVERB\t_\t_\t0\troot\t_\tSpaceAfter=No
4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_

# sent_id = s3
1\tNichts\tnichts\tPRON\t_\t_\t0\troot\t_\t_
"""
TEXTS = ["Er geht zum Bahnhof am Montag.", "Obamas Hund schläft.", "Der Zug fährt zum Bahnhof.",
         "He walks to the station on Monday.", "Am Montag schläft der Hund im Zug."] * 20


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    path = tmp_path_factory.mktemp("spm") / "spm.model"
    train_tokenizer(TEXTS, 60, "bpe", path)
    return Tokenizer(path)


def _write(tmp_path: Path, text: str, gz: bool = False) -> Path:
    path = tmp_path / ("tb.conllu.gz" if gz else "tb.conllu")
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_multiword_tokens_empty_nodes_and_subtypes_are_read(tmp_path, gz):
    first, second, third = read_conllu(_write(tmp_path, CONLLU, gz))
    assert first.words == ["Er", "geht", "zu", "dem", "Bahnhof", "an", "dem", "Montag", "."]
    assert first.tokens == ["Er", "geht", "zum", "Bahnhof", "am", "Montag", "."]
    assert first.token_of == [0, 1, 2, 2, 3, 4, 4, 5, 6]  # the empty node 5.1 is no word
    assert first.heads == [1, -1, 4, 4, 1, 7, 5, 1, 1]
    assert first.text == "Er geht zum Bahnhof am Montag." and first.sent_id == "s1"
    assert first.comments["text_en"] == "He walks to the station on Monday."
    assert [relation(r) for r in first.rels] == ["nsubj", "root", "case", "det", "obl", "case",
                                                 "det", "obl", "punct"]
    assert relation("nmod:poss") == "nmod" and relation("dobj") == "obj"
    assert second.tokens == second.words and third.text is None


def test_words_reach_subwords_through_their_surface_token(tmp_path, tokenizer):
    trees = read_conllu(_write(tmp_path, CONLLU))
    split, kept, indices, left_out = treebank_split(trees, tokenizer, "NFC", None, 100)
    assert indices == [0, 1] and left_out == [{"index": 2, "sent_id": "s3",
                                               "reason": "no '# text = ...' line"}]
    assert split.tgt_text is None and len(split.tgt[0]) == 0  # no translation asked for
    text, ids = split.src_text[0], list(split.src[0])
    spans = subword_spans(tokenizer, text, ids)
    assert len(spans) == len(ids) and tokenizer.encode([text])[0] == ids
    pieces = tokenizer.pieces(ids)
    sentences = [Sentence(list(split.src[i]) + [3], [], {}) for i in range(2)]
    found = attach_arcs(sentences, split.src_text, kept, tokenizer, indices)
    assert found.unmatched == [] and found.shared_arcs == 1  # dem → an inside "am"

    def covered(positions):  # the characters of a word's subwords, spaces dropped
        return "".join(text[spans[j][0]:spans[j][1]] for j in positions).strip()

    units = sentences[0].units  # one per surface token: zum and am are one word each
    assert len(units) == 7 and covered(units[2]) == "zum" and covered(units[4]) == "am"
    arcs = {(rel, covered(units[dep])): covered(units[head]) for head, dep, rel in sentences[0].arcs}
    assert arcs == {("nsubj", "Er"): "geht", ("case", "zum"): "Bahnhof",
                    ("det", "zum"): "Bahnhof", ("obl", "Bahnhof"): "geht",
                    ("case", "am"): "Montag", ("obl", "Montag"): "geht"}
    assert sentences[1].arcs[0][2] == "nmod" and pieces[0].startswith("▁")  # nmod:poss
    # word offsets for the baselines count the same words (surface tokens) the maps are
    # converted to: zum → Bahnhof is +1, am → Montag +1
    assert found.offsets["case dep→head"] == Counter({1: 2})
    assert found.offsets["det dep→head"] == Counter({1: 1})  # dem → Bahnhof; dem → an skipped


def test_a_translation_line_becomes_the_target_and_missing_ones_are_listed(tmp_path, tokenizer):
    trees = read_conllu(_write(tmp_path, CONLLU))
    split, kept, indices, left_out = treebank_split(trees, tokenizer, "NFC", "text_en", 100)
    assert indices == [0] and [x["sent_id"] for x in left_out] == ["s2", "s3"]
    assert left_out[0]["reason"] == "no '# text_en = ...' line"
    assert split.tgt_text == ["He walks to the station on Monday."]
    assert list(split.tgt[0]) == tokenizer.encode(split.tgt_text)[0]
    short = len(tokenizer.encode(["Obamas Hund schläft."])[0])
    _, kept, _, too_long = treebank_split(trees[:2], tokenizer, "NFC", None, short)
    assert [t.sent_id for t in kept] == ["s2"]
    assert too_long == [{"index": 0, "sent_id": "s1",
                         "reason": f"over {short} subwords (model.max_positions)"}]
    with pytest.raises(DataError, match="no sentence of the treebank can be analysed .the first: "
                                        "no '# text = ...' line"):
        treebank_split(trees[2:], tokenizer, "NFC", None, 100)


def test_a_token_missing_from_the_text_is_listed_as_unmatched(tmp_path, tokenizer):
    (tree,) = read_conllu(_write(tmp_path, CONLLU.split("\n\n")[1]))
    sentences = [Sentence(tokenizer.encode(["Obamas Katze schläft."])[0] + [3], [], {})]
    found = attach_arcs(sentences, ["Obamas Katze schläft."], [tree], tokenizer, [7])
    assert found.unmatched == [{"index": 7, "sent_id": "s2",
                                "reason": "token 'Hund' not found in the text"}]
    assert sentences[0].arcs == []


@pytest.mark.parametrize("text, message", [
    ("1\tEr\ter\n", "tb.conllu:1: a CoNLL-U line has 10 tab-separated columns, this one 3"),
    ("1\tEr\t_\t_\t_\t_\tx\tnsubj\t_\t_\n", "tb.conllu:1: HEAD 'x' is not a number"),
    ("2\tEr\t_\t_\t_\t_\t0\troot\t_\t_\n", "tb.conllu:1: word id '2' out of order: expected 1"),
    ("4-3\tzum\t_\t_\t_\t_\t_\t_\t_\t_\n", "tb.conllu:1: bad multiword token id '4-3'"),
    ("# text = x\n1\tEr\t_\t_\t_\t_\t5\tnsubj\t_\t_\n", "tb.conllu:1: the sentence has 1 words "
                                                        "but a HEAD 5"),
    ("# nothing\n\n", "holds no CoNLL-U sentence"),
])
def test_bad_conllu_is_one_error_naming_file_and_line(tmp_path, text, message):
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_conllu(_write(tmp_path, text))


def test_unreadable_treebank_files_are_named(tmp_path):
    latin = tmp_path / "latin1.conllu"
    latin.write_bytes("# text = Straße\n".encode("latin-1"))
    with pytest.raises(DataError, match="is not UTF-8 text"):
        read_conllu(latin)
    broken = tmp_path / "broken.conllu.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="cannot read .*broken.conllu.gz"):
        read_conllu(broken)
    with pytest.raises(DataError, match="no CoNLL-U file") as err:
        read_conllu(tmp_path / "missing.conllu.gz")
    # the example is where the data is for anyone ($HEADS_LAB_DATA), for either language
    assert "$HEADS_LAB_DATA/ud-pud/" in str(err.value) and "../shared" not in str(err.value)
    assert "en_pud-ud-test.conllu.gz for English" in str(err.value)


@pytest.mark.skipif(not PUD.is_file(), reason="PUD German not found: set HEADS_LAB_DATA to the "
                    "dir holding ud-pud/ (.ci/run points it at ../shared/data)")
def test_the_pud_german_treebank_is_read_and_matched(tmp_path):
    trees = read_conllu(PUD)
    assert len(trees) == 1000
    assert sum(len(t.tokens) != len(t.words) for t in trees) == 261  # multiword tokens
    assert all(t.text and t.comments.get("text_en") for t in trees)
    labels = Counter(relation(r) for t in trees for r in t.rels)
    assert all(labels[r] > 100 for r in RELATIONS)
    path = tmp_path / "spm.model"
    train_tokenizer([t.text for t in trees], 2000, "bpe", path)
    tok = Tokenizer(path)
    split, kept, indices, left_out = treebank_split(trees, tok, "NFC", "text_en", 1023)
    assert left_out == [] and len(kept) == 1000
    sentences = [Sentence(list(split.src[i]) + [3], [], {}) for i in range(len(kept))]
    found = attach_arcs(sentences, split.src_text, kept, tok, indices)
    assert len(found.unmatched) <= 50  # at least 95 % matched (in fact every sentence)
    arcs = Counter(rel for s in sentences for _, _, rel in s.arcs)
    assert set(arcs) == set(RELATIONS) and arcs["det"] > 1000
    # a head that always looks at the previous token scores the baseline's "offset −1" share
    maps = [np.eye(len(s.src), k=-1)[None, None] for s in sentences]
    result = syntactic(maps, [s.units for s in sentences], [s.arcs for s in sentences],
                       found.offsets)
    assert result["amod dep→head"]["arcs"] == arcs["amod"]
    assert result["det dep→head"]["baseline"] > 0.5  # German det is mostly right before its noun


def test_a_treebank_of_another_language_than_the_models_source_is_said_in_one_line():
    from rich.console import Console

    from heads_lab.subjects.trained import _check_treebank_language

    console = Console(record=True, width=300)
    assert _check_treebank_language("/data/en_pud-ud-test.conllu.gz", "de", console) == "en"
    said = console.export_text().strip().splitlines()
    assert len(said) == 1 and "is in 'en', but the model's source language is 'de'" in said[0]
    assert "use a de treebank (e.g. de_pud-ud-test.conllu.gz)" in said[0]
    quiet = Console(record=True, width=300)
    assert _check_treebank_language("/data/de_pud-ud-test.conllu.gz", "de", quiet) == "de"
    assert _check_treebank_language("/data/mine.conllu", "de", quiet) is None  # no UD name
    assert _check_treebank_language(None, "de", quiet) is None  # no treebank: nothing to say
    assert quiet.export_text() == ""
