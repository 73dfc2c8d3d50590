"""The data sources' config schemas (config group data/): one dataclass per source, each
registered with Hydra by heads_lab.config.compose (every subclass of DataConfig). Re-exported by
heads_lab.config.schemas."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from heads_lab.config.choices import FileFormat, NormalForm, OnDecodeError, Tokenizer
from heads_lab.config.fields import opt


@dataclass
class CleaningConfig:
    """Applied while reading. Every split: Unicode normalisation, whitespace collapsed and
    stripped. Training pairs only (held-out sets are never filtered): empty pairs dropped,
    optional de-duplication, and after subword encoding the length (data.max_len) and ratio
    filters of fairseq's recipes (clean-corpus-n: 1-250 subwords, ratio 1.5)."""

    normalize: NormalForm = opt(NormalForm.NFC, "Unicode normal form: NFC | NFKC | NFD | NFKD | none")
    dedup: bool = opt(False, "drop training pairs seen before (after normalisation)")
    max_ratio: float | None = opt(1.5, "longer / shorter side, in subwords; null = no ratio filter")
    on_decode_error: OnDecodeError = opt(OnDecodeError.error, "lines that are not UTF-8: error | "
                                         "skip (skipped lines are counted)")


@dataclass
class DataConfig:
    name: str = opt(MISSING, "the source (set by data=<name>): local | multi30k | hf | tatoeba | "
                    "synthetic")
    src: str = opt("src", "source language code")
    tgt: str = opt("tgt", "target language code")
    vocab_size: int = opt(8000, "joint subword vocabulary (SentencePiece)")
    tokenizer: Tokenizer = opt(Tokenizer.bpe, "SentencePiece model type: bpe | unigram")
    max_len: int = opt(250, "subword tokens per side; longer training pairs are dropped")
    max_train_pairs: int | None = opt(None, "keep only the first N cleaned training pairs, in "
                                      "the file's order (Tatoeba's: shortest first; "
                                      "data.train_fraction takes a random subset)")
    train_fraction: float = opt(1.0,
        "train on this fixed share of the training pairs, in (0, 1]: the same sentences for every "
        "seed and model (a permutation with its own fixed seed; a smaller share is a subset of "
        "a larger one), the tokenizer the full split's; results.json's data.train says how many")
    cleaning: CleaningConfig = field(default_factory=CleaningConfig)
    # task=lm (heads_lab.data.lm): a language model's text
    block_size: int = opt(256, "task=lm on documents (data=shakespeare): tokens per block")
    held_out: int = opt(2000, "task=lm on one side of a corpus (data.src): sentences in each of "
                        "valid and test, after de-duplication")
    seed: int = opt(0, "the data's own seed, never the training seed: task=lm on one side of a "
                    "corpus shuffles it with this before its split, so the held-out text is "
                    "the same for every run")


@dataclass
class TextFilesDataConfig(DataConfig):
    """A parallel corpus in plain-text files (gzip allowed) under `root`: with format=text, one
    file per split and side named by `pattern` ({split}, {lang}); with format=tsv, one file per
    split (`pattern` with {split}), one `source<TAB>target` pair per line."""

    name: str = "local"
    root: str | None = opt(None, "the dir holding the files (required)")
    format: FileFormat = opt(FileFormat.text, "text (a file per split and side) | tsv (a file per "
                             "split, source<TAB>target)")
    pattern: str = opt("{split}.{lang}", "a .gz twin is tried too")
    train: str = opt("train", "split names as they appear in file names")
    valid: str = opt("valid", "validation split's name in file names")
    test: str = opt("test", "test split's name in file names")


@dataclass
class Multi30kDataConfig(TextFilesDataConfig):
    """Multi30k task 1 (Elliott et al. 2016): en, de, fr, cs. `root` defaults to
    $HEADS_LAB_DATA/multi30k (or $HEADS_LAB_DATA); without the files, the hub copy is tried."""

    name: str = "multi30k"
    src: str = opt("de", "source language: en | de | fr | cs")
    tgt: str = opt("en", "target language: en | de | fr | cs")
    root: str | None = opt(None, "the dir holding the files; None = $HEADS_LAB_DATA/multi30k, "
                           "then $HEADS_LAB_DATA, then the hub")
    valid: str = "val"
    test: str = opt("test_2016_flickr", "or test_2017_flickr, test_2017_mscoco, test_2018_flickr")
    hub_dataset: str = opt("bentrevett/multi30k", "en/de columns; train / validation / test")


@dataclass
class HFDataConfig(DataConfig):
    """A Hugging Face dataset in the WMT schema (a `translation` column of {lang: text}) or with
    one column per language. `dataset` is a hub name, a directory saved by `save_to_disk`, or a
    loader name (json, parquet, csv) with `files` mapping each split to local files."""

    name: str = "hf"
    dataset: str | None = opt(None, "a hub name (needs a network), a dir saved with save_to_disk, "
                              "or a loader (json, parquet, csv) with data.files (required)")
    config: str | None = opt(None, "the dataset's configuration, e.g. de-en for wmt/wmt14")
    revision: str | None = opt(None, "the hub dataset's git revision (a tag, branch or commit)")
    column: str | None = opt("translation", "null: the text is in columns named like data.src/tgt")
    files: dict[str, str] = field(default_factory=dict, metadata={"help":
        "split name → file(s), for json/parquet/csv; new keys take a leading +: "
        "+data.files.train=train.jsonl"})
    train: str = opt("train", "the dataset's split names for training, validation and test")
    valid: str = opt("validation", "the dataset's validation split")
    test: str = opt("test", "the dataset's test split")


@dataclass
class TatoebaDataConfig(DataConfig):
    """Tatoeba German–English (tatoeba.org, as packaged by manythings.org/anki; CC-BY 2.0 FR):
    deu-eng.zip's deu.txt, one `English<TAB>German` pair a line, read from the zip in place.
    `root` is the dir holding the zip (or the zip itself), else $HEADS_LAB_DATA/tatoeba or
    $HEADS_LAB_DATA. Valid and test are drawn by sentence group: pairs that share an English or
    a German sentence (a connected group) land in one split, so no translation of a held-out
    sentence is trained on; a held-out English sentence keeps one pair (its first in the file)."""

    name: str = "tatoeba"
    src: str = opt("de", "de or en")
    tgt: str = opt("en", "en or de")
    root: str | None = opt(None, "the dir holding the zip, or the zip; None = $HEADS_LAB_DATA/"
                           "tatoeba, then $HEADS_LAB_DATA")
    file: str = opt("deu-eng.zip", "the zip's file name under root")
    member: str = opt("deu.txt", "the pairs file inside the zip")
    sha256: str | None = opt("b7688f84f99fa33c17397c14d8bd9cef1fdeb2ee0bf50074767023aee8926e28",
                             "the zip's expected sha256 (the 2018-05-13 file); null accepts any "
                             "(results.json records the file's either way)")
    valid_sentences: int = opt(2000, "English sentences held out for validation (whole groups, "
                               "so a few more)")
    test_sentences: int = opt(2000, "English sentences held out for test (whole groups)")
    split_seed: int = opt(20261127, "the held-out groups' draw (change it for another split)")


@dataclass
class SyntheticDataConfig(DataConfig):
    """The embedded language pair (heads_lab.data.synthetic); the seed fixes the language and
    the corpus, independent of the training seed."""

    name: str = "synthetic"
    vocab_size: int = 2000
    seed: int = opt(0, "fixes the language (lexicon, senses) and the corpus; not the training seed")
    train_size: int = opt(20000, "training pairs (valid and test stay the same as it changes)")
    valid_size: int = opt(500, "validation pairs")
    test_size: int = opt(1000, "test pairs")
    nouns: int = opt(400, "noun lemmas in the lexicon")
    verbs: int = opt(100, "verb lemmas")
    adjectives: int = opt(100, "adjective lemmas")
    adverbs: int = opt(40, "adverb lemmas")
    zipf: float = opt(1.1, "word-frequency exponent: p(rank r) ∝ r^-zipf")
    p_cognate: float = opt(0.5, "lemmas whose target form is a sound-shifted copy of the source")
    p_synonym: float = opt(0.05, "lemmas that share their target translation (many-to-one)")
    p_pronoun: float = opt(0.25, "subjects that are a pronoun")
    p_plural: float = opt(0.3, "noun phrases in the plural")
    p_past: float = opt(0.3, "clauses in the past tense (target: auxiliary + participle)")
    p_adjective: float = opt(0.45, "a noun phrase's first adjective (a second: half as likely)")
    p_very: float = opt(0.15, "adjectives with \"very\" (one target word for the two)")
    p_adverb: float = opt(0.3, "clauses with an adverb")
    p_subordinate: float = opt(0.35, "clauses with a subordinate clause (up to max_depth deep)")
    max_depth: int = opt(2, "nested subordinate clauses")
    p_polysemy: float = opt(0.0,
        "(head-analysis studies; 0 = off, the corpus as without these keys) "
        "verbs/adjectives with two senses, picked by a related noun's class")
    p_homograph: float = opt(0.0,
        "verbs spelt like a noun (\"run\"): only the context tells them apart")
    p_preverbal_adverb: float = opt(0.0, "adverbs between subject and verb (\"he often eats\")")


@dataclass
class ShakespeareDataConfig(DataConfig):
    """Shakespeare's 42 works (plain text, $HEADS_LAB_DATA/shakespeare: its README gives the
    source, licence and sha256s) for task=lm, split by work as the README says: valid =
    julius_caesar, twelfth_night; test = hamlet, tempest; train = the other 38. Each split's works
    are one token stream, an EOS between works, cut into blocks of data.block_size tokens."""

    name: str = "shakespeare"
    src: str = "en"
    tgt: str = "en"
    vocab_size: int = 4000
    root: str | None = opt(None, "the dir holding works/ (None = $HEADS_LAB_DATA/shakespeare)")
    valid: list[str] = field(default_factory=lambda: ["julius_caesar", "twelfth_night"],
                             metadata={"help": "the works held out for validation"})
    test: list[str] = field(default_factory=lambda: ["hamlet", "tempest"],
                            metadata={"help": "the works held out for test"})


@dataclass
class RepeatsDataConfig(DataConfig):
    """task=lm: random token sequences each repeated once after a random prefix, lengths
    varying (the induction-head control, docs/analysis.md); no text, so no bits per byte."""

    name: str = "repeats"
    src: str = "tokens"
    tgt: str = "tokens"
    vocab_size: int = opt(64, "token ids (4 of them special)")
    seed: int = opt(0, "fixes the sequences; not the training seed")
    train_size: int = opt(20000, "training sequences")
    valid_size: int = opt(200, "validation sequences")
    test_size: int = opt(500, "test sequences")
    min_repeat: int = opt(8, "the repeated part's shortest length")
    max_repeat: int = opt(24, "the repeated part's longest length")
    max_prefix: int = opt(16, "random tokens before the first copy: 0 to this many")
