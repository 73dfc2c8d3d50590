"""Typed config schemas (one dataclass per group), their ConfigStore registration and the
checks that types alone cannot express.

Each YAML file under conf/<group>/ lists its schema first in its defaults list, so Hydra checks
names and types when it composes the config: a typo or `model.heads=abc` fails before any work.
`validate()` then checks relations between values (heads dividing d_model, ...) and raises
`ConfigError` with a one-line message naming the key and the fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from heads_lab.errors import ConfigError


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
    max_positions: int = 1024

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
class DataConfig:
    name: str = MISSING
    src: str = "src"
    tgt: str = "tgt"
    vocab_size: int = 8000  # joint subword vocabulary (SentencePiece)
    tokenizer: str = "bpe"  # SentencePiece model type: bpe | unigram
    max_len: int = 128  # subword tokens per side; longer training pairs are dropped


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


@dataclass
class TrainerConfig:
    max_steps: int | None = 300  # stop at max_steps or max_epochs, whichever comes first
    max_epochs: int | None = None
    max_tokens: int = 4096  # batch size in tokens (padded source or target, whichever is larger)
    update_freq: int = 1  # accumulate gradients over this many batches per step
    lr: float = 3e-3  # peak learning rate, reached after warmup_steps
    warmup_steps: int = 200  # then inverse-square-root decay
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 0.0  # 0 = no gradient clipping
    valid_every: int = 100  # steps between validations (and at the end)
    log_every: int = 50
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int | None = None  # CPU threads; None = all cores
    save_checkpoint: bool = True


@dataclass
class EvalConfig:
    beam: int = 4  # 1 = greedy
    lenpen: float = 0.6  # GNMT length penalty α: score / ((5 + |y|) / 6)^α
    max_len_a: float = 1.5  # output length limit: a · source length + b
    max_len_b: int = 10
    max_sentences: int = 128  # sentences per decoding batch
    split: str = "test"
    bleu_tokenize: str | None = None  # sacrebleu tokenizer; None = sacrebleu's default (13a)


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
class RunConfig:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    trainer: TrainerConfig = MISSING
    eval: EvalConfig = MISSING
    logger: LoggerConfig = MISSING
    paths: PathsConfig = field(default_factory=PathsConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    seed: int = 1
    name: str = "train"  # experiment name (wandb group when none is set)


def register_configs() -> None:
    """Register the schemas so conf/ can name them in its defaults lists, and our resolvers."""
    from hydra.core.config_store import ConfigStore

    OmegaConf.register_new_resolver("hl_suffix", run_dir_suffix, replace=True)

    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    # In their own group, so `--help` lists only real options under model/, data/, ...
    for group, name, node in (
        ("model", "model", ModelConfig),
        ("data", "synthetic", SyntheticDataConfig),
        ("trainer", "trainer", TrainerConfig),
        ("eval", "eval", EvalConfig),
        ("logger", "wandb", WandbConfig),
        ("logger", "none", LoggerConfig),
    ):
        cs.store(group=f"schema/{group}", name=name, node=node)


def run_dir_suffix(override_dirname: str, limit: int = 150) -> str:
    """'_model.heads=8,seed=2' for run dir names ('' without overrides), safe as one path part;
    a long one is cut and ends in a hash of the whole, so names stay distinct."""
    if not override_dirname:
        return ""
    name = re.sub(r"[/\\\s]+", "-", override_dirname)
    if len(name) > limit:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = f"{name[: limit - 10]}~{digest}"
    return "_" + name


def compose(overrides: list[str]) -> DictConfig:
    """conf/train.yaml composed with overrides, as `heads-lab train` would (no run dir)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        return hydra_compose("train", overrides=overrides)


def expand_sweeps(overrides: list[str]) -> list[list[str]]:
    """Hydra sweep syntax expanded: ['a=1,2', 'b=3'] → [['a=1', 'b=3'], ['a=2', 'b=3']]."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
               if o.is_sweep_override() else [o.input_line] for o in parsed]
    return [list(job) for job in itertools.product(*choices)]


def config_dir() -> Path:
    """The config tree: heads_lab/conf inside a wheel, <repo>/conf in a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "train.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"heads-lab's config tree (train.yaml) is missing next to {here}")


def cache_dir(cfg: PathsConfig) -> Path:
    root = cfg.cache_dir or os.environ.get("HEADS_LAB_CACHE")
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "heads-lab"
    return Path(root).expanduser()


def to_object(cfg: DictConfig) -> RunConfig:
    """The composed DictConfig as typed dataclass instances (interpolations resolved). A key
    added with `+key=value` outside the schemas is refused: nothing would ever read it."""
    extra = unknown_keys(cfg)
    _check(not extra, f"unknown config key '{extra[0] if extra else ''}': it is not in the "
           "schema, so nothing would read it; check the spelling against `heads-lab train --cfg job`")
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]


def unknown_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Keys of `cfg` that its dataclass schemas do not declare."""
    schema = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(schema):
        return []
    names = {f.name for f in dataclasses.fields(schema)}
    extra = []
    for key in cfg.keys():
        if key not in names:
            extra.append(f"{prefix}{key}")
        elif OmegaConf.is_dict(child := cfg._get_node(key)):
            extra += unknown_keys(child, f"{prefix}{key}.")
    return extra


def to_dict(cfg: DictConfig) -> dict[str, Any]:
    """A plain, JSON-ready dict of the resolved config (enums as their names)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(run: RunConfig) -> None:
    """Checks the schemas cannot express. Raises ConfigError naming the key and the fix."""
    m, t, e, d = run.model, run.trainer, run.eval, run.data
    for key in ("d_model", "heads", "d_ff", "encoder_layers", "decoder_layers", "max_positions"):
        value = getattr(m, key)
        _check(value >= 1, f"model.{key}={value} must be a positive integer")
    if m.head_dim is None:
        _check(
            m.d_model % m.heads == 0,
            f"model.heads={m.heads} does not divide model.d_model={m.d_model}: choose heads from "
            f"{_divisors(m.d_model)} or set model.head_dim",
        )
    else:
        _check(m.head_dim >= 1, f"model.head_dim={m.head_dim} must be a positive integer")
    for key in ("heads_k", "heads_v", "kv_heads"):
        value = getattr(m, key)
        _check(value is None or value >= 1, f"model.{key}={value} must be a positive integer")
    if m.kv_heads is not None:
        _check(m.attention == AttentionKind.mha,
               f"model.kv_heads={m.kv_heads} applies to model.attention=mha; talking heads set "
               "their key and value heads with model.heads_k and model.heads_v")
        _check(m.heads % m.kv_heads == 0,
               f"model.heads={m.heads} is not a multiple of model.kv_heads={m.kv_heads}: kv_heads "
               f"must divide heads (one of {_divisors(m.heads)})")
    if m.attention == AttentionKind.mha:
        for key in ("heads_k", "heads_v"):
            value = getattr(m, key)
            _check(value is None or value == m.heads,
                   f"model.{key}={value} needs model.attention=talking_heads (mha uses "
                   "model.heads for queries, keys and values)")
    unknown = [site for site in m.talking_heads_in if site not in ATTENTION_SITES]
    _check(not unknown, f"model.talking_heads_in has {unknown}: choose from {list(ATTENTION_SITES)}")
    for key in ("dropout", "attention_dropout"):
        value = getattr(m, key)
        _check(0.0 <= value < 1.0, f"model.{key}={value} must be in [0, 1)")

    _check(
        t.max_steps is not None or t.max_epochs is not None,
        "trainer.max_steps and trainer.max_epochs are both null: set at least one",
    )
    for key in ("max_steps", "max_epochs"):
        value = getattr(t, key)
        _check(value is None or value >= 1, f"trainer.{key}={value} must be >= 1 (or null)")
    _check(t.lr > 0, f"trainer.lr={t.lr} must be > 0")
    _check(t.warmup_steps >= 0, f"trainer.warmup_steps={t.warmup_steps} must be >= 0")
    _check(t.update_freq >= 1, f"trainer.update_freq={t.update_freq} must be >= 1")
    _check(0.0 <= t.label_smoothing < 1.0, "trainer.label_smoothing must be in [0, 1)")
    _check(len(t.adam_betas) == 2, "trainer.adam_betas must be two numbers, e.g. [0.9,0.98]")
    _check(t.valid_every >= 1 and t.log_every >= 1, "trainer.valid_every/log_every must be >= 1")
    _check(t.threads is None or t.threads >= 1, f"trainer.threads={t.threads} must be >= 1")
    _check(
        t.device == "auto" or t.device == "cpu" or t.device.startswith("cuda"),
        f"trainer.device={t.device!r} is not a device: use auto, cpu, cuda or cuda:N",
    )
    _check(d.max_len >= 1, f"data.max_len={d.max_len} must be >= 1")
    _check(
        t.max_tokens >= d.max_len + 1,
        f"trainer.max_tokens={t.max_tokens} is smaller than the longest allowed sentence "
        f"(data.max_len={d.max_len} + EOS): raise trainer.max_tokens or lower data.max_len",
    )
    _check(d.max_len + 2 <= m.max_positions, "data.max_len + 2 must not exceed model.max_positions")
    _check(d.vocab_size >= 16, f"data.vocab_size={d.vocab_size} must be >= 16")
    _check(d.tokenizer in ("bpe", "unigram"), "data.tokenizer must be bpe or unigram")
    if isinstance(d, SyntheticDataConfig):
        for key in ("train_size", "valid_size", "test_size", "nouns", "verbs", "adjectives",
                    "adverbs"):
            _check(getattr(d, key) >= 1, f"data.{key}={getattr(d, key)} must be >= 1")
        for key, value in vars(d).items():
            if key.startswith("p_"):
                _check(0.0 <= value <= 1.0, f"data.{key}={value} must be a probability in [0, 1]")

    _check(e.beam >= 1, f"eval.beam={e.beam} must be >= 1 (1 = greedy)")
    _check(e.lenpen >= 0, f"eval.lenpen={e.lenpen} must be >= 0")
    _check(e.max_sentences >= 1, f"eval.max_sentences={e.max_sentences} must be >= 1")
    _check(e.split in ("valid", "test"), f"eval.split={e.split!r} must be valid or test")
    if e.bleu_tokenize is not None:
        from sacrebleu.metrics import BLEU

        _check(e.bleu_tokenize in BLEU.TOKENIZERS,
               f"eval.bleu_tokenize={e.bleu_tokenize!r} is not a sacrebleu tokenizer: use one of "
               f"{sorted(BLEU.TOKENIZERS)} (or null for 13a)")


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0 and k <= 64]
