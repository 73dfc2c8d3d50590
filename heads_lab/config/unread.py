"""The prune.* settings each command reads. One set on the command line that the command will
not read with this config is named in a warning instead of passing silently (prune.gate_lr on a
run without gates). A warning, not an error: a sweep such as `-m prune.l0_lambda=0,0.05
prune.gate_lr=0.1` sets it for every job, the λ = 0 control included."""

from __future__ import annotations

GATES = ("sites", "temperature", "stretch", "gate_lr", "gate_eval", "init_keep")
READS = {  # what `heads-lab prune` reads, by method
    "importance": ("method", "split", "eval_split", "eval_sentences", "step", "sites"),
    "gates": ("method", "eval_split", "eval_sentences", "steps", "lr", "l0_lambda", *GATES),
}


def unread_prune_settings(overrides: list[str], command: str, prune) -> list[str]:
    """A warning line for each prune.KEY=VALUE of `overrides` that `command` ("train", "prune",
    or "prune hf", which runs method=importance only) does not read with the config `prune` (a
    PruneConfig)."""
    method = getattr(prune.method, "value", prune.method)
    warnings = []
    for item in overrides:
        key, _, _ = item.lstrip("+~").partition("=")
        name = key.removeprefix("prune.")
        if name == key:
            continue  # not a prune setting
        if command == "train":
            if name == "l0_lambda" or (name in GATES and prune.l0_lambda > 0):
                continue
            why = ("head gates train only with prune.l0_lambda > 0" if name in GATES else
                   "it is a setting of heads-lab prune, which reads it from this run's config"
                   if prune.l0_lambda == 0 else "it is a setting of heads-lab prune, which "
                   "does not prune a run trained with gates")
            warnings.append(f"{item} has no effect on this training: {why}")
        elif name not in READS[method]:
            other = ("prune hf:... runs method=importance only" if command == "prune hf" else
                     f"only method={'gates' if method == 'importance' else 'importance'} "
                     "reads it")
            warnings.append(f"{item} has no effect with method={method}: {other}")
    return warnings
