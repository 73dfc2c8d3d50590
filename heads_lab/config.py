"""The config: composing conf/ (the typed schemas of heads_lab/schemas.py registered with
Hydra's ConfigStore), the checks that types alone cannot express, and which settings leave a
run's trajectory alone.

Each YAML file under conf/<group>/ lists its schema first in its defaults list, so Hydra checks
names and types when it composes the config: a typo or `model.heads=abc` fails before any work.
`validate()` then checks relations between values (heads dividing d_model, ...) and raises
`ConfigError` with a one-line message naming the key and the fix.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import itertools
import os
import re
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from heads_lab.errors import ConfigError

# The schemas live in heads_lab.schemas; re-exported here, next to what checks them.
from heads_lab.schemas import (  # noqa: F401
    ATTENTION_SITES,
    Activation,
    AttentionKind,
    CleaningConfig,
    CostConfig,
    DataConfig,
    EvalConfig,
    HFDataConfig,
    LoggerConfig,
    ModelConfig,
    Multi30kDataConfig,
    Norm,
    PathsConfig,
    RunConfig,
    SyntheticDataConfig,
    TextFilesDataConfig,
    TrainerConfig,
    WandbConfig,
    WandbMode,
)


def _subclasses(cls: type) -> list[type]:
    """Every subclass of `cls`, depth first (the data sources' schemas register themselves)."""
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


def register_configs() -> None:
    """Register the schemas so conf/ can name them in its defaults lists, and our resolvers."""
    from hydra.core.config_store import ConfigStore

    OmegaConf.register_new_resolver("hl_suffix", run_dir_suffix, replace=True)
    OmegaConf.register_new_resolver("hl_now", lambda fmt: start_time().strftime(fmt), replace=True)
    OmegaConf.register_new_resolver("hl_div", lambda a, b: int(a) // int(b), replace=True)

    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    # In their own group, so `--help` lists only real options under model/, data/, ...
    data = [("data", cls.name, cls) for cls in _subclasses(DataConfig)]  # each data source
    for group, name, node in (
        ("model", "model", ModelConfig),
        *data,
        ("trainer", "trainer", TrainerConfig),
        ("eval", "eval", EvalConfig),
        ("logger", "wandb", WandbConfig),
        ("logger", "none", LoggerConfig),
        ("logger", "tensorboard", LoggerConfig),
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


_START: list[datetime.datetime] = []


def start_time() -> datetime.datetime:
    """When this command started, for run-dir names: $HEADS_LAB_START_TIME (ISO) when set (the
    ranks of a data-parallel run share rank 0's, so they share one run dir), else now."""
    if not _START:
        given = os.environ.get("HEADS_LAB_START_TIME")
        _START.append(datetime.datetime.fromisoformat(given) if given else datetime.datetime.now())
    return _START[0]


def compose(overrides: list[str], hydra: bool = False) -> DictConfig:
    """conf/train.yaml composed with overrides, as `heads-lab train` would (no run dir); with
    `hydra`, the `hydra` node (sweeper, launcher, dirs) is included."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        return hydra_compose("train", overrides=overrides, return_hydra_config=hydra)


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


def describe_keys(obj: Any, prefix: str = "") -> list[str]:
    """`key = value  help` for every field of a config object (a composed RunConfig), nested
    groups as dotted keys; the help is the schema field's metadata["help"], and a choice lists
    its values."""
    lines = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            lines += describe_keys(value, key + ".")
            continue
        shown = value.value if isinstance(value, Enum) else value
        help_text = f.metadata.get("help", "")
        if isinstance(value, Enum) and "|" not in help_text:
            help_text += f" (one of {', '.join(c.value for c in type(value))})"
        lines.append(f"  {key} = {shown}" + (f"  # {help_text.strip()}" if help_text else ""))
    return lines


# Settings that change neither a run's trajectory nor its results: where things go, what
# watches them, how often it is checked and saved, what runs it. Checkpoints resume across them
# (with RESUMABLE_CHANGES), and `heads-lab report` never groups runs by them (with the seed,
# which it pools).
BOOKKEEPING = ("paths", "logger", "name", "tags", "analysis", "report", "cost", "data.root",
               "trainer.device", "trainer.threads", "trainer.compile", "trainer.valid_every",
               "trainer.log_every", "trainer.save_every", "trainer.keep_last", "trainer.resume",
               "trainer.save_checkpoint", "trainer.dist_timeout_s")
# ... and what a resumed run may change besides: how long it trains, how it is evaluated after
RESUMABLE_CHANGES = (*BOOKKEEPING, "trainer.max_steps", "trainer.max_epochs", "trainer.max_time",
                     "trainer.patience",
                     "trainer.max_bad_steps", "eval")


def written_before(flat: dict[str, Any]) -> dict[str, Any]:
    """Settings a flattened config lacks because it was written before they existed, with the
    value that stands for what its run did: {key: value}. A setting whose default kept the old
    behaviour is listed only where that value is not None (ADDED_WITH_DEFAULTS: a missing key
    and None already compare equal). model.mix_init (2026-11-25): before it,
    every talking-heads mix started as the identity; the default now starts a rectangular mix
    (h_K ≠ h or h ≠ h_V) as N(0, 1/fan-in), so such a run's start was `identity`."""
    before = {key: value for key, value in ADDED_WITH_DEFAULTS.items() if key not in flat}
    if "model.mix_init" in flat or flat.get("model.attention") not in ("talking_heads",
                                                                        AttentionKind.talking_heads):
        return before
    h = flat.get("model.heads")
    counts = {flat.get("model.heads_k") or h, flat.get("model.heads_v") or h, h}
    return before | ({"model.mix_init": "identity"} if len(counts) > 1 else {})


# settings added (2026-11-26) whose default is what every earlier run did, and is not None: a
# config written before them stands for these values (so a report row and a resume match)
ADDED_WITH_DEFAULTS = {"data.train_fraction": 1.0, "eval.checkpoint": "last"}


def is_among(key: str, prefixes) -> bool:
    """Whether a flattened key (model.heads) is one of `prefixes` or inside one of them."""
    return any(key == k or key.startswith(k + ".") for k in prefixes)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(run: RunConfig) -> None:
    """Checks the schemas cannot express, one group at a time. Raises ConfigError naming the
    key and the fix."""
    _check_model(run.model)
    _check_trainer(run.trainer)
    _check(run.trainer.save_checkpoint or str(getattr(run.eval.checkpoint, "value",
                                                      run.eval.checkpoint)) == "last",
           "eval.checkpoint=best evaluates checkpoints/best.pt: set trainer.save_checkpoint=true "
           "(or eval.checkpoint=last)")
    _check_analysis_prune(run.analysis, run.prune)
    _check_data(run.data, run.trainer, run.model)
    _check_eval(run.eval, run.data, run.model)


def _check_model(m) -> None:
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
    _check(m.relative_positions >= 0, f"model.relative_positions={m.relative_positions} must be "
           "0 (off) or the largest relative offset K that gets its own bias")
    for key in ("heads_k", "heads_v", "kv_heads"):
        value = getattr(m, key)
        _check(value is None or value >= 1, f"model.{key}={value} must be a positive integer")
    from heads_lab.variants import VARIANTS

    problem = VARIANTS[m.attention.value].check(m)  # the variant's own fields
    _check(problem is None, problem or "")
    unknown = [site for site in m.talking_heads_in if site not in ATTENTION_SITES]
    _check(not unknown, f"model.talking_heads_in has {unknown}: choose from {list(ATTENTION_SITES)}")
    for key in ("dropout", "attention_dropout"):
        value = getattr(m, key)
        _check(0.0 <= value < 1.0, f"model.{key}={value} must be in [0, 1)")
    _check(m.init != "admin" or m.norm == Norm.post,
           "model.init=admin is for post-norm models (Liu et al. 2020): set model.norm=post")


def _check_trainer(t) -> None:
    _check(
        t.max_steps is not None or t.max_epochs is not None,
        "trainer.max_steps and trainer.max_epochs are both null: set at least one",
    )
    for key in ("max_steps", "max_epochs"):
        value = getattr(t, key)
        _check(value is None or value >= 1, f"trainer.{key}={value} must be >= 1 (or null)")
    _check(t.patience is None or t.patience >= 1, f"trainer.patience={t.patience} must be >= 1 "
           "validations (or null: no early stop)")
    _check(t.max_time is None or t.max_time > 0, f"trainer.max_time={t.max_time} must be > 0 "
           "seconds of training (or null: no time budget)")
    _check(t.lr > 0, f"trainer.lr={t.lr} must be > 0")
    _check(t.warmup_steps >= 0, f"trainer.warmup_steps={t.warmup_steps} must be >= 0")
    _check(t.update_freq >= 1, f"trainer.update_freq={t.update_freq} must be >= 1")
    _check(0.0 <= t.label_smoothing < 1.0, "trainer.label_smoothing must be in [0, 1)")
    _check(len(t.adam_betas) == 2, "trainer.adam_betas must be two numbers, e.g. [0.9,0.98]")
    _check(t.valid_every >= 1 and t.log_every >= 1, "trainer.valid_every/log_every must be >= 1")
    _check(t.threads is None or t.threads >= 1, f"trainer.threads={t.threads} must be >= 1")
    _check(t.clip_norm >= 0, f"trainer.clip_norm={t.clip_norm} must be >= 0 (0 = no clipping)")
    _check(t.save_every >= 0, f"trainer.save_every={t.save_every} must be >= 0 (0 = only at the "
           "end, at each best validation and on a stop signal)")
    _check(t.keep_last >= 1, f"trainer.keep_last={t.keep_last} must be >= 1")
    _check(t.max_bad_steps >= 1, f"trainer.max_bad_steps={t.max_bad_steps} must be >= 1")
    _check(
        t.device == "auto" or t.device == "cpu" or t.device.startswith("cuda"),
        f"trainer.device={t.device!r} is not a device: use auto, cpu, cuda or cuda:N",
    )


def _check_analysis_prune(a, pr) -> None:
    _check(a.max_sentences is None or a.max_sentences >= 1,
           f"analysis.max_sentences={a.max_sentences} must be >= 1 (or null for all)")
    _check(a.min_arcs >= 1, f"analysis.min_arcs={a.min_arcs} must be >= 1")
    _check(a.lrp_sentences is None or a.lrp_sentences >= 1,
           f"analysis.lrp_sentences={a.lrp_sentences} must be >= 1 (or null: every sentence)")
    _check(a.rare_top_k is None or a.rare_top_k >= 0, f"analysis.rare_top_k={a.rare_top_k} "
           "must be >= 0 (Voita et al.: 500; 0 or null: count every sentence)")
    _check(not (a.treebank and a.conllu), "analysis.treebank and analysis.conllu both set: "
           "analysis.treebank analyses a treebank's own sentences, analysis.conllu parses of "
           "analysis.split's; choose one")
    _check(a.treebank or not a.treebank_ref, "analysis.treebank_ref needs analysis.treebank (the "
           "CoNLL-U file whose '# <ref> = ...' lines hold the translations, e.g. text_en)")
    for key in ("positional_threshold", "rare_threshold", "syntactic_margin"):
        value = getattr(a, key)
        _check(0.0 <= value <= 1.0, f"analysis.{key}={value} must be in [0, 1]")
    _check(0.0 < pr.step <= 0.5, f"prune.step={pr.step} must be in (0, 0.5] (a fraction of heads)")
    unknown = [site for site in pr.sites if site not in ATTENTION_SITES]
    _check(pr.sites and not unknown,
           f"prune.sites={list(pr.sites)}: choose some of {list(ATTENTION_SITES)}")
    _check(pr.l0_lambda >= 0, f"prune.l0_lambda={pr.l0_lambda} must be >= 0")
    _check(pr.temperature > 0, f"prune.temperature={pr.temperature} must be > 0")
    _check(len(pr.stretch) == 2 and pr.stretch[0] < 0 < 1 < pr.stretch[1],
           f"prune.stretch={list(pr.stretch)} must be [γ < 0, ζ > 1], e.g. [-0.1,1.1]")
    _check(pr.steps >= 1, f"prune.steps={pr.steps} must be >= 1")
    _check(0.0 < pr.init_keep < 1.0, f"prune.init_keep={pr.init_keep} must be in (0, 1): "
           "σ(log α) at the start, 0.9 or Voita et al.'s 0.5 (log α = 0)")
    _check(pr.eval_sentences is None or pr.eval_sentences >= 1,
           f"prune.eval_sentences={pr.eval_sentences} must be >= 1 (or null for all)")


def _check_data(d, t, m) -> None:
    _check(d.max_len >= 1, f"data.max_len={d.max_len} must be >= 1")
    _check(
        t.max_tokens >= d.max_len + 1,
        f"trainer.max_tokens={t.max_tokens} is smaller than the longest allowed sentence "
        f"(data.max_len={d.max_len} + EOS): raise trainer.max_tokens or lower data.max_len",
    )
    _check(d.max_len + 2 <= m.max_positions, "data.max_len + 2 must not exceed model.max_positions")
    _check(d.vocab_size >= 16, f"data.vocab_size={d.vocab_size} must be >= 16")
    c = d.cleaning
    _check(c.max_ratio is None or c.max_ratio >= 1,
           f"data.cleaning.max_ratio={c.max_ratio} must be >= 1 (or null for no ratio filter)")
    _check(0.0 < d.train_fraction <= 1.0, f"data.train_fraction={d.train_fraction} must be in "
           "(0, 1]: the share of the training pairs to train on (1 = all)")
    _check(d.max_train_pairs is None or d.max_train_pairs >= 1,
           f"data.max_train_pairs={d.max_train_pairs} must be >= 1 (or null for all)")
    if isinstance(d, TextFilesDataConfig):
        needed = ("{split}", "{lang}") if d.format == "text" else ("{split}",)
        _check(all(k in d.pattern for k in needed),
               f"data.pattern={d.pattern!r} must contain {' and '.join(needed)}")
    if isinstance(d, SyntheticDataConfig):
        for key in ("train_size", "valid_size", "test_size", "nouns", "verbs", "adjectives",
                    "adverbs"):
            _check(getattr(d, key) >= 1, f"data.{key}={getattr(d, key)} must be >= 1")
        for key, value in vars(d).items():
            if key.startswith("p_"):
                _check(0.0 <= value <= 1.0, f"data.{key}={value} must be a probability in [0, 1]")


def _check_eval(e, d, m) -> None:
    _check(e.average_last >= 1, f"eval.average_last={e.average_last} must be >= 1")
    _check(e.beam >= 1, f"eval.beam={e.beam} must be >= 1 (1 = greedy)")
    _check(e.lenpen >= 0, f"eval.lenpen={e.lenpen} must be >= 0")
    _check(e.max_sentences >= 1, f"eval.max_sentences={e.max_sentences} must be >= 1")
    if e.sacrebleu_test is not None:
        from heads_lab.data import testsets

        _check(e.split == "test", "eval.sacrebleu_test replaces the test split: set eval.split=test")
        testsets.check(e.sacrebleu_test, d.src, d.tgt)
    if e.bleu_tokenize is not None:
        from sacrebleu.metrics import BLEU

        _check(e.bleu_tokenize in BLEU.TOKENIZERS,
               f"eval.bleu_tokenize={e.bleu_tokenize!r} is not a sacrebleu tokenizer: use one of "
               f"{sorted(BLEU.TOKENIZERS)} (or null for 13a)")
    if e.head_mask:
        from heads_lab.sites import parse_head_mask
        from heads_lab.variants import out_heads

        parse_head_mask(e.head_mask, out_heads(m))  # raises ConfigError, one line


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0 and k <= 64]
