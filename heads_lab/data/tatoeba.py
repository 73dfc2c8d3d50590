"""Tatoeba German–English, read from manythings.org/anki's deu-eng.zip in place.

The file holds 169,813 `English<TAB>German` pairs, but only 135,534 distinct English sentences:
one sentence often has several translations, and a German sentence can translate several English
ones. A split by line would train on a translation of a test sentence. Here pairs are grouped by
sentence — pairs that share an English or a German sentence (after NFC and whitespace
normalisation) are connected, and a connected group goes to one split whole — so no sentence of
valid or test, on either side, occurs in training. Valid and test are whole groups drawn with a
fixed seed until each holds `valid_sentences` / `test_sentences` English sentences (a group can
add a few more); every English sentence there keeps one pair, its first in the file, so a held-out
set has one segment per English sentence (with de→en, one reference per segment). The other
translations of held-out sentences (counted as `held_out_variants`) are never trained on; they
are the extra references of the multi-reference score (`references`): each segment is scored
against every target sentence paired anywhere in the file with its source sentence, all of them
in its own held-out group.

The zip's sha256 is checked against `data.sha256` before anything is read and recorded, with the
split counts, in the corpus stats (results.json's `data.source`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from heads_lab.config.schemas import TatoebaDataConfig
from heads_lab.data.cleaning import normalize
from heads_lab.errors import DataError

ATTRIBUTION = "Tatoeba (tatoeba.org) and manythings.org/anki, CC-BY 2.0 (France)"
WHERE = "set data.root to the zip's dir or HEADS_LAB_DATA to the dir holding tatoeba/"
DOWNLOAD = "manythings.org/anki (deu-eng.zip)"


def locate(cfg: TatoebaDataConfig) -> Path:
    """The zip: data.root (its dir, or the zip itself), else $HEADS_LAB_DATA/tatoeba, then
    $HEADS_LAB_DATA. Raises DataError naming every place tried."""
    if cfg.root:
        root = Path(cfg.root).expanduser()
        candidates = [root] if root.suffix == ".zip" else [root / cfg.file]
    else:
        env = os.environ.get("HEADS_LAB_DATA")
        candidates = ([Path(env).expanduser() / "tatoeba" / cfg.file, Path(env).expanduser() / cfg.file]
                      if env else [])
    for path in candidates:
        if path.is_file():
            return path
    tried = ", ".join(str(p) for p in candidates) or "nowhere (data.root and HEADS_LAB_DATA are unset)"
    raise DataError(f"Tatoeba file {cfg.file} not found; tried {tried}. Get it from {DOWNLOAD} "
                    f"and {WHERE}")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check(cfg: TatoebaDataConfig) -> tuple[Path, str]:
    """The zip found and its sha256 checked against data.sha256. Returns (path, sha256)."""
    path = locate(cfg)
    found = sha256_of(path)
    if cfg.sha256 and found != cfg.sha256.lower():
        raise DataError(f"{path} has sha256 {found}, not the expected {cfg.sha256} (data.sha256): "
                        "a damaged or different file; restore the original, or set "
                        "data.sha256=null to use this one (results.json records its sha256)")
    return path, found


@functools.lru_cache(maxsize=2)
def _pairs(path: str, sha256: str, member: str) -> tuple[tuple[str, str], ...]:
    """(English, German) per line of the zip's member, as written. Cached per file content:
    a sweep's preflight and its first job read the zip once. Raises DataError, one line."""
    try:
        with zipfile.ZipFile(path) as archive:
            if member not in archive.namelist():
                raise DataError(f"{path} has no {member} (it holds {archive.namelist()}): not the "
                                f"Tatoeba zip of {DOWNLOAD}; point data.root at that zip")
            raw = archive.read(member)
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise DataError(f"{path}: not a readable zip archive ({err}): a damaged copy; get "
                        f"it again from {DOWNLOAD}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise DataError(f"{path}:{member}:{line}: not UTF-8 ({err.reason}); restore the original "
                        "file") from None
    pairs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split("\t")
        if len(fields) < 2:  # newer anki files add a third, attribution column: ignored
            raise DataError(f"{path}:{member}:{lineno}: no tab between the English and the German "
                            f"sentence ({line[:40]!r}); each line must be English<TAB>German — "
                            "restore the original file")
        pairs.append((fields[0], fields[1]))
    if not pairs:
        raise DataError(f"{path}:{member} holds no pairs: a damaged copy; get it again from "
                        f"{DOWNLOAD}")
    return tuple(pairs)


def _groups(pairs) -> np.ndarray:
    """The connected group of each pair: pairs sharing an English or a German sentence
    (NFC, whitespace collapsed) are in one group. Group ids are the first line of the group."""
    parent = list(range(len(pairs)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[str, str], int] = {}
    for i, (en, de) in enumerate(pairs):
        for key in (("en", normalize(en, "NFC")), ("de", normalize(de, "NFC"))):
            j = first.setdefault(key, i)
            a, b = find(i), find(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return np.array([find(i) for i in range(len(pairs))])


@functools.lru_cache(maxsize=2)
def split(path: str, sha256: str, member: str, valid_sentences: int, test_sentences: int,
          seed: int) -> tuple[dict[str, list[int]], dict[str, Any]]:
    """Line indices per split (in file order) and the split's counts (see the module doc)."""
    pairs = _pairs(path, sha256, member)
    groups = _groups(pairs)
    english: dict[int, dict[str, int]] = {}  # group → {English sentence: its first line}
    for i, (en, _) in enumerate(pairs):
        english.setdefault(int(groups[i]), {}).setdefault(normalize(en, "NFC"), i)
    order = sorted(english)  # group ids in file order, then drawn with the fixed seed
    drawn = np.random.default_rng(seed).permutation(len(order))
    chosen: dict[str, list[int]] = {"test": [], "valid": []}
    wanted = {"test": test_sentences, "valid": valid_sentences}
    counts = {"test": 0, "valid": 0}
    k = 0
    for name in ("test", "valid"):
        while counts[name] < wanted[name] and k < len(drawn):
            group = order[drawn[k]]
            chosen[name].append(group)
            counts[name] += len(english[group])
            k += 1
    held = {g: name for name, gs in chosen.items() for g in gs}
    lines: dict[str, list[int]] = {"train": [], "valid": [], "test": []}
    for i in range(len(pairs)):
        name = held.get(int(groups[i]))
        if name is None:
            lines["train"].append(i)
    for name in ("valid", "test"):
        lines[name] = sorted(first for g in chosen[name] for first in english[g].values())
    held_lines = sum(1 for i in range(len(pairs)) if int(groups[i]) in held)
    info = {
        "pairs": len(pairs), "groups": len(order), "seed": seed,
        "train": {"pairs": len(lines["train"]),
                  "english": len({normalize(pairs[i][0], "NFC") for i in lines["train"]})},
        "valid": {"pairs": len(lines["valid"]), "english": counts["valid"],
                  "groups": len(chosen["valid"])},
        "test": {"pairs": len(lines["test"]), "english": counts["test"],
                 "groups": len(chosen["test"])},
        "held_out_variants": held_lines - len(lines["valid"]) - len(lines["test"]),
    }
    return lines, info


def source_info(path: Path, sha256: str, key: tuple) -> dict[str, Any]:
    """results.json's data.source: the file, its sha256, attribution and the split's counts."""
    return {"file": str(path), "sha256": sha256, "attribution": ATTRIBUTION, "split": split(*key)[1]}


def references(path: Path, sha256: str, key: tuple, name: str, de_first: bool,
               form: str) -> list[list[str]]:
    """Each segment of split `name` (in read_split's order): every target-side sentence paired
    in the file with its source sentence (NFC, whitespace collapsed), normalised as the corpus's
    texts (`form`: data.cleaning.normalize), its own reference first, then the others in file
    order, each once. Pairs sharing a sentence are one group, so these all lie in the segment's
    own held-out group: none is ever trained on."""
    pairs = _pairs(str(path), sha256, key[2])
    src, tgt = (1, 0) if de_first else (0, 1)
    by_source: dict[str, list[int]] = {}
    for i, pair in enumerate(pairs):
        by_source.setdefault(normalize(pair[src], "NFC"), []).append(i)
    out = []
    for i in split(*key)[0][name]:
        seen, refs = set(), []
        for j in [i, *by_source[normalize(pairs[i][src], "NFC")]]:
            text = normalize(pairs[j][tgt], form)
            if text not in seen:
                seen.add(text)
                refs.append(text)
        out.append(refs)
    return out


def read_split(path: Path, sha256: str, key: tuple, name: str, de_first: bool):
    """The (source, target) pairs of split `name`, in file order."""
    pairs = _pairs(str(path), sha256, key[2])
    for i in split(*key)[0][name]:
        en, de = pairs[i]
        yield (de, en) if de_first else (en, de)
