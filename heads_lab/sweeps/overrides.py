"""The command line as Hydra reads it: every override parsed before anything acts on it, and
the dirs that `hydra.run.dir` / `hydra.sweep.dir` name, quotes removed."""

from __future__ import annotations

from pathlib import Path

from hydra.errors import HydraException

from heads_lab.errors import ConfigError


def check_parses(overrides: list[str]) -> None:
    """Every override parses as Hydra reads it, before anything checks or creates a dir from it:
    an unquoted value holding '=' (a run dir named h=8) fails in one line naming the override
    and the quoting that fixes it (Hydra says only "mismatched input '='")."""
    from hydra.core.override_parser.overrides_parser import (  # lazy: start-up time (antlr)
        OverridesParser,
    )

    if any(o.startswith("-") and o not in ("-m", "--multirun") for o in overrides):
        return  # other Hydra flags (--cfg, --experimental-rerun ...) and their values: Hydra's
    parser = OverridesParser.create()
    for item in overrides:
        if "=" not in item:  # ~key
            continue
        try:
            parser.parse_override(item)
        except HydraException as err:
            raise ConfigError(
                f"cannot read the override {item!r} ({str(err).strip().splitlines()[0]}): quote a "
                "value that holds '=', ',' or spaces, e.g. 'hydra.sweep.dir=\"runs/h=8\"'"
            ) from None


def dir_override(item: str, key: str) -> Path | None:
    """The dir an override `key=value` names, as Hydra reads the value (quotes removed); None
    for another key or a value that is not one path (a sweep over dirs)."""
    if not item.startswith(key + "="):
        return None
    from hydra.core.override_parser.overrides_parser import (  # lazy: start-up time (antlr)
        OverridesParser,
    )

    raw = item.split("=", 1)[1]
    if "${" in raw:
        return None  # an interpolation (${now:...}): Hydra makes that dir itself
    value = OverridesParser.create().parse_override(item).value()
    if isinstance(value, (int, float, bool)):  # hydra.sweep.dir=2026 is the dir "2026"
        return Path(raw)
    return Path(value) if isinstance(value, str) else None
