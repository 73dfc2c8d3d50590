"""Settings set on the command line that the command will not read with this config, named in a
warning instead of passing silently: the prune.* settings each command reads (prune.gate_lr on a
run without gates), and training settings that another setting turns off (model.talking_heads_in
with attention=mha). A warning, not an error: a sweep such as `-m prune.l0_lambda=0,0.05
prune.gate_lr=0.1` or `-m model.attention=mha,talking_heads model.talking_heads_in=[enc-self]`
sets it for every job, the control included."""

from __future__ import annotations

GATES = ("sites", "temperature", "stretch", "gate_lr", "gate_eval", "init_keep")
READS = {  # what `heads-lab prune` reads, by method
    "importance": ("method", "split", "eval_split", "eval_sentences", "step", "sites"),
    "gates": ("method", "eval_split", "eval_sentences", "steps", "lr", "l0_lambda", *GATES),
}


def unread_prune_settings(overrides: list[str], command: str, prune,
                          pretrained: bool = False) -> list[str]:
    """A warning line for each prune.KEY=VALUE of `overrides` that `command` ("train", "prune";
    of a `pretrained` model it runs method=importance only) does not read with the config
    `prune` (a PruneConfig)."""
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
            other = ("prune hf:... runs method=importance only" if pretrained else
                     f"only method={'gates' if method == 'importance' else 'importance'} "
                     "reads it")
            warnings.append(f"{item} has no effect with method={method}: {other}")
    return warnings


SYNTHETIC_CLEAN = ("data.cleaning.normalize", "data.cleaning.dedup", "data.cleaning.on_decode_error")


def unread_train_settings(overrides: list[str], run) -> list[str]:
    """A warning line for each KEY=VALUE of `overrides` that `heads-lab train` will not act on
    with the config `run` (a RunConfig), because another setting turns it off."""
    attention = getattr(run.model.attention, "value", run.model.attention)
    t = run.trainer
    validations = None if t.max_steps is None else t.max_steps // t.valid_every
    why = {
        "model.talking_heads_in": "model.attention=mha has no talking heads"
        if attention == "mha" else None,
        "trainer.position_bias_lr": "model.relative_positions=0 gives no position biases"
        if not run.model.relative_positions else None,
        "trainer.patience": f"this run validates {validations} time(s) (every "
        f"trainer.valid_every={t.valid_every} of trainer.max_steps={t.max_steps}), too few for "
        f"{t.patience} validations without improvement"
        if t.patience and validations is not None and validations <= t.patience else None,
        **{key: "data=synthetic is generated clean (only data.cleaning.max_ratio applies)"
           if run.data.name == "synthetic" else None for key in SYNTHETIC_CLEAN},
        "data.max_train_pairs": "data=synthetic generates data.train_size training pairs: set "
        "that instead" if run.data.name == "synthetic" else None,
    }
    warnings = []
    for item in overrides:
        key = item.lstrip("+~").partition("=")[0]
        if why.get(key):
            warnings.append(f"{item} has no effect on this training: {why[key]}")
    return warnings


def unread_analysis_settings(overrides: list[str], analysis, pretrained: bool) -> list[str]:
    """A warning line for each analysis.KEY=VALUE of `overrides` that `heads-lab analyze` will
    not act on with the config `analysis` (an AnalysisConfig): a treebank's translation without
    the treebank, a split or a parse of the split beside a treebank (its own sentences are
    analysed), LRP's bound with LRP off, and for a pretrained model (`pretrained`) the settings
    of heads-lab's own runs (a checkpoint step, LRP)."""
    why = {
        "treebank_ref": None if analysis.treebank else "it names a comment of analysis.treebank's "
        "sentences, and none is given",
        "split": "analysis.treebank's own sentences are analysed" if analysis.treebank else None,
        "conllu": "analysis.treebank's own trees are used" if analysis.treebank else None,
        "lrp_sentences": "analysis.lrp=false" if not analysis.lrp else None,
    }
    if pretrained:
        why.update({"step": "a pretrained model has no checkpoints of its training",
                    "lrp": "LRP is not measured for pretrained models (its rules follow "
                    "heads-lab's own layers)",
                    "lrp_sentences": "LRP is not measured for pretrained models"})
    warnings = []
    for item in overrides:
        key, _, _ = item.lstrip("+~").partition("=")
        reason = why.get(key.removeprefix("analysis.")) if key.startswith("analysis.") else None
        if reason:
            warnings.append(f"{item} has no effect on this analysis: {reason}")
    return warnings
