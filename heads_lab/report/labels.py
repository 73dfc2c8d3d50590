"""How the report writes settings: a config value as an override writes it, and which settings
the runs' own command lines set. Torch-free."""

from __future__ import annotations

from typing import Any


def as_written(value: Any) -> str:
    """A config value as an override writes it (null, true, [enc-self]), not as Python prints
    it (None, True, ['enc-self'])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(as_written(v) for v in value) + "]"
    return str(value)


def swept(runs: list) -> set[str]:
    """The settings the runs' own command lines set (results.json's overrides, `+`/`~` dropped),
    e.g. model.heads_k in `talking_heads_kv`, where model.head_dim and model.heads_v follow it."""
    return {item.split("=", 1)[0].lstrip("+~") for run in runs
            for item in run.results.get("overrides", []) if "=" in item}
