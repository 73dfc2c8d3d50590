"""An embedded, procedurally generated language pair that behaves like a real WMT pair.

The source language is English-like: SVO, adjectives before the noun, little morphology. The
target language differs the way German or French do:
  * adjectives follow the noun, in mirrored order, and agree with it in gender and number;
  * nouns have a lexical gender, a gender-specific plural and are capitalised; determiners mark
    gender, number and case (masculine accusative), so the object's article depends on its role;
  * the finite verb agrees with the subject in person and number; the past tense is an auxiliary
    plus a participle at the end of the clause (one source word → two target words, far apart);
  * main clauses put the adverb right after the finite verb (source: clause-final); subordinate
    clauses are verb-final, with the adverb after the subject;
  * many-to-one mappings: 'very' + adjective → one intensified adjective, 'lo'/'la' (he/she) →
    one pronoun, and a few source synonyms share one target word.
Word frequencies are Zipfian, so rare words exist; half the lemmas are cognates (the target form
is a sound-shifted copy of the source), as in related real languages.

For head-analysis studies (off by default) the source can also be ambiguous the way real text is,
so that the encoder has to look at other words: polysemous verbs and adjectives whose translation
follows the class (animate or not) of a syntactically related noun (data.p_polysemy), noun/verb
homographs told apart by their neighbours (data.p_homograph), and adverbs between subject and
verb (data.p_preverbal_adverb), which make the subject-verb distance vary.

Every pair carries the gold word alignment and the source dependency tree (head and relation of
each source token: nsubj, dobj, amod, advmod, det, mark, advcl, ccomp, punct, root), for head
analysis. Everything is a pure function of the config: the same seed gives the same corpus.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
from dataclasses import dataclass, field

from heads_lab.config.schemas import SyntheticDataConfig

SRC_SYLLABLE = (["p", "t", "k", "b", "d", "g", "m", "n", "l", "r", "s", "f", "v", "w", "th", "sh"],
                ["a", "e", "i", "o", "u", "ea", "oo", "ai"])
TGT_SYLLABLE = (["p", "t", "k", "b", "d", "g", "m", "n", "l", "r", "s", "f", "w", "z", "sch", "kr"],
                ["a", "e", "i", "o", "u", "ä", "ö", "ü", "ei", "au"])
# Regular sound correspondences that turn a source stem into its target cognate.
SOUND_SHIFT = {"p": "pf", "t": "z", "k": "ch", "th": "d", "sh": "sch", "w": "v", "v": "f",
               "oo": "u", "ea": "ie", "ai": "ei", "o": "ö", "u": "ü"}
_SHIFT_RE = re.compile("|".join(sorted(SOUND_SHIFT, key=len, reverse=True)))

# Function words. Source: invariant. Target: by (definite, gender m/f/n or plural, case).
SRC_DET = {"def": "le", "indef": "un", "indef_pl": "sum"}
TGT_DET = {("def", 0): "dar", ("def", 1): "dia", ("def", 2): "dos", ("def", 3): "dei",
           ("indef", 0): "ain", ("indef", 1): "aina", ("indef", 2): "ain", ("indef", 3): "ainige"}
TGT_DET_ACC_M = {"def": "dan", "indef": "ainan"}  # masculine singular objects
TGT_PLURAL = ["e", "en", "er"]  # by gender
TGT_ADJ_AGREE = ["o", "a", "e", "i"]  # m, f, n singular; plural
SRC_PRONOUNS = ["mi", "tu", "lo", "la", "nos", "vos", "los"]  # lo/la: he/she
PRONOUN_PERSON = [0, 1, 2, 2, 3, 4, 5]  # person-number slot: 1sg 2sg 3sg 1pl 2pl 3pl
TGT_PRONOUNS = ["ikk", "duu", "err", "wirr", "irr", "sii"]
TGT_VERB_AGREE = ["e", "st", "t", "en", "t", "en"]
TGT_AUX = "hab"
SUBORDINATORS = [("ke", "dasse", "ccomp"), ("porke", "weyl", "advcl"),
                 ("kwan", "wenne", "advcl"), ("malgre", "obwol", "advcl")]
SRC_VERY, SRC_PAST = "vey", "da"
SRC_ENDINGS = ("", "s", SRC_PAST)  # every source lemma's surface forms stay unambiguous


@dataclass(frozen=True)
class Lemma:
    src: str
    tgt: str
    gender: int = 0  # target nouns: 0 m, 1 f, 2 n
    transitive: bool = True  # verbs
    animate: bool = False  # nouns: the semantic class that picks a polysemous word's sense
    tgt_animate: str | None = None  # polysemous verbs and adjectives: the sense next to an
    # animate noun (their object, else their subject; an adjective's own noun); None: one sense

    def translate(self, animate: bool) -> str:
        """The target stem in a context whose cue noun is (not) animate."""
        return self.tgt_animate if animate and self.tgt_animate else self.tgt


@dataclass
class Pair:
    """One sentence pair: tokens (punctuation split off), the gold alignment as (source token,
    target token) index pairs, and each source token's dependency head (-1: root) and relation."""

    src: list[str]
    tgt: list[str]
    align: list[tuple[int, int]] = field(default_factory=list)
    heads: list[int] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)

    @property
    def src_text(self) -> str:
        return detokenize(self.src)

    @property
    def tgt_text(self) -> str:
        return detokenize(self.tgt)

    def arcs(self) -> list[tuple[int, int, str]]:
        """(head, dependent, relation) for every non-root source token."""
        return [(h, d, r) for d, (h, r) in enumerate(zip(self.heads, self.labels)) if h >= 0]


def detokenize(tokens: list[str]) -> str:
    text = " ".join(tokens).replace(" ,", ",").replace(" .", ".")
    return text[:1].upper() + text[1:]


class Lexicon:
    """Lemmas per word class, ranked by frequency; `sample(cls)` draws Zipf-distributed."""

    def __init__(self, cfg: SyntheticDataConfig):
        rng = random.Random(f"{cfg.seed}/lexicon")
        taken_src = set(SRC_DET.values()) | set(SRC_PRONOUNS) | {SRC_VERY, SRC_PAST}
        taken_src |= {s for s, _, _ in SUBORDINATORS}
        taken_tgt: set[str] = set()
        self.classes: dict[str, list[Lemma]] = {}
        self._cum: dict[str, list[float]] = {}
        for cls, n in (("noun", cfg.nouns), ("verb", cfg.verbs), ("adj", cfg.adjectives),
                       ("adv", cfg.adverbs)):
            lemmas: list[Lemma] = []
            for rank in range(n):
                src = _new_word(rng, SRC_SYLLABLE, rank, n, taken_src, SRC_ENDINGS)
                if rng.random() < cfg.p_cognate:
                    tgt = _SHIFT_RE.sub(lambda m: SOUND_SHIFT[m.group(0)], src)
                    while tgt in taken_tgt:
                        tgt += rng.choice(TGT_SYLLABLE[1])
                    taken_tgt.add(tgt)
                else:
                    tgt = _new_word(rng, TGT_SYLLABLE, rank, n, taken_tgt)
                lemma = Lemma(src, tgt, rng.randrange(3), rng.random() < 0.75)
                if rank > 10 and rng.random() < cfg.p_synonym:  # shares a more frequent translation
                    other = lemmas[rng.randrange(rank)]
                    lemma = Lemma(src, other.tgt, other.gender, other.transitive)
                lemmas.append(lemma)
            self.classes[cls] = lemmas
            self._cum[cls] = list(itertools.accumulate((r + 1) ** -cfg.zipf for r in range(n)))
        # Senses come from a stream of their own, so the words above (and every sentence's
        # source side) are the same whatever p_polysemy is.
        senses = random.Random(f"{cfg.seed}/senses")
        for cls, lemmas in self.classes.items():
            for rank, lemma in enumerate(lemmas):
                animate = cls == "noun" and senses.random() < 0.5
                second = None
                if cls in ("verb", "adj") and senses.random() < cfg.p_polysemy:
                    second = _new_word(senses, TGT_SYLLABLE, rank, len(lemmas), taken_tgt)
                lemmas[rank] = dataclasses.replace(lemma, animate=animate, tgt_animate=second)
        # Noun/verb homographs ("run", "love"): a verb takes the source stem of a noun of about
        # its frequency; only the context (a determiner or adjective before a noun, a subject
        # before a verb) tells which word it is. Their other forms ("-s", "-da") stay apart.
        if cfg.p_homograph:
            nouns, verbs = self.classes["noun"], self.classes["verb"]
            for rank, verb in enumerate(verbs):
                if senses.random() < cfg.p_homograph:
                    noun = nouns[min(len(nouns) - 1, rank * len(nouns) // len(verbs))]
                    verbs[rank] = dataclasses.replace(verb, src=noun.src)

    def sample(self, rng: random.Random, cls: str) -> Lemma:
        return rng.choices(self.classes[cls], cum_weights=self._cum[cls])[0]


def _new_word(rng: random.Random, syllables, rank: int, n: int, taken: set[str],
              endings: tuple[str, ...] = ("",)) -> str:
    """A new word whose forms (word + each ending) are all unused; they are then reserved."""
    onsets, vowels = syllables
    length = 1 + (rank >= n // 20) + (rank >= n // 3)  # frequent words are short
    while True:
        word = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(length))
        if rng.random() < 0.5:
            word += rng.choice(["n", "r", "l", "m"])
        forms = {word + e for e in endings}
        if not forms & taken:
            taken.update(forms)
            return word
        length += rng.random() < 0.2


class _Builder:
    """Accumulates one pair; source and target tokens are added with their alignment."""

    def __init__(self):
        self.pair = Pair([], [])

    def src(self, word: str, head: int = -1, label: str = "root") -> int:
        self.pair.src.append(word)
        self.pair.heads.append(head)
        self.pair.labels.append(label)
        return len(self.pair.src) - 1

    def tgt(self, word: str, *aligned: int) -> int:
        self.pair.tgt.append(word)
        j = len(self.pair.tgt) - 1
        self.pair.align.extend((i, j) for i in aligned)
        return j


class Grammar:
    def __init__(self, cfg: SyntheticDataConfig):
        self.cfg, self.lex = cfg, Lexicon(cfg)

    def sentence(self, rng: random.Random) -> Pair:
        b = _Builder()
        target = self._clause(rng, b, depth=0, sub=None)
        b.tgt(".", b.src(".", target, "punct"))
        b.pair.align.sort()
        return b.pair

    def _noun_phrase(self, rng, role: str):
        """Sampled noun phrase: (pronoun index or None, lemma, plural, definite, adjectives)."""
        cfg = self.cfg
        if role == "subj" and rng.random() < cfg.p_pronoun:
            return rng.randrange(len(SRC_PRONOUNS)), None, False, False, []
        adjectives = []
        while len(adjectives) < 2 and rng.random() < cfg.p_adjective / (1 + len(adjectives)):
            adjectives.append((self.lex.sample(rng, "adj"), rng.random() < cfg.p_very))
        return None, self.lex.sample(rng, "noun"), rng.random() < cfg.p_plural, \
            rng.random() < 0.6, adjectives

    def _clause(self, rng, b: _Builder, depth: int, sub) -> int:
        """Emits one clause (and its subordinate clauses); returns the source verb's index.
        The source is built left to right; target tokens are emitted in target order."""
        cfg, lex = self.cfg, self.lex
        subj = self._noun_phrase(rng, "subj")
        verb = lex.sample(rng, "verb")
        obj = self._noun_phrase(rng, "obj") if verb.transitive else None
        past = rng.random() < cfg.p_past
        adverb = lex.sample(rng, "adv") if rng.random() < cfg.p_adverb else None
        # drawn only when asked for, so the default corpus stays as it was
        early = bool(adverb and cfg.p_preverbal_adverb and rng.random() < cfg.p_preverbal_adverb)

        # Source order: [SUB] SUBJ [ADV] VERB [OBJ] [ADV] (the adverb in one of the two slots);
        # heads are patched once the verb index exists.
        mark = b.src(sub[0], -2, "mark") if sub else None
        subj_src = self._src_np(b, subj)
        adv = b.src(adverb.src, -2, "advmod") if early else None
        v = b.src(verb.src + (SRC_PAST if past else ""), -1, "root")
        obj_src = self._src_np(b, obj) if obj else None
        if adverb and not early:
            adv = b.src(adverb.src, v, "advmod")
        for i, label in ((mark, "mark"), (subj_src[0], "nsubj"),
                         (obj_src[0] if obj_src else None, "dobj"), (adv, "advmod")):
            if i is not None:
                b.pair.heads[i], b.pair.labels[i] = v, label

        person = PRONOUN_PERSON[subj[0]] if subj[0] is not None else (5 if subj[2] else 2)
        finite_src = v
        # A polysemous verb's sense follows its object's class (intransitive: its subject's),
        # so the finite verb, which precedes the object in a main clause, needs the object.
        stem = verb.translate(_animate(obj if obj else subj))
        finite = (TGT_AUX if past else stem) + TGT_VERB_AGREE[person]
        participle = "ge" + stem + "t"
        # Target order: main SUBJ FIN [ADV] [OBJ] [PART]; subordinate SUB SUBJ [ADV] [OBJ] [PART] FIN
        if sub:
            b.tgt(sub[1], mark)
        self._tgt_np(b, subj, subj_src, "subj")
        if not sub:
            b.tgt(finite, finite_src)
        if adverb:
            b.tgt(adverb.tgt, adv)
        if obj:
            self._tgt_np(b, obj, obj_src, "obj")
        if past:
            b.tgt(participle, v)
        if sub:
            b.tgt(finite, finite_src)

        if depth < cfg.max_depth and rng.random() < cfg.p_subordinate:
            choice = SUBORDINATORS[rng.randrange(len(SUBORDINATORS))]
            b.tgt(",", b.src(",", v, "punct"))
            sub_verb = self._clause(rng, b, depth + 1, choice)
            b.pair.heads[sub_verb], b.pair.labels[sub_verb] = v, choice[2]
        return v

    def _src_np(self, b: _Builder, np) -> tuple[int, list[int], int | None]:
        """Source tokens of a noun phrase: returns (head index, adjective indices, det index);
        the head's own head is set by the caller."""
        pronoun, noun, plural, definite, adjectives = np
        if pronoun is not None:
            return b.src(SRC_PRONOUNS[pronoun]), [], None
        det_word = SRC_DET["def"] if definite else SRC_DET["indef_pl" if plural else "indef"]
        det = b.src(det_word, -2, "det")
        adj_idx = []
        for adj, very in adjectives:
            very_i = b.src(SRC_VERY, -2, "advmod") if very else None
            a = b.src(adj.src, -2, "amod")
            if very_i is not None:
                b.pair.heads[very_i] = a
            adj_idx.append(a)
        n = b.src(noun.src + ("s" if plural else ""))
        for i in [det, *adj_idx]:
            b.pair.heads[i] = n
        return n, adj_idx, det

    def _tgt_np(self, b: _Builder, np, src_idx, role: str) -> None:
        pronoun, noun, plural, definite, adjectives = np
        n, adj_idx, det = src_idx
        if pronoun is not None:
            b.tgt(TGT_PRONOUNS[PRONOUN_PERSON[pronoun]], n)
            return
        slot = 3 if plural else noun.gender
        kind = "def" if definite else "indef"
        word = TGT_DET[(kind, slot)]
        if role == "obj" and slot == 0:
            word = TGT_DET_ACC_M[kind]
        b.tgt(word, det)
        stem = noun.tgt + (TGT_PLURAL[noun.gender] if plural else "")
        b.tgt(stem[:1].upper() + stem[1:], n)
        for (adj, very), a in reversed(list(zip(adjectives, adj_idx))):
            aligned = (a - 1, a) if very else (a,)
            b.tgt(adj.translate(noun.animate) + ("issim" if very else "") + TGT_ADJ_AGREE[slot],
                  *aligned)


def _animate(np) -> bool:
    """A noun phrase's class: pronouns are people; nouns have a lexical class."""
    pronoun, noun = np[0], np[1]
    return pronoun is not None or noun.animate


def generate(cfg: SyntheticDataConfig) -> dict[str, list[Pair]]:
    """The train / valid / test splits. Valid and test come from their own random streams (they
    stay the same when train_size changes); no source sentence occurs twice in the corpus."""
    grammar = Grammar(cfg)
    splits: dict[str, list[Pair]] = {}
    seen: set[str] = set()
    for split, size in (("test", cfg.test_size), ("valid", cfg.valid_size),
                        ("train", cfg.train_size)):
        rng = random.Random(f"{cfg.seed}/{split}")
        pairs: list[Pair] = []
        while len(pairs) < size:
            pair = grammar.sentence(rng)
            key = " ".join(pair.src)
            if key in seen:
                continue
            seen.add(key)
            pairs.append(pair)
        splits[split] = pairs
    return {name: splits[name] for name in ("train", "valid", "test")}
