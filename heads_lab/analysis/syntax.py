"""Dependency trees for syntactic heads, and their words matched to the model's subwords.

Trees come from a CoNLL-U file (Universal Dependencies; `analysis.treebank`, or `analysis.conllu`
aligned with a split) or from the synthetic pair's gold annotations. A CoNLL-U sentence has
syntactic words (ids 1, 2, ...) with a head and a relation, and surface tokens: a multiword
token (`26-27 am`) is one token of the text made of the words `an` and `dem`. Words reach
subwords through their surface token: each token is found left to right in the sentence's text
(case-insensitively), the subwords whose characters overlap its span (SentencePiece's offsets)
are its subwords, and every word of a multiword token gets them all. Empty nodes (`8.1`,
enhanced dependencies only) are skipped; a relation counts as its base (`nmod:poss` → nmod,
`obl:arg` → obl) and the pre-v2 name `dobj` as `obj`.
"""

from __future__ import annotations

import gzip
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from heads_lab.analysis.maps import Sentence
from heads_lab.analysis.metrics import DIRECTIONS, RELATIONS
from heads_lab.data import Split
from heads_lab.data.cleaning import normalize
from heads_lab.errors import DataError

OLD_NAMES = {"dobj": "obj"}


@dataclass
class Tree:
    """One sentence: its syntactic words (form, 0-based head with -1 for the root, relation), its
    surface tokens and each word's token, and the `# key = value` comments (text, sent_id, a
    translation such as text_en)."""

    words: list[str]
    heads: list[int]
    rels: list[str]
    tokens: list[str] = field(default_factory=list)
    token_of: list[int] = field(default_factory=list)
    comments: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.tokens:  # one token per word (no multiword tokens)
            self.tokens, self.token_of = list(self.words), list(range(len(self.words)))

    @property
    def text(self) -> str | None:
        return self.comments.get("text")

    @property
    def sent_id(self) -> str | None:
        return self.comments.get("sent_id")


def relation(label: str) -> str:
    """A UD relation without its subtype, in v2 names: nmod:poss → nmod, dobj → obj."""
    base = label.split(":")[0]
    return OLD_NAMES.get(base, base)


def read_conllu(path: Path) -> list[Tree]:
    """Every sentence of a CoNLL-U file (plain or .gz). A malformed line is a DataError naming
    the file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no CoNLL-U file {path}: give a .conllu or .conllu.gz file of the "
                        "model's source language (e.g. $HEADS_LAB_DATA/ud-pud/"
                        "de_pud-ud-test.conllu.gz for German, en_pud-ud-test.conllu.gz for "
                        "English)")
    opener = gzip.open if path.suffix == ".gz" else open
    trees: list[Tree] = []
    builder = _Builder(path, 1)
    try:
        with opener(path, "rt", encoding="utf-8") as lines:
            for number, raw in enumerate(lines, 1):
                line = raw.rstrip("\r\n")
                if not line.strip():
                    if builder.words:
                        trees.append(builder.tree())
                    builder = _Builder(path, number + 1)
                elif line.startswith("#"):
                    key, sep, value = line[1:].partition("=")
                    if sep:
                        builder.comments[key.strip()] = value.strip()
                else:
                    builder.add(line.split("\t"), number)
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8 text: CoNLL-U files are UTF-8") from None
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError
        raise DataError(f"cannot read {path}: {err}") from None
    if builder.words:
        trees.append(builder.tree())
    if not trees:
        raise DataError(f"{path} holds no CoNLL-U sentence (10 tab-separated columns per word)")
    return trees


class _Builder:
    """One sentence's lines as they are read."""

    def __init__(self, path: Path, first_line: int):
        self.path, self.first_line = path, first_line
        self.words: list[str] = []
        self.heads: list[int] = []
        self.rels: list[str] = []
        self.tokens: list[str] = []
        self.token_of: list[int] = []
        self.comments: dict[str, str] = {}
        self.span: tuple[int, int, int] | None = None  # a multiword token's (first, last, token)

    def add(self, cols: list[str], number: int) -> None:
        where = f"{self.path}:{number}"
        if len(cols) != 10:
            raise DataError(f"{where}: a CoNLL-U line has 10 tab-separated columns, this one "
                            f"{len(cols)}")
        ident = cols[0]
        if "." in ident:  # an empty node: enhanced dependencies only
            return
        if "-" in ident:
            first, _, last = ident.partition("-")
            if not (first.isdigit() and last.isdigit()) or int(last) < int(first):
                raise DataError(f"{where}: bad multiword token id {ident!r} (write e.g. 3-4)")
            self.tokens.append(cols[1])
            self.span = (int(first), int(last), len(self.tokens) - 1)
            return
        if not ident.isdigit() or int(ident) != len(self.words) + 1:
            raise DataError(f"{where}: word id {ident!r} out of order: expected "
                            f"{len(self.words) + 1}")
        if not re.fullmatch(r"\d+", cols[6]):
            raise DataError(f"{where}: HEAD {cols[6]!r} is not a number")
        word = int(ident)
        if self.span and self.span[0] <= word <= self.span[1]:
            self.token_of.append(self.span[2])
        else:
            self.tokens.append(cols[1])
            self.token_of.append(len(self.tokens) - 1)
        self.words.append(cols[1])
        self.heads.append(int(cols[6]) - 1)
        self.rels.append(cols[7])

    def tree(self) -> Tree:
        bad = [h + 1 for h in self.heads if h >= len(self.words)]
        if bad:
            raise DataError(f"{self.path}:{self.first_line}: the sentence has {len(self.words)} "
                            f"words but a HEAD {bad[0]}")
        return Tree(self.words, self.heads, self.rels, self.tokens, self.token_of,
                    dict(self.comments))


# --- words ↔ subwords ------------------------------------------------------------------------

def piece_spans(pieces: list[str]) -> list[tuple[int, int]]:
    """Character spans of SentencePiece pieces in the text they encode, from the pieces alone
    (▁ = a space; the first piece's leading space is not in the text): right when the text is
    already in SentencePiece's normal form."""
    spans, pos = [], 0
    for i, piece in enumerate(pieces):
        text = piece.replace("▁", " ")
        if i == 0 and text.startswith(" "):
            text = text[1:]
        start = pos + (len(text) - len(text.lstrip(" ")))
        pos += len(text)
        spans.append((start, pos))
    return spans


def word_spans(text: str, words: list[str]) -> list[tuple[int, int]] | None:
    """Character spans of `words` found left to right in `text` (None if one is missing)."""
    spans, pos = [], 0
    lowered = text.lower()
    for word in words:
        at = lowered.find(word.lower(), pos)
        if at < 0:
            return None
        spans.append((at, at + len(word)))
        pos = at + len(word)
    return spans


def words_to_subwords(word_span: list[tuple[int, int]],
                      sub_span: list[tuple[int, int]]) -> list[list[int]]:
    """For each word, the subword positions overlapping its characters."""
    return [[j for j, (s, e) in enumerate(sub_span) if s < we and e > ws and e > s]
            for ws, we in word_span]


def subword_spans(tokenizer, text: str, ids: list[int]) -> list[tuple[int, int]]:
    """Each subword's character span in `text`, `ids` being its encoding as the model reads it
    (from the tokenizer's offsets, `encode_spans`: the ids up to the special tokens after the
    text, if any (a source's EOS), so a prefix of `ids`, or `ids` cut short; from the pieces
    alone when `ids` is not what the tokenizer makes of `text`)."""
    got, spans = tokenizer.encode_spans(text)
    n = min(len(got), len(ids))
    if n and list(got[:n]) == list(ids[:n]):
        return list(spans[:n])
    lead = tokenizer.lead(ids) if hasattr(tokenizer, "lead") else 0  # a language model's BOS
    text = ids[lead:len(ids) - getattr(tokenizer, "text_end", 1)]
    return [(0, 0)] * lead + piece_spans(tokenizer.pieces(text))


@dataclass
class Matching:
    """What attach_arcs matched: sentences whose tokens were not found (index, sent_id, reason),
    arcs skipped because both words share subwords (a multiword token's words), and the word
    offsets of each relation and direction (for the baselines)."""

    unmatched: list[dict[str, Any]] = field(default_factory=list)
    shared_arcs: int = 0
    offsets: dict[str, Counter] = field(default_factory=dict)


def attach_arcs(sentences: list[Sentence], texts: list[str], trees: list[Tree | None],
                tokenizer, indices: list[int] | None = None) -> Matching:
    """Put on each sentence its words (`units`: the subword positions of each surface token of
    its tree) and its arcs over those words (head word, dependent word, relation), from its
    tree; `indices` are the sentences' numbers in their source, for the list of unmatched ones.

    The unit of the word-level maps is the surface token: a multiword token (`am` = an + dem) is
    one word whose pieces both syntactic words share, and an arc inside it (dem → an) has no
    attention to measure and is skipped (counted as shared_arcs). Baseline offsets are counted
    over the same units (token of the head − token of the dependent)."""
    found = Matching()
    for i, (sent, text, tree) in enumerate(zip(sentences, texts, trees)):
        number = indices[i] if indices else i
        if tree is None:
            found.unmatched.append({"index": number, "sent_id": None, "reason": "no tree"})
            continue
        spans = word_spans(text, tree.tokens)
        if spans is None:
            missing = _first_missing(text, tree.tokens)
            found.unmatched.append({"index": number, "sent_id": tree.sent_id,
                                    "reason": f"token {missing!r} not found in the text"})
            continue
        per_token = words_to_subwords(spans, subword_spans(tokenizer, text, sent.src))
        sent.units = per_token
        for dep, (head, label) in enumerate(zip(tree.heads, tree.rels)):
            rel = relation(label)
            if head < 0 or rel not in RELATIONS:
                continue
            dep_unit, head_unit = tree.token_of[dep], tree.token_of[head]
            if not per_token[dep_unit] or not per_token[head_unit]:
                continue
            if dep_unit == head_unit or set(per_token[dep_unit]) & set(per_token[head_unit]):
                found.shared_arcs += 1  # zu → dem inside zum: no attention to measure
                continue
            sent.arcs.append((head_unit, dep_unit, rel))
            for direction, offset in zip(DIRECTIONS, (head_unit - dep_unit, dep_unit - head_unit)):
                found.offsets.setdefault(f"{rel} {direction}", Counter())[offset] += 1
    return found


def _first_missing(text: str, tokens: list[str]) -> str:
    pos, lowered = 0, text.lower()
    for token in tokens:
        at = lowered.find(token.lower(), pos)
        if at < 0:
            return token
        pos = at + len(token)
    return ""


def treebank_split(trees: list[Tree], tokenizer, form: str, ref: str | None, max_len: int,
                   encode_target=None):
    """A treebank's sentences as a split: each tree's `# text` as the source and, with `ref`
    (e.g. "text_en"), its `# <ref> = ...` translation as the target (else empty targets: the
    encoder alone is measured), encoded by `encode_target` where the target side has its own
    tokenizer (a Marian translator's), else by `tokenizer`. Texts and tokens are normalised as
    the corpus was (`form`, data.cleaning.normalize). Returns (split, its trees, their indices
    in the file, the sentences left out as {index, sent_id, reason}: no text, no translation,
    or more than `max_len` tokens on a side, as encoded)."""
    kept, indices, left_out, sources, targets = [], [], [], [], []
    for i, tree in enumerate(trees):
        missing = "text" if not tree.text else ref if ref and not tree.comments.get(ref) else None
        if missing:
            left_out.append({"index": i, "sent_id": tree.sent_id,
                             "reason": f"no '# {missing} = ...' line"})
            continue
        kept.append(replace(tree, tokens=[normalize(t, form) for t in tree.tokens]))
        indices.append(i)
        sources.append(normalize(tree.text, form))
        targets.append(normalize(tree.comments[ref], form) if ref else "")
    src = tokenizer.encode(sources) if sources else []
    tgt = (encode_target or tokenizer.encode)(targets) if ref and sources else \
        [[] for _ in sources]
    too_long = {j for j in range(len(kept)) if max(len(src[j]), len(tgt[j])) > max_len}
    for j in sorted(too_long):
        left_out.append({"index": indices[j], "sent_id": kept[j].sent_id,
                         "reason": f"over {max_len} subwords (model.max_positions)"})
    keep = [j for j in range(len(kept)) if j not in too_long]
    kept, indices = [kept[j] for j in keep], [indices[j] for j in keep]
    sources, targets = [sources[j] for j in keep], [targets[j] for j in keep]
    src, tgt = [src[j] for j in keep], [tgt[j] for j in keep]
    left_out.sort(key=lambda item: item["index"])
    if not kept:
        raise DataError(f"no sentence of the treebank can be analysed (the first: "
                        f"{left_out[0]['reason']}); each needs a '# text = ...' line"
                        f"{f' and a # {ref} = ... line' if ref else ''}")
    return Split(sources, targets if ref else None, src, tgt), kept, indices, left_out
