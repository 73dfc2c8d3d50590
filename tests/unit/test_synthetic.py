"""The embedded language pair: deterministic, and its alignments and arcs tell the truth."""

from __future__ import annotations

from collections import Counter

import pytest

from heads_lab.config.schemas import SyntheticDataConfig
from heads_lab.data import synthetic as syn

CFG = SyntheticDataConfig(train_size=1500, valid_size=100, test_size=150)


@pytest.fixture(scope="module")
def corpus():
    return syn.generate(CFG)


def _all(corpus):
    return [p for split in corpus.values() for p in split]


def test_same_seed_same_corpus_other_seed_other_corpus(corpus):
    again = syn.generate(CFG)
    assert [(p.src, p.tgt, p.align, p.heads, p.labels) for p in _all(again)] == \
           [(p.src, p.tgt, p.align, p.heads, p.labels) for p in _all(corpus)]
    other = syn.generate(SyntheticDataConfig(train_size=1500, valid_size=100, test_size=150, seed=7))
    assert [p.src for p in other["test"]] != [p.src for p in corpus["test"]]


def test_split_sizes_and_held_out_sentences_not_in_train(corpus):
    assert [len(corpus[s]) for s in ("train", "valid", "test")] == [1500, 100, 150]
    held_out = {p.src_text for s in ("valid", "test") for p in corpus[s]}
    assert not held_out & {p.src_text for p in corpus["train"]}


def test_test_set_does_not_depend_on_train_size(corpus):
    bigger = syn.generate(SyntheticDataConfig(train_size=3000, valid_size=100, test_size=150))
    assert [p.tgt_text for p in bigger["test"]] == [p.tgt_text for p in corpus["test"]]


def test_text_is_the_tokens_detokenized(corpus):
    for p in corpus["test"]:
        assert p.src_text.replace(",", " ,").replace(".", " .").lower().split() == \
               [t.lower() for t in p.src]
        assert p.tgt_text[0].isupper() and p.tgt_text.endswith(".")


def test_dependency_trees_are_trees_with_the_required_relations(corpus):
    labels = Counter()
    for p in _all(corpus):
        assert len(p.heads) == len(p.labels) == len(p.src)
        assert p.heads.count(-1) == 1 and p.labels[p.heads.index(-1)] == "root"
        for start in range(len(p.src)):  # every token reaches the root without a cycle
            node, seen = start, set()
            while node != -1:
                assert node not in seen and 0 <= node < len(p.src)
                seen.add(node)
                node = p.heads[node]
        labels.update(p.labels)
    for rel in ("nsubj", "dobj", "amod", "advmod", "det", "mark", "advcl", "ccomp"):
        assert labels[rel] > 20, rel


def test_arcs_link_the_right_words():
    lex = syn.Lexicon(CFG)
    nouns = {l.src for l in lex.classes["noun"]}
    verbs = {l.src for l in lex.classes["verb"]}
    adjectives = {l.src for l in lex.classes["adj"]}
    for p in syn.generate(CFG)["train"][:400]:
        for head, dep, rel in p.arcs():
            h, d = p.src[head].lower(), p.src[dep].lower()
            if rel in ("nsubj", "dobj", "advmod", "mark", "advcl", "ccomp") and d != syn.SRC_VERY:
                assert h in verbs or h.removesuffix(syn.SRC_PAST) in verbs, (rel, h)
            if rel == "amod":
                assert d in adjectives and h.removesuffix("s") in nouns and dep < head
            if rel == "dobj":
                assert d.removesuffix("s") in nouns and dep > head
            if rel == "nsubj":
                assert dep < head


def _translation_table():
    lex = syn.Lexicon(CFG)
    return {l.src: l for cls in lex.classes.values() for l in cls}


def test_alignment_covers_both_sides_and_links_translations(corpus):
    table = _translation_table()
    checked = Counter()
    for p in _all(corpus):
        src_seen = {i for i, _ in p.align}
        tgt_seen = {j for _, j in p.align}
        assert src_seen == set(range(len(p.src))) and tgt_seen == set(range(len(p.tgt)))
        for i, j in p.align:
            s, t = p.src[i].lower(), p.tgt[j].lower()
            lemma = table.get(s) or table.get(s.removesuffix("s")) or \
                table.get(s.removesuffix(syn.SRC_PAST))
            if lemma and p.labels[i] in ("amod", "nsubj", "dobj"):  # content words
                assert t.startswith(lemma.tgt.lower()), (s, t)
                checked[p.labels[i]] += 1
    assert min(checked.values()) > 50


def test_target_morphology_agrees(corpus):
    """Adjectives agree with their noun (gender, number); finite verbs with their subject."""
    table = _translation_table()
    agreements = 0
    for p in corpus["train"]:
        tgt_of = {}
        for i, j in p.align:
            tgt_of.setdefault(i, []).append(j)
        for head, dep, rel in p.arcs():
            if rel == "amod":
                noun_src = p.src[head].lower()
                plural = noun_src not in table
                gender = table[noun_src.removesuffix("s") if plural else noun_src].gender
                adj = p.tgt[tgt_of[dep][0]]
                assert adj.endswith(syn.TGT_ADJ_AGREE[3 if plural else gender])
                assert tgt_of[dep][0] > tgt_of[head][0]  # adjective after the noun
                agreements += 1
            if rel == "nsubj" and p.src[dep].lower() in syn.SRC_PRONOUNS:
                person = syn.PRONOUN_PERSON[syn.SRC_PRONOUNS.index(p.src[dep].lower())]
                finite = p.tgt[min(tgt_of[head])] if p.labels[head] == "root" else \
                    p.tgt[max(tgt_of[head])]
                assert finite.endswith(syn.TGT_VERB_AGREE[person]), (p.src_text, p.tgt_text)
                agreements += 1
    assert agreements > 500


def test_many_to_one_mappings_exist(corpus):
    many = [j for p in _all(corpus) for j, n in Counter(j for _, j in p.align).items() if n > 1]
    assert len(many) > 20  # 'very' + adjective → one intensified adjective
    table = _translation_table()
    targets = Counter(l.tgt for l in table.values())
    assert any(n > 1 for n in targets.values())  # synonyms sharing a translation
    he = syn.TGT_PRONOUNS[syn.PRONOUN_PERSON[syn.SRC_PRONOUNS.index("lo")]]
    she = syn.TGT_PRONOUNS[syn.PRONOUN_PERSON[syn.SRC_PRONOUNS.index("la")]]
    assert he == she


def test_word_frequencies_are_zipfian_with_rare_words(corpus):
    table = _translation_table()
    nouns = {l.src for l in syn.Lexicon(CFG).classes["noun"]}
    counts = Counter(w.lower().removesuffix("s") for p in corpus["train"] for w in p.src
                     if w.lower().removesuffix("s") in nouns)
    ranked = [n for _, n in counts.most_common()]
    assert ranked[0] > 20 * ranked[len(ranked) // 2]
    assert sum(1 for n in ranked if n <= 2) > 50  # rare words exist
    assert len(table) > 600


POLY = SyntheticDataConfig(train_size=1500, valid_size=100, test_size=150, p_polysemy=0.5)


def test_polysemy_changes_translations_only_and_follows_the_cue_noun(corpus):
    poly = syn.generate(POLY)
    assert [p.src for p in _all(poly)] == [p.src for p in _all(corpus)]  # source side unchanged
    lex = syn.Lexicon(POLY)
    assert [l.src for l in lex.classes["verb"]] == [l.src for l in syn.Lexicon(CFG).classes["verb"]]
    two = {l.src: l for cls in ("verb", "adj") for l in lex.classes[cls] if l.tgt_animate}
    assert 0.35 < len(two) / 200 < 0.65 and all(l.tgt_animate != l.tgt for l in two.values())
    nouns = {l.src: l for l in lex.classes["noun"]}
    senses = Counter()
    for p in poly["train"]:
        tgt_of = {}
        for i, j in p.align:
            tgt_of.setdefault(i, []).append(j)
        for head, dep, rel in p.arcs():
            cue, word = (head, dep) if rel == "amod" else (dep, head)
            if rel not in ("amod", "dobj") or p.src[word].lower() not in two:
                continue
            noun = p.src[cue].lower()
            animate = (nouns.get(noun) or nouns[noun.removesuffix("s")]).animate
            lemma = two[p.src[word].lower()]
            stem = (lemma.tgt_animate if animate else lemma.tgt).lower()
            forms = [p.tgt[j].lower() for j in tgt_of[word]]
            assert any(f.startswith(stem) or f == "ge" + stem + "t" for f in forms), (p.src, p.tgt)
            senses[animate] += 1
    assert senses[True] > 50 and senses[False] > 50


def test_preverbal_adverbs_vary_the_subject_verb_distance():
    pairs = syn.generate(SyntheticDataConfig(train_size=800, valid_size=50, test_size=50,
                                             p_preverbal_adverb=0.5))["train"]
    offsets = Counter(head - dep for p in pairs for head, dep, rel in p.arcs() if rel == "nsubj")
    early = sum(1 for p in pairs for head, dep, rel in p.arcs() if rel == "advmod" and dep < head
                and p.src[dep].lower() != syn.SRC_VERY)
    assert early > 50 and offsets[1] < 0.9 * sum(offsets.values()) and offsets[2] > 50


def test_homographs_share_a_noun_stem_and_keep_their_own_translation():
    cfg = SyntheticDataConfig(train_size=1500, valid_size=50, test_size=50, p_homograph=0.5)
    lex = syn.Lexicon(cfg)
    nouns = {l.src: l for l in lex.classes["noun"]}
    shared = [v for v in lex.classes["verb"] if v.src in nouns]
    assert 30 < len(shared) < 70
    shared_src = {v.src: v for v in shared}
    seen = Counter()
    for p in syn.generate(cfg)["train"]:
        tgt_of = dict(p.align)  # source index → (last) target index
        for i, word in enumerate(p.src):
            if word.lower() in shared_src:
                lemma = shared_src[word.lower()] if p.labels[i] in ("root", "advcl", "ccomp") \
                    else nouns[word.lower()]
                assert lemma.tgt.lower() in p.tgt[tgt_of[i]].lower(), (p.src, p.tgt)
                seen[p.labels[i] in ("root", "advcl", "ccomp")] += 1
    assert seen[True] > 30 and seen[False] > 30  # the same form as a verb and as a noun
