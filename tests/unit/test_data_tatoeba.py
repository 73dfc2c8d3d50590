"""data=tatoeba: the zip read in place, its sha256 checked, valid/test split by sentence group."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from heads_lab.config.schemas import CleaningConfig, TatoebaDataConfig
from heads_lab.data import prepare
from heads_lab.data.cleaning import normalize
from heads_lab.data.sources import open_source, preflight
from heads_lab.data.tatoeba import split
from heads_lab.errors import DataError

REAL = Path(os.environ.get("HEADS_LAB_DATA", "/nonexistent")) / "tatoeba" / "deu-eng.zip"
REAL_SHA256 = "b7688f84f99fa33c17397c14d8bd9cef1fdeb2ee0bf50074767023aee8926e28"


def _zip(path: Path, lines: list[str], member: str = "deu.txt") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, "".join(f"{line}\n" for line in lines))
        archive.writestr("_about.txt", "test file")
    return path


def _lines(n_single: int = 200) -> list[str]:
    """Pairs with known groups: 'E{i}.' ↔ 'D{i}.' singletons; E900 with three German versions;
    E901 and E902 sharing the German 'D-shared.' (one group of two English sentences)."""
    lines = [f"E{i} is here.\tD{i} ist hier." for i in range(n_single)]
    lines += ["E900 runs.\tD900 läuft.", "E900 runs.\tD900 rennt.", "E900 runs.\tD900 joggt."]
    lines += ["E901 hi.\tD-shared.", "E902 hello.\tD-shared.", "E902 hello.\tD902 hallo."]
    return lines


def _cfg(path: Path, **kw) -> TatoebaDataConfig:
    settings = {"root": str(path), "sha256": None, "valid_sentences": 20, "test_sentences": 20,
                "vocab_size": 80, "cleaning": CleaningConfig(max_ratio=None), **kw}
    return TatoebaDataConfig(**settings)


def _read(readers, name):
    return list(readers[name].read())


def test_split_keeps_sentence_groups_apart_and_one_pair_per_held_out_sentence(tmp_path):
    path = _zip(tmp_path / "deu-eng.zip", _lines())
    # every seed: a group with several translations or shared sentences is never split
    for seed in range(40):
        readers = open_source(_cfg(path, split_seed=seed))
        parts = {s: _read(readers, s) for s in ("train", "valid", "test")}
        sides = {s: ({de for de, _ in pairs}, {en for _, en in pairs}) for s, pairs in parts.items()}
        for held in ("valid", "test"):
            assert not sides[held][0] & sides["train"][0], (seed, held)  # no German sentence
            assert not sides[held][1] & sides["train"][1], (seed, held)  # no English sentence
            english = [en for _, en in parts[held]]
            assert len(english) == len(set(english))  # one pair per English sentence
            assert len(english) >= 20
        assert not sides["valid"][1] & sides["test"][1]
        grouped = {"E901 hi.", "E902 hello."}
        assert sum(bool(grouped & sides[s][1]) for s in parts) == 1, seed
        info = readers["train"].info()["split"]
        assert info["pairs"] == len(_lines())
        assert (info["train"]["pairs"] + info["valid"]["pairs"] + info["test"]["pairs"]
                + info["held_out_variants"]) == len(_lines())
        assert [info[s]["pairs"] for s in ("train", "valid", "test")] == [len(parts[s]) for s in parts]


def test_sentences_differing_only_in_unicode_form_or_spaces_are_one_group(tmp_path):
    """'Café' written as e + combining accent, or with doubled or no-break spaces, is the same
    sentence after cleaning (NFC, whitespace collapsed), so its pairs must share a split: else a
    held-out sentence would be trained on under another spelling."""
    variants = [("Cafe\u0301 time.", "Kaffeezeit."), ("Café time.", "Zeit für Kaffee."),
                ("Café  time.", "Kaffeepause."),  # English: decomposed, composed, two spaces
                ("It is 300 km.", "Es sind 300\u202f000\xa0km."),
                ("That is 300 km.", "Es sind 300\xa0000\xa0km.")]  # German: two spaces alike
    path = _zip(tmp_path / "deu-eng.zip", _lines() + [f"{en}\t{de}" for en, de in variants])
    held = {"valid": 0, "test": 0}
    for seed in range(60):
        readers = open_source(_cfg(path, split_seed=seed))
        where = {s: {normalize(text, "NFC") for pair in _read(readers, s) for text in pair}
                 for s in ("train", "valid", "test")}  # as cleaning will write them
        for text in ("Café time.", "Es sind 300 000 km."):
            found = {s for s, seen in where.items() if text in seen}
            assert len(found) == 1, (seed, text, found)
            if found != {"train"}:
                held[found.pop()] += 1
    assert held["valid"] and held["test"]  # the groups were held out in some seeds


def test_held_out_sentence_keeps_its_first_pair(tmp_path):
    path = _zip(tmp_path / "deu-eng.zip", _lines())
    for seed in range(60):  # find a seed that holds E900 out
        readers = open_source(_cfg(path, split_seed=seed))
        held = _read(readers, "valid") + _read(readers, "test")
        if any(en == "E900 runs." for _, en in held):
            assert ("D900 läuft.", "E900 runs.") in held
            assert readers["train"].info()["split"]["held_out_variants"] >= 2
            return
    pytest.fail("no seed held E900 out")


def test_every_translation_of_a_held_out_source_is_a_reference_and_none_is_trained_on(tmp_path):
    """The multi-reference score's references: E901 and E902 share the German 'D-shared.', so
    de→en scores each of the two segments against both English sentences (its own first); E900
    has three German versions, so en→de scores its segment against all three. Every reference
    lies in its segment's held-out group: none is in the training split."""
    from heads_lab.data.sources import references

    path = _zip(tmp_path / "deu-eng.zip", _lines())
    for seed in range(200):  # a seed that holds both groups out in test
        cfg = _cfg(path, split_seed=seed)
        test = _read(open_source(cfg), "test")
        if {"E901 hi.", "E900 runs."} <= {en for _, en in test}:
            break
    else:
        pytest.fail("no seed held E900 and E901 out in test")
    refs = references(cfg, "test")
    assert [r[0] for r in refs] == [en for _, en in test]  # its own reference first
    by_own = dict(zip([en for _, en in test], refs))
    assert by_own["E901 hi."] == ["E901 hi.", "E902 hello."]
    assert by_own["E902 hello."] == ["E902 hello.", "E901 hi."]
    assert by_own["E900 runs."] == ["E900 runs."]  # three German sources, one English each
    assert all(len(r) == 1 for own, r in by_own.items() if not own.startswith("E90"))
    en_de = _cfg(path, split_seed=seed, src="en", tgt="de")
    by_src = dict(zip([en for en, _ in _read(open_source(en_de), "test")], references(en_de, "test")))
    assert by_src["E900 runs."] == ["D900 läuft.", "D900 rennt.", "D900 joggt."]
    train = {text for pair in _read(open_source(cfg), "train") for text in pair}
    assert not {x for r in refs for x in r} & train
    assert references(_cfg(path, split_seed=seed), "train") is None


def test_split_is_deterministic_and_direction_swaps(tmp_path):
    path = _zip(tmp_path / "deu-eng.zip", _lines())
    first = {s: _read(open_source(_cfg(path)), s) for s in ("train", "test")}
    split.cache_clear()
    again = {s: _read(open_source(_cfg(path)), s) for s in ("train", "test")}
    assert first == again
    en_de = _read(open_source(_cfg(path, src="en", tgt="de")), "test")
    assert en_de == [(en, de) for de, en in first["test"]]


def test_prepare_records_sha256_and_split_counts(tmp_path):
    path = _zip(tmp_path / "t" / "deu-eng.zip", _lines())
    corpus = prepare(_cfg(path.parent), tmp_path / "cache")
    source = corpus.stats["source"]
    assert source["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert source["split"]["test"]["english"] >= 20
    assert corpus.stats["train"]["kept"] == source["split"]["train"]["pairs"]
    assert len(corpus.splits["test"]) == source["split"]["test"]["pairs"]
    cached = prepare(_cfg(path.parent), tmp_path / "cache")  # a cache hit keeps the record
    assert cached.stats["source"] == source


@pytest.mark.parametrize("case,fragments", [
    ("missing", ["Tatoeba file deu-eng.zip not found", "tried", "data.root"]),
    ("sha256", ["has sha256", "not the expected", "data.sha256=null"]),
    ("corrupt", ["not a readable zip archive", "get it again"]),
    ("no_tab", ["deu.txt:3: no tab between", "restore the original file"]),
    ("member", ["has no deu.txt", "not the Tatoeba zip"]),
])
def test_bad_zip_is_one_clear_error(tmp_path, case, fragments):
    lines = _lines()
    path = tmp_path / "deu-eng.zip"
    kw = {}
    if case == "sha256":
        _zip(path, lines)
        kw["sha256"] = "0" * 64
    elif case == "corrupt":
        path.write_bytes(_zip(tmp_path / "ok" / "deu-eng.zip", lines).read_bytes()[:300])
    elif case == "no_tab":
        lines[2] = lines[2].replace("\t", " ")
        _zip(path, lines)
    elif case == "member":
        _zip(path, lines, member="eng.txt")
    with pytest.raises(DataError) as err:
        preflight(_cfg(tmp_path if case != "missing" else tmp_path / "none", **kw))
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.skipif(not REAL.is_file(), reason="Tatoeba not found: set HEADS_LAB_DATA to the dir "
                    "holding tatoeba/deu-eng.zip (.ci/run points it at ../shared/data)")
def test_real_file_no_held_out_sentence_is_trained_on():
    from heads_lab.data.cleaning import normalize

    readers = open_source(TatoebaDataConfig(root=str(REAL.parent)))
    info = readers["train"].info()
    assert info["sha256"] == REAL_SHA256 and info["split"]["pairs"] == 169_813
    parts = {s: _read(readers, s) for s in ("train", "valid", "test")}

    def sides(pairs):
        return ({normalize(de, "NFC") for de, _ in pairs}, {normalize(en, "NFC") for _, en in pairs})

    train = sides(parts["train"])
    for held in ("valid", "test"):
        de, en = sides(parts[held])
        assert len(en) == len(parts[held]) >= 2000  # one pair per English sentence
        assert not en & train[1] and not de & train[0]
    assert info["split"]["train"]["pairs"] == len(parts["train"]) > 160_000
    from heads_lab.data.sources import references  # every translation of a test source

    refs = references(TatoebaDataConfig(root=str(REAL.parent)), "test")
    assert [r[0] for r in refs] == [normalize(en, "NFC") for _, en in parts["test"]]
    assert (sum(len(r) > 1 for r in refs), sum(map(len, refs))) == (238, 2293)
    assert not {normalize(x, "NFC") for r in refs for x in r} & train[1]
