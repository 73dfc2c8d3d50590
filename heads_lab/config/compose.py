"""The config: composing conf/ (the typed schemas of heads_lab/config/schemas.py registered with
Hydra's ConfigStore), reading it back, and which settings leave a run's trajectory alone.

Each YAML file under conf/<group>/ lists its schema first in its defaults list, so Hydra checks
names and types when it composes the config: a typo or `model.heads=abc` fails before any work.
`heads_lab.config.validate` then checks relations between values (heads dividing d_model, ...)
and raises `ConfigError` with a one-line message naming the key and the fix.
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

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from heads_lab.config.schemas import (
    AttentionKind,
    DataConfig,
    EvalConfig,
    LoggerConfig,
    ModelConfig,
    PathsConfig,
    RunConfig,
    TrainerConfig,
)
from heads_lab.errors import ConfigError


def _subclasses(cls: type) -> list[type]:
    """Every subclass of `cls`, depth first (the data sources' schemas register themselves)."""
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


def register_configs() -> None:
    """Register the schemas so conf/ can name them in its defaults lists, and our resolvers."""
    OmegaConf.register_new_resolver("hl_suffix", run_dir_suffix, replace=True)
    OmegaConf.register_new_resolver("hl_now", lambda fmt: start_time().strftime(fmt), replace=True)
    OmegaConf.register_new_resolver("hl_div", lambda a, b: int(a) // int(b), replace=True)

    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    # In their own group, so `--help` lists only real options under model/, data/, ...
    data = [("data", cls.name, cls) for cls in _subclasses(DataConfig)]  # each data source
    # each tracker conf/logger/<name>.yaml names: the LoggerConfig subclass whose name is its
    # (its own fields: WandbConfig), else LoggerConfig itself (TensorBoard, none)
    own = {cls.name: cls for cls in _subclasses(LoggerConfig)}
    loggers = [("logger", path.stem, own.get(path.stem, LoggerConfig))
               for path in sorted((config_dir() / "logger").glob("*.yaml"))]
    for group, name, node in (
        ("model", "model", ModelConfig),
        *data,
        ("trainer", "trainer", TrainerConfig),
        ("eval", "eval", EvalConfig),
        *loggers,
    ):
        cs.store(group=f"schema/{group}", name=name, node=node)


def run_dir_suffix(override_dirname: str, limit: int = 150) -> str:
    """'_model.heads=8,seed=2' for run dir names ('' without overrides), safe as one path part
    (no separators or spaces, and no quote characters: "eval.head_mask='enc:0:3'" names a dir
    eval.head_mask=enc:0:3); a long one is cut and ends in a hash of the whole, so names stay
    distinct."""
    if not override_dirname:
        return ""
    name = re.sub(r"[/\\\s]+", "-", override_dirname).replace("'", "").replace('"', "")
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
    register_configs()
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        return hydra_compose("train", overrides=overrides, return_hydra_config=hydra)


def expand_sweeps(overrides: list[str]) -> list[list[str]]:
    """Hydra sweep syntax expanded: ['a=1,2', 'b=3'] → [['a=1', 'b=3'], ['a=2', 'b=3']]."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
               if o.is_sweep_override() else [o.input_line] for o in parsed]
    return [list(job) for job in itertools.product(*choices)]


def config_dir() -> Path:
    """The config tree: heads_lab/conf inside a wheel, <repo>/conf in a source checkout."""
    here = Path(__file__).resolve().parents[1]  # the heads_lab package
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
    if extra:
        raise ConfigError(f"unknown config key '{extra[0]}': it is not in the schema, so nothing "
                          "would read it; check the spelling against `heads-lab train --cfg job`")
    try:
        return OmegaConf.to_object(cfg)  # type: ignore[return-value]
    except MissingMandatoryValue as err:  # e.g. a group removed with ~model
        key = getattr(err, "full_key", "") or "a setting"
        fix = (f"a group removed with ~{key} needs another: {key}=<option> (`heads-lab train "
               "--help` lists them)" if (config_dir() / key).is_dir() else f"set {key}=VALUE")
        raise ConfigError(f"{key} has no value, and a run needs one: {fix}") from None


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
    its values (a subclass that changes a field's default and not its help: its parent's)."""
    lines = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            lines += describe_keys(value, key + ".")
            continue
        shown = value.value if isinstance(value, Enum) else value
        help_text = _help(type(obj), f.name)
        if isinstance(value, Enum) and "|" not in help_text:
            help_text += f" (one of {', '.join(c.value for c in type(value))})"
        lines.append(f"  {key} = {shown}" + (f"  # {help_text.strip()}" if help_text else ""))
    return lines


def _help(schema: type, name: str) -> str:
    """The help of field `name`: the nearest class in the schema's MRO that gives it one."""
    for cls in schema.__mro__:
        own = getattr(cls, "__dataclass_fields__", {}).get(name)
        if own is not None and own.metadata.get("help"):
            return own.metadata["help"]
    return ""


def field_names(schema: str) -> list[str]:
    """The field names of the schema class named `schema` (as Hydra names it in an unknown-key
    error: 'ModelConfig', 'TatoebaDataConfig'), for "did you mean" suggestions; [] if unknown."""
    from heads_lab.config import schemas  # lazy: only on that error

    classes = [c for c in vars(schemas).values() if dataclasses.is_dataclass(c)]
    classes += _subclasses(DataConfig) + _subclasses(LoggerConfig)
    found = next((c for c in classes if c.__name__ == schema), None)
    return [f.name for f in dataclasses.fields(found)] if found else []


# Settings that change neither a run's trajectory nor its results: where things go, what
# watches them, how often it is checked and saved, what runs it (compiled or captured: the same
# step, its sums in another order, as a GPU's kernels differ from a CPU's). Checkpoints resume across them
# (with RESUMABLE_CHANGES), and `heads-lab report` never groups runs by them (with the seed,
# which it pools).
BOOKKEEPING = ("paths", "logger", "name", "tags", "analysis", "report", "cost", "data.root",
               "trainer.device", "trainer.threads", "trainer.compile", "trainer.capture",
               "trainer.valid_every",
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


# settings added (2026-11-26, -27) whose default is what every earlier run did, and is not None:
# a config written before them stands for these values (so a report row and a resume match)
ADDED_WITH_DEFAULTS = {"data.train_fraction": 1.0, "eval.checkpoint": "last",
                       "trainer.capture": False, "trainer.pad_multiple": 1,
                       # (2026-12-07) language models trained here
                       "task": "translate", "trainer.schedule": "inverse_sqrt",
                       "trainer.min_lr": 0.1, "trainer.optimizer": "adam",
                       "data.block_size": 256, "data.held_out": 2000, "data.seed": 0,
                       "model.positions": "sinusoidal"}


def is_among(key: str, prefixes) -> bool:
    """Whether a flattened key (model.heads) is one of `prefixes` or inside one of them."""
    return any(key == k or key.startswith(k + ".") for k in prefixes)
