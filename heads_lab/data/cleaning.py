"""Text cleaning while streaming, with every dropped pair counted by reason."""

from __future__ import annotations

import hashlib
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator

from heads_lab.config.schemas import CleaningConfig

NORMAL_FORMS = ("NFC", "NFKC", "NFD", "NFKD", "none")
Pair = tuple[str, str] | None  # a source's (src, tgt) line pair; None: an undecodable line, skipped


def normalize(text: str, form: str) -> str:
    """Unicode normal form, then whitespace runs (tabs, newlines, NBSP...) → one space, stripped."""
    if form != "none":
        text = unicodedata.normalize(form, text)
    return " ".join(text.split())


def clean(pairs: Iterable[Pair], cfg: CleaningConfig, train: bool, counts: Counter,
          limit: int | None = None) -> Iterator[tuple[str, str]]:
    """Normalised pairs. Held-out splits keep every pair (test sets are never filtered); training
    drops undecodable and empty pairs and, with cfg.dedup, repeats. Counts go to `counts`
    (read, undecodable, empty, duplicate). `limit` stops after that many kept training pairs."""
    seen: set[bytes] = set()
    kept = 0
    for pair in pairs:
        if limit is not None and kept >= limit:
            break
        counts["read"] += 1
        if pair is None:
            counts["undecodable"] += 1
            continue
        src, tgt = normalize(pair[0], cfg.normalize), normalize(pair[1], cfg.normalize)
        if train:
            if not src or not tgt:
                counts["empty"] += 1
                continue
            if cfg.dedup:
                digest = hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=8).digest()
                if digest in seen:
                    counts["duplicate"] += 1
                    continue
                seen.add(digest)
        kept += 1
        yield src, tgt


def keep_encoded(src_len: int, tgt_len: int, max_len: int, max_ratio: float | None,
                 counts: Counter) -> bool:
    """The subword filters of a training pair (fairseq's clean-corpus-n on BPE: length 1..max_len,
    ratio ≤ max_ratio); a dropped pair is counted by reason."""
    if min(src_len, tgt_len) == 0:
        counts["empty"] += 1
        return False
    if max(src_len, tgt_len) > max_len:
        counts["too_long"] += 1
        return False
    if max_ratio is not None and max(src_len, tgt_len) > max_ratio * min(src_len, tgt_len):
        counts["ratio"] += 1
        return False
    return True


def summary(counts: Counter) -> dict[str, object]:
    """{'read': n, 'dropped': {reason: n}, 'kept': n} for results.json and the console."""
    dropped = {k: v for k, v in sorted(counts.items()) if k not in ("read", "kept") and v}
    return {"read": counts["read"], "dropped": dropped, "kept": counts["kept"]}


def describe(split: str, stats: dict) -> str:
    """'train: read 29,000, kept 28,110 (dropped 890: ratio 880, too_long 10)'."""
    dropped = stats["dropped"]
    text = f"{split}: read {stats['read']:,}, kept {stats['kept']:,}"
    if dropped:
        reasons = ", ".join(f"{k} {v:,}" for k, v in dropped.items())
        text += f" (dropped {sum(dropped.values()):,}: {reasons})"
    return text
