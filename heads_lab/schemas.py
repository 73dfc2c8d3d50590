"""Typed config schemas: one dataclass per config group option. Plain dataclasses (no Hydra),
so every stage can take them as inputs; heads_lab.config registers them with Hydra's
ConfigStore and checks what types alone cannot."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import MISSING


class Norm(Enum):
    pre = "pre"  # LN(x) inside the residual branch (stable without long warm-up)
    post = "post"  # LN(x + f(x)), as in Vaswani et al. 2017


class AttentionKind(Enum):
    mha = "mha"  # multi-head; grouped/multi-query with kv_heads
    talking_heads = "talking_heads"  # Shazeer et al. 2020: heads_k, heads, heads_v + head mixing


ATTENTION_SITES = ("enc-self", "dec-self", "dec-enc")  # Voita's e, d, d-e


class Activation(Enum):
    relu = "relu"
    gelu = "gelu"


class WandbMode(Enum):
    online = "online"
    offline = "offline"
    disabled = "disabled"


@dataclass
class ModelConfig:
    d_model: int = 256
    heads: int = 8  # h: softmax heads (query heads for mha)
    head_dim: int | None = None  # d_k = d_v; None = d_model / heads (Table 3 (A) keeps h·d_k fixed)
    attention: AttentionKind = AttentionKind.mha
    heads_k: int | None = None  # h_K, talking heads' query/key heads; None = heads
    heads_v: int | None = None  # h_V, talking heads' value heads; None = heads
    kv_heads: int | None = None  # mha key/value heads (grouped-query; 1 = multi-query); None = heads
    talking_heads_in: list[str] = field(default_factory=lambda: list(ATTENTION_SITES))
    d_ff: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    dropout: float = 0.1  # residual, embedding and FFN dropout
    attention_dropout: float = 0.0  # on the attention weights
    activation: Activation = Activation.relu
    norm: Norm = Norm.pre
    init: str = "xavier"  # xavier | admin (post-norm: x = LN(ω⊙x + f(x)), ω from a profiling pass)
    max_positions: int = 1024
    # Self-attention: a learned bias per head and relative offset, clipped to ±K (0 = off; the
    # sinusoidal absolute positions stay either way)
    relative_positions: int = 0

    @property
    def d_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.heads

    def is_talking(self, site: str) -> bool:
        """Whether the attention at `site` (enc-self, dec-self, dec-enc) uses talking heads."""
        return self.attention == AttentionKind.talking_heads and site in self.talking_heads_in

    def head_counts(self, site: str) -> dict[str, int]:
        """Head counts at a site: q, k, v (projected), h (softmax) and out (into out_proj)."""
        h = self.heads
        if self.is_talking(site):
            hk, hv = self.heads_k or h, self.heads_v or h
            return {"q": hk, "k": hk, "v": hv, "h": h, "out": hv}
        kv = self.kv_heads or h
        return {"q": h, "k": kv, "v": kv, "h": h, "out": h}


@dataclass
class CleaningConfig:
    """Applied while reading. Every split: Unicode normalisation, whitespace collapsed and
    stripped. Training pairs only (held-out sets are never filtered): empty pairs dropped,
    optional de-duplication, and after subword encoding the length (data.max_len) and ratio
    filters of fairseq's recipes (clean-corpus-n: 1-250 subwords, ratio 1.5)."""

    normalize: str = "NFC"  # NFC | NFKC | NFD | NFKD | none
    dedup: bool = False  # drop training pairs seen before (after normalisation)
    max_ratio: float | None = 1.5  # longer / shorter side, in subwords; null = no ratio filter
    on_decode_error: str = "error"  # error | skip: lines that are not UTF-8 (skipped are counted)


@dataclass
class DataConfig:
    name: str = MISSING
    src: str = "src"  # source language code
    tgt: str = "tgt"  # target language code
    vocab_size: int = 8000  # joint subword vocabulary (SentencePiece)
    tokenizer: str = "bpe"  # SentencePiece model type: bpe | unigram
    max_len: int = 250  # subword tokens per side; longer training pairs are dropped
    max_train_pairs: int | None = None  # keep only the first N cleaned training pairs
    cleaning: CleaningConfig = field(default_factory=CleaningConfig)


@dataclass
class TextFilesDataConfig(DataConfig):
    """A parallel corpus in plain-text files (gzip allowed) under `root`: with format=text, one
    file per split and side named by `pattern` ({split}, {lang}); with format=tsv, one file per
    split (`pattern` with {split}), one `source<TAB>target` pair per line."""

    name: str = "local"
    root: str | None = None
    format: str = "text"  # text | tsv
    pattern: str = "{split}.{lang}"  # a .gz twin is tried too
    train: str = "train"  # split names as they appear in file names
    valid: str = "valid"
    test: str = "test"


@dataclass
class Multi30kDataConfig(TextFilesDataConfig):
    """Multi30k task 1 (Elliott et al. 2016): en, de, fr, cs. `root` defaults to
    $HEADS_LAB_DATA/multi30k (or $HEADS_LAB_DATA); without the files, the hub copy is tried."""

    name: str = "multi30k"
    src: str = "de"
    tgt: str = "en"
    train: str = "train"
    valid: str = "val"
    test: str = "test_2016_flickr"  # or test_2017_flickr, test_2017_mscoco, test_2018_flickr
    hub_dataset: str = "bentrevett/multi30k"  # en/de columns; train / validation / test


@dataclass
class HFDataConfig(DataConfig):
    """A Hugging Face dataset in the WMT schema (a `translation` column of {lang: text}) or with
    one column per language. `dataset` is a hub name, a directory saved by `save_to_disk`, or a
    loader name (json, parquet, csv) with `files` mapping each split to local files."""

    name: str = "hf"
    dataset: str | None = None
    config: str | None = None  # the dataset's configuration, e.g. de-en for wmt/wmt14
    revision: str | None = None
    column: str | None = "translation"  # null: the text is in columns named like data.src/tgt
    files: dict[str, str] = field(default_factory=dict)  # split name → file(s), for json/parquet
    train: str = "train"
    valid: str = "validation"
    test: str = "test"


@dataclass
class SyntheticDataConfig(DataConfig):
    """The embedded language pair (heads_lab.data.synthetic); the seed fixes the language and
    the corpus, independent of the training seed."""

    name: str = "synthetic"
    vocab_size: int = 2000
    seed: int = 0
    train_size: int = 20000
    valid_size: int = 500
    test_size: int = 1000
    nouns: int = 400
    verbs: int = 100
    adjectives: int = 100
    adverbs: int = 40
    zipf: float = 1.1  # word-frequency exponent: p(rank r) ∝ r^-zipf
    p_cognate: float = 0.5  # lemmas whose target form is a sound-shifted copy of the source
    p_synonym: float = 0.05  # lemmas that share their target translation (many-to-one)
    p_pronoun: float = 0.25
    p_plural: float = 0.3
    p_past: float = 0.3
    p_adjective: float = 0.45
    p_very: float = 0.15
    p_adverb: float = 0.3
    p_subordinate: float = 0.35
    max_depth: int = 2  # nested subordinate clauses
    # Head-analysis studies (0 = off; then the corpus is the same as without these keys):
    p_polysemy: float = 0.0  # verbs/adjectives with two senses, picked by a related noun's class
    p_homograph: float = 0.0  # verbs spelt like a noun ("run"): only the context tells them apart
    p_preverbal_adverb: float = 0.0  # adverbs between subject and verb ("he often eats")


@dataclass
class TrainerConfig:
    max_steps: int | None = 300  # stop at max_steps or max_epochs, whichever comes first
    max_epochs: int | None = None
    max_tokens: int = 4096  # batch size in tokens (padded source or target, whichever is larger)
    update_freq: int = 1  # accumulate gradients over this many batches per step
    lr: float = 3e-3  # peak learning rate, reached after warmup_steps
    position_bias_lr: float | None = 0.05  # model.relative_positions' biases (null = lr)
    warmup_steps: int = 200  # then inverse-square-root decay
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 0.0  # 0 = no gradient clipping
    valid_every: int = 100  # steps between validations (and at the end)
    log_every: int = 50
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "fp32"  # fp32 | bf16 (autocast: bf16 matmuls, fp32 weights and loss)
    threads: int | None = None  # CPU threads; None = all cores
    save_checkpoint: bool = True  # write checkpoints (run_dir/checkpoints/) at all
    save_every: int = 500  # steps between checkpoints; also saved at the end, at each new best
    #                        validation and on SIGTERM/SIGINT/SIGUSR2 (0: only those)
    keep_last: int = 2  # step checkpoints kept (plus checkpoints/best.pt)
    resume: str = "auto"  # auto: continue from the newest valid checkpoint in the run dir | never
    max_bad_steps: int = 5  # stop after this many non-finite (skipped) steps in a row


@dataclass
class EvalConfig:
    beam: int = 4  # 1 = greedy
    lenpen: float = 0.6  # GNMT length penalty α: score / ((5 + |y|) / 6)^α
    max_len_a: float = 1.5  # output length limit: a · source length + b
    max_len_b: int = 10
    max_sentences: int = 128  # sentences per decoding batch
    split: str = "test"
    bleu_tokenize: str | None = None  # sacrebleu tokenizer; None = sacrebleu's default (13a)
    sacrebleu_test: str | None = None  # e.g. wmt14: test on sacrebleu's copy of a standard set
    average_last: int = 1  # `heads-lab eval`: average the weights of the last N checkpoints
    head_mask: str | None = None  # heads zeroed at evaluation, e.g. enc:0:3,dec-enc:2:*


@dataclass
class LoggerConfig:
    name: str = "none"  # wandb | none


@dataclass
class WandbConfig(LoggerConfig):
    name: str = "wandb"
    project: str = "heads-lab"
    entity: str | None = None
    mode: WandbMode = WandbMode.offline
    group: str | None = None
    job_type: str = "train"
    tags: list[str] = field(default_factory=list)
    notes: str | None = None


@dataclass
class PathsConfig:
    cache_dir: str | None = None  # tokenizers and preprocessed data; None = $HEADS_LAB_CACHE or
    # ~/.cache/heads-lab


@dataclass
class CostConfig:
    # Lengths (subword tokens) at which `heads-lab info` counts FLOPs and attention memory;
    # training runs use their data's mean lengths instead.
    src_len: float = 20.0
    tgt_len: float = 20.0


@dataclass
class ReportConfig:
    # How `heads-lab report` reads a study (experiment presets set these): the base row the other
    # rows are tested against, e.g. {model.heads: 8}, and published numbers to print beside ours.
    base: dict[str, Any] = field(default_factory=dict)
    paper: str | None = None  # table_a: Vaswani et al. 2017, Table 3 (A)


@dataclass
class AnalysisConfig:
    # `heads-lab analyze <run dir>`: what each head does (Voita et al. 2019, Clark et al. 2019,
    # Michel et al. 2019), on `split` (teacher-forced on the reference translations).
    split: str = "test"  # train | valid | test
    max_sentences: int | None = 500  # the first N sentences of the split or treebank (null: all)
    positional_threshold: float = 0.9  # positional: max weight on one relative offset this often
    rare_threshold: float = 0.5  # rare-word: max weight on the rarest source token this often
    syntactic_margin: float = 0.1  # syntactic: accuracy above the offset baseline by this much
    min_arcs: int = 20  # syntactic: only relations with at least this many arcs label a head
    conllu: str | None = None  # a CoNLL-U file of the split's source sentences (real data)
    treebank: str | None = None  # a CoNLL-U file (.gz too) analysed on its own `# text` lines
    treebank_ref: str | None = None  # its comment holding translations (text_en): decoder too
    heatmaps: list[str] = field(default_factory=list)  # heads to draw, e.g. [enc:0:3, dec-enc:2:*]
    sentences: list[int] = field(default_factory=lambda: [0])  # sentences for heatmaps/head view


@dataclass
class PruneConfig:
    # `heads-lab prune <run dir> method=importance|gates`, and gates trained from scratch by
    # `heads-lab train prune.l0_lambda=...` (Voita et al. 2019).
    method: str = "importance"  # importance (Michel et al. 2019) | gates (Voita et al. 2019)
    split: str = "valid"  # where importance is measured
    eval_split: str = "test"  # where BLEU and PPL are measured at each step
    eval_sentences: int | None = 500  # the first N sentences of eval_split (null = all)
    step: float = 0.1  # importance: fraction of the heads pruned per step
    sites: list[str] = field(default_factory=lambda: list(ATTENTION_SITES))  # heads to prune
    l0_lambda: float = 0.0  # gates: weight of the L0 penalty; > 0 in `train` gates from scratch
    temperature: float = 0.33  # Hard Concrete β
    stretch: list[float] = field(default_factory=lambda: [-0.1, 1.1])  # (γ, ζ)
    steps: int = 500  # gates from a trained run: fine-tuning steps with the gates
    lr: float | None = None  # gates from a trained run: the model's learning rate (null = the
    # run's last one)
    gate_lr: float | None = 0.05  # the gates' log α learning rate (null = the model's)
    # which heads a trained gate keeps, ẑ = clamp(σ(log α)(ζ − γ) + γ, 0, 1) being its
    # deterministic value: voita (Voita et al.'s code: alive iff ẑ > 0, i.e. log α > −ln(−ζ/γ),
    # the kept head's output × ẑ) | binary (alive iff ẑ > 0.5, log α > 0 for the default
    # stretch, output × 1)
    gate_eval: str = "voita"
    init_keep: float = 0.9  # σ(log α) at the start: 0.9 (log α ≈ 2.2) | 0.5 (log α = 0, Voita's)


@dataclass
class RunConfig:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    trainer: TrainerConfig = MISSING
    eval: EvalConfig = MISSING
    logger: LoggerConfig = MISSING
    paths: PathsConfig = field(default_factory=PathsConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    seed: int = 1
    name: str = "train"  # experiment name (wandb group when none is set)
    tags: list[str] = field(default_factory=list)  # wandb tags (presets add theirs)
