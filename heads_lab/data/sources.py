"""Where parallel text comes from. Each source gives, per split, a description (for messages), a
fingerprint (for the cache key: what would change the data) and a reader that streams raw
(source, target) pairs — None for a pair skipped as undecodable — never the whole corpus at once.

  text files  two aligned files per split ({split}.{lang}, gzip allowed) or one TSV per split
  multi30k    text files from a data root, else the same data from the Hugging Face hub
  tatoeba     manythings.org/anki's deu-eng.zip, split by sentence group (heads_lab.data.tatoeba)
  hf          a Hugging Face dataset: hub name, save_to_disk dir, or json/parquet/csv files
"""

from __future__ import annotations

import gzip
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from heads_lab.config.schemas import (
    DataConfig,
    HFDataConfig,
    Multi30kDataConfig,
    TatoebaDataConfig,
    TextFilesDataConfig,
)
from heads_lab.data import tatoeba
from heads_lab.data.cleaning import Pair
from heads_lab.errors import ConfigError, DataError

SPLITS = ("train", "valid", "test")


@dataclass
class SplitReader:
    split: str
    description: str
    fingerprint: Any
    read: Callable[[], Iterator[Pair]]
    info: Callable[[], dict[str, Any]] | None = None  # facts for results.json (data.source)
    # every reference of each held-out segment, its own first (sources with several: Tatoeba)
    references: Callable[[], list[list[str]]] | None = None


def open_source(cfg: DataConfig) -> dict[str, SplitReader]:
    """The three splits of the configured source, ready to stream."""
    if isinstance(cfg, Multi30kDataConfig):
        return _multi30k(cfg)
    if isinstance(cfg, TextFilesDataConfig):
        if not cfg.root:
            raise ConfigError("data.root is not set: point it at the dir holding the corpus files "
                              f"({cfg.pattern})")
        return {s: _text_split(cfg, Path(cfg.root).expanduser(), s) for s in SPLITS}
    if isinstance(cfg, HFDataConfig):
        return _hf(cfg)
    if isinstance(cfg, TatoebaDataConfig):
        return _tatoeba(cfg)
    raise ConfigError(f"data={cfg.name!r} has no reader")


def preflight(cfg: DataConfig) -> None:
    """The checks of a source cheap enough to run before Hydra writes anything (a run dir, its
    .hydra/): Tatoeba's zip found, its sha256, every line with its tab; local files found;
    Multi30k's files found or its hub copy reachable. Raises DataError (or ConfigError) in one
    line. Other sources are checked when they are read."""
    if isinstance(cfg, TatoebaDataConfig):
        _tatoeba(cfg)["train"].info()  # reads and splits the file: every line is checked
    elif isinstance(cfg, Multi30kDataConfig):
        _multi30k_preflight(cfg)
    elif isinstance(cfg, TextFilesDataConfig):
        open_source(cfg)  # every split's files exist


# ---------------------------------------------------------------- plain-text files


def _candidates(root: Path, name: str) -> list[Path]:
    path = root / name
    return [path] if name.endswith(".gz") else [path, path.with_name(path.name + ".gz")]


def _find(root: Path, name: str) -> Path | None:
    return next((p for p in _candidates(root, name) if p.is_file()), None)


def _text_split(cfg: TextFilesDataConfig, root: Path, split: str) -> SplitReader:
    name = getattr(cfg, split)
    on_error = cfg.cleaning.on_decode_error
    if cfg.format == "tsv":
        path = _require(root, cfg.pattern.format(split=name, lang=f"{cfg.src}-{cfg.tgt}"), split,
                        f" (data.format=tsv reads data.pattern={cfg.pattern!r} with {{lang}} = "
                        f"{cfg.src}-{cfg.tgt}; name your files with it, e.g. "
                        "data.pattern='{split}.tsv')")
        return SplitReader(split, str(path), _stat(path), lambda: _read_tsv(path, on_error))
    src = _require(root, cfg.pattern.format(split=name, lang=cfg.src), split)
    tgt = _require(root, cfg.pattern.format(split=name, lang=cfg.tgt), split)
    return SplitReader(split, f"{src} + {tgt}", [_stat(src), _stat(tgt)],
                       lambda: _read_pair(src, tgt, on_error))


def _require(root: Path, name: str, split: str, hint: str = "") -> Path:
    found = _find(root, name)
    if found is None:
        tried = ", ".join(str(p) for p in _candidates(root, name))
        raise DataError(f"the {split} file is missing: tried {tried}{hint}")
    return found


def _stat(path: Path) -> list:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def _lines(path: Path, on_error: str) -> Iterator[str | None]:
    """Lines of a UTF-8 text file (gzip if .gz), without line ends; None for an undecodable
    line when on_error=skip."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    yield raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as err:
                    if on_error == "skip":
                        yield None
                        continue
                    raise DataError(
                        f"{path}:{lineno}: not UTF-8 ({err.reason} at byte {err.start}); fix the "
                        "file or set data.cleaning.on_decode_error=skip to drop such pairs"
                    ) from None
    except (OSError, EOFError) as err:  # e.g. a truncated or non-gzip .gz
        raise DataError(f"{path}: cannot be read ({err})") from None


def _count_lines(path: Path) -> int:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        return sum(1 for _ in f)


def _read_pair(src: Path, tgt: Path, on_error: str) -> Iterator[Pair]:
    src_lines, tgt_lines = _lines(src, on_error), _lines(tgt, on_error)
    n = 0
    for a in src_lines:
        b = next(tgt_lines, StopIteration)
        if b is StopIteration:
            raise DataError(f"{src} has {_count_lines(src)} lines but {tgt} has {n}: the two "
                            "sides of a parallel corpus must align line by line")
        n += 1
        yield None if a is None or b is None else (a, b)
    if next(tgt_lines, StopIteration) is not StopIteration:
        raise DataError(f"{src} has {n} lines but {tgt} has {_count_lines(tgt)}: the two sides "
                        "of a parallel corpus must align line by line")


def _read_tsv(path: Path, on_error: str) -> Iterator[Pair]:
    for lineno, line in enumerate(_lines(path, on_error), 1):
        if line is None:
            yield None
            continue
        if line.count("\t") != 1:
            raise DataError(f"{path}:{lineno}: expected one tab between source and target, found "
                            f"{line.count(chr(9))}; a TSV corpus holds one `source<TAB>target` "
                            "pair per line")
        src, tgt = line.split("\t")
        yield src, tgt


# ---------------------------------------------------------------- Multi30k


def _multi30k_local(cfg: Multi30kDataConfig) -> tuple[Path | None, str, str]:
    """(the first root holding every split's files or None, the roots tried, the files wanted);
    where none holds them, a DataError now if the hub has no copy of these splits."""
    roots = [Path(cfg.root).expanduser()] if cfg.root else []
    env = os.environ.get("HEADS_LAB_DATA")
    if not cfg.root and env:
        roots += [Path(env).expanduser() / "multi30k", Path(env).expanduser()]
    tried = ", ".join(str(r) for r in roots) or "none (data.root and HEADS_LAB_DATA are unset)"
    wanted = f"{cfg.train}/{cfg.valid}/{cfg.test}.{{{cfg.src},{cfg.tgt}}}[.gz]"
    for root in roots:
        if all(_find(root, cfg.pattern.format(split=getattr(cfg, s), lang=lang))
               for s in SPLITS for lang in (cfg.src, cfg.tgt)):
            return root, tried, wanted
    if {cfg.src, cfg.tgt} != {"de", "en"} or cfg.test != "test_2016_flickr" or cfg.valid != "val":
        raise DataError(f"Multi30k files {wanted} not found; roots tried: {tried}. Put them in "
                        "one of those dirs, or set data.root or HEADS_LAB_DATA")
    return None, tried, wanted


def _multi30k_preflight(cfg: Multi30kDataConfig) -> None:
    """Multi30k's files found, or the hub that has them reachable (HF_HUB_OFFLINE: the datasets
    cache may have them, which only loading tells)."""
    root, tried, wanted = _multi30k_local(cfg)
    if root is None and not os.environ.get("HF_HUB_OFFLINE") and not _hub_reachable():
        raise DataError(f"Multi30k files {wanted} not found (roots tried: {tried}) and the "
                        "Hugging Face hub, which has a copy, is unreachable; put the files in "
                        "one of those dirs, or set data.root or HEADS_LAB_DATA")


def _multi30k(cfg: Multi30kDataConfig) -> dict[str, SplitReader]:
    root, tried, wanted = _multi30k_local(cfg)
    if root is not None:
        return {s: _text_split(cfg, root, s) for s in SPLITS}
    hub = HFDataConfig(name="hf", src=cfg.src, tgt=cfg.tgt, dataset=cfg.hub_dataset, column=None,
                       cleaning=cfg.cleaning)
    try:
        return _hf(hub)
    except DataError as err:
        raise DataError(f"Multi30k files {wanted} not found (roots tried: {tried}) and the hub "
                        f"copy failed ({err}); put the files in one of those dirs, or set "
                        "data.root or HEADS_LAB_DATA") from None


# ---------------------------------------------------------------- Tatoeba


def _tatoeba(cfg: TatoebaDataConfig) -> dict[str, SplitReader]:
    """The zip found and its sha256 checked now; read and split by sentence group when a split
    is first read (a corpus cache hit never reads it). See heads_lab.data.tatoeba."""
    if {cfg.src, cfg.tgt} != {"de", "en"}:
        raise DataError(f"data=tatoeba is German–English: data.src={cfg.src} and data.tgt="
                        f"{cfg.tgt} must be de and en (either way round)")
    path, sha = tatoeba.check(cfg)
    key = (str(path), sha, cfg.member, cfg.valid_sentences, cfg.test_sentences, cfg.split_seed)
    fingerprint = {"sha256": sha, "split": key[2:]}  # the content, wherever the file lives
    return {s: SplitReader(s, f"{path}:{cfg.member} ({s}, split by sentence group)", fingerprint,
                           lambda s=s: tatoeba.read_split(path, sha, key, s, cfg.src == "de"),
                           lambda: tatoeba.source_info(path, sha, key),
                           None if s == "train" else
                           lambda s=s: tatoeba.references(path, sha, key, s, cfg.src == "de",
                                                          cfg.cleaning.normalize))
            for s in SPLITS}


def references(cfg: DataConfig, split: str) -> list[list[str]] | None:
    """Every reference of each segment of a held-out split, normalised as the corpus's texts
    (data.cleaning.normalize), its own reference first: for a source that has several per
    segment (Tatoeba: the other translations of its sentence); None for the others (their
    readers are not opened: a hub dataset would be fetched)."""
    if not isinstance(cfg, TatoebaDataConfig):
        return None
    reader = _tatoeba(cfg)[split]
    return None if reader.references is None else reader.references()


# ---------------------------------------------------------------- Hugging Face datasets

LOADERS = ("json", "parquet", "csv", "arrow")


def _hf(cfg: HFDataConfig) -> dict[str, SplitReader]:
    if not cfg.dataset:
        raise ConfigError("data.dataset is not set: a hub name (e.g. wmt/wmt14), a save_to_disk "
                          "dir, or json/parquet/csv with data.files")
    dsets = _load_hf(cfg)
    names = {"train": cfg.train, "valid": cfg.valid, "test": cfg.test}
    readers = {}
    for split, name in names.items():
        if name not in dsets:
            raise DataError(f"dataset {cfg.dataset} has no split {name!r} (data.{split}); it has "
                            f"{sorted(dsets)}")
        ds = dsets[name]
        _check_columns(cfg, ds, name)
        readers[split] = SplitReader(split, f"{cfg.dataset}[{name}]",
                                     [cfg.dataset, cfg.config, cfg.revision, ds._fingerprint],
                                     lambda ds=ds: _iter_hf(cfg, ds))
    return readers


def _load_hf(cfg: HFDataConfig):
    import datasets  # lazy: start-up time (datasets), and only Hub/HF-format data needs it

    try:
        if cfg.dataset in LOADERS:
            if not cfg.files:
                raise ConfigError(f"data.dataset={cfg.dataset} needs data.files: split → path(s)")
            return datasets.load_dataset(cfg.dataset, data_files=dict(cfg.files))
        local = Path(cfg.dataset).expanduser()
        if local.is_dir():
            return datasets.load_from_disk(str(local))
        if cfg.dataset.startswith(("/", "./", "../", "~")) or local.exists():  # a path, not a name
            raise DataError(f"data.dataset={cfg.dataset} is not a dir: give a dataset saved with "
                            "save_to_disk, a hub name (owner/name), or data.dataset=json / "
                            "parquet / csv with data.files")
        if not os.environ.get("HF_HUB_OFFLINE") and not _hub_reachable():
            raise DataError(f"the Hugging Face hub is unreachable, so {cfg.dataset} cannot be "
                            "downloaded; use a local copy (save_to_disk dir, or json/parquet "
                            "files), or HF_HUB_OFFLINE=1 to use the datasets cache")
        return datasets.load_dataset(cfg.dataset, cfg.config, revision=cfg.revision)
    except (ConfigError, DataError):
        raise
    except Exception as err:  # datasets raises many types: missing files, bad configs, network
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"could not load dataset {cfg.dataset}: {first}") from None


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick connect to the hub (or the HF_ENDPOINT mirror), so offline fails in seconds."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _check_columns(cfg: HFDataConfig, ds, split: str) -> None:
    if cfg.column:
        if cfg.column not in ds.column_names:
            raise DataError(f"dataset {cfg.dataset}[{split}] has no column {cfg.column!r} (it has "
                            f"{ds.column_names}); set data.column, or null for one column per "
                            "language")
        if len(ds):
            langs = sorted(ds[0][cfg.column])
            missing = [lang for lang in (cfg.src, cfg.tgt) if lang not in langs]
            if missing:
                raise DataError(f"dataset {cfg.dataset}[{split}] has no {missing} in column "
                                f"{cfg.column!r} (languages: {langs}); set data.src / data.tgt")
    else:
        missing = [lang for lang in (cfg.src, cfg.tgt) if lang not in ds.column_names]
        if missing:
            raise DataError(f"dataset {cfg.dataset}[{split}] has no column {missing} (it has "
                            f"{ds.column_names}); set data.src / data.tgt or data.column")


def _iter_hf(cfg: HFDataConfig, ds) -> Iterator[Pair]:
    for batch in ds.iter(batch_size=4096):
        if cfg.column:
            for row in batch[cfg.column]:
                yield row[cfg.src], row[cfg.tgt]
        else:
            yield from zip(batch[cfg.src], batch[cfg.tgt])
