"""A user's config mistake as one line: Hydra's and OmegaConf's composition errors (an unknown
key, an option not in its group, an append to a key that exists...) turned into what is wrong and
how to fix it, with the closest key or option where one is near. In config/ (it reads the config
tree and the schemas' keys), not beside the error classes: errors.py imports nothing of the
package."""

from __future__ import annotations

import difflib
import re

from heads_lab.config.compose import config_dir, field_names
from heads_lab.errors import HeadsLabError

# Hydra launchers that come with an extra (pyproject.toml), by hydra/launcher name
PLUGIN_EXTRAS = {"ray": "ray", "ray_aws": "ray", "joblib": "launchers",
                 "submitit_local": "launchers", "submitit_slurm": "launchers"}


def one_line(err: BaseException) -> str:
    """A user error (ours, or Hydra's and OmegaConf's composition errors) as one line: what is
    wrong and how to fix it."""
    if isinstance(err, HeadsLabError):
        return str(err)
    text = str(err).strip()
    cause = str(err.__cause__).strip().splitlines()[0] if err.__cause__ else ""
    first = text.splitlines()[0] if text else type(err).__name__
    unknown = re.match(r"Could not override '([^']+)'", first)
    if unknown:
        key = unknown.group(1)
        schema = re.search(r"not in '(\w+)'", cause)
        append = re.search(r"To append to your config use (\+\S+)", text)
        if not schema and append and "not in struct" in cause:  # a map field, e.g. data.files
            return (f"unknown config key '{key}': '{key.rpartition('.')[0]}' is a map, and a key "
                    f"new to it takes a leading +: {append.group(1)}")
        if "." not in key and not schema:  # an optional config group, added with +
            if (config_dir() / key).is_dir():
                return (f"'{key}' is an optional config group: add it with a leading +, "
                        f"e.g. +{key}=<option> (`heads-lab train --help` lists its options)")
        hint = ""
        if schema:  # the closest field of the very schema Hydra names, for the part it names
            missing = re.search(r"Key '([^']+)' not in", cause)
            parts = key.split(".")
            at = parts.index(missing.group(1)) if missing and missing.group(1) in parts else \
                len(parts) - 1
            hint = _did_you_mean(parts[at], field_names(schema.group(1)),
                                 "".join(p + "." for p in parts[:at]),
                                 "".join("." + p for p in parts[at + 1:]))
        return (f"unknown config key '{key}'{f' ({cause})' if cause else ''}{hint}; check the "
                "spelling against `heads-lab train --cfg job`")
    if "Ambiguous value for argument" in first:
        return (f"{first}: to sweep over the values, add -m (heads-lab train -m ...); a value "
                "that holds commas itself (a head list) goes in quotes, e.g. "
                "\"eval.head_mask='enc:0:3,dec-enc:1:*'\"")
    options = re.search(r"Could not find '([^']+)'.*?Available options in '([^']+)':\s*(.*?)"
                        r"(?:Config search path|$)", text, re.S)
    if options:
        choices = [o.strip() for o in options.group(3).split() if o.strip()]
        wrong = options.group(1).rsplit("/", 1)[-1]
        extra = PLUGIN_EXTRAS.get(wrong) if options.group(2) == "hydra/launcher" else None
        if extra:  # a launcher whose Hydra plugin is not installed
            return (f"hydra/launcher={wrong} needs its Hydra plugin: pip install "
                    f"'heads-lab[{extra}]' (installed now: {', '.join(choices)})")
        group = options.group(2)
        plus = "+" if group in OPTIONAL_GROUPS else ""  # not in train.yaml's defaults
        return (f"unknown config option '{options.group(1)}'"
                f"{_did_you_mean(wrong, choices, plus + group + '=')}; choose "
                f"{plus}{group}= one of: {', '.join(choices)}")
    append = re.match(r"Could not append to config\. An item is already at '([^']+)'", first)
    if append:
        return (f"{first.rstrip('.')}: drop the leading + ({append.group(1)}=VALUE sets it; "
                f"++{append.group(1)}=VALUE sets it whether or not it is there)")
    if re.match(r"Interpolation key '[^']+' not found", first):
        return (f"{first}: a ${{...}} in a value names another config key; name one that "
                "exists (`heads-lab train --cfg job` lists them), or write the text as \\${...}")
    if re.match(r"Error parsing override '", first):
        return (f"{first}: write key=value (a sweep: key=a,b,c with -m; a list: key=[a,b]); "
                "quote a value that holds spaces, commas or brackets")
    merge = re.match(r"Error merging override (\S+)", first)
    if merge:
        return f"bad value in override {merge.group(1)}: {cause}; fix the value's type or spelling"
    return f"{first}{': ' + cause if cause else ''}"


OPTIONAL_GROUPS = ("experiment", "mix", "depth", "cost_row")  # added with +group=option


def _did_you_mean(wrong: str, candidates: list[str], prefix: str = "", suffix: str = "") -> str:
    """' (did you mean model.heads?)' for the closest candidate (between `prefix` and `suffix`:
    a misspelt group's key keeps the rest, modle.heads → model.heads), or '' when none is
    close."""
    close = difflib.get_close_matches(wrong, candidates, n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}{suffix}?)" if close else ""
