"""A trained run read back, for the commands that work on one (eval, analyze, prune): the run's
config rebuilt from its dir, its model from its checkpoints (the newest valid one, or the last N
averaged) with its corpus."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from heads_lab.config.compose import cache_dir, compose, to_dict, to_object
from heads_lab.config.validate import validate
from heads_lab.errors import CheckpointError, DataError

log = logging.getLogger(__name__)
NO_CHECKPOINTS = ("{run_dir} holds no checkpoints (checkpoints/step_*.pt); was it trained with "
                  "trainer.save_checkpoint=false?")


def compose_run(run_dir: Path, overrides: list[str]):
    """(composed config, validated run config) of a train run dir: its saved overrides
    (.hydra/overrides.yaml) followed by `overrides`."""
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir} is a file, not a run dir; give the dir of a heads-lab "
                              "train run (the one holding .hydra/)" if run_dir.exists() else
                              f"no run dir {run_dir}; give the dir of a heads-lab train run")
    saved = run_dir / ".hydra" / "overrides.yaml"
    if not saved.is_file():
        raise CheckpointError(f"{run_dir} is not a heads-lab run dir (no .hydra/overrides.yaml)")
    trained_with = _saved_overrides(saved)
    cfg = compose(trained_with + overrides)
    run = to_object(cfg)
    validate(run)
    return cfg, run


def _saved_overrides(saved: Path) -> list[str]:
    """The overrides a run was trained with (a YAML list of strings, as Hydra writes them)."""
    try:
        items = yaml.safe_load(saved.read_text(encoding="utf-8")) or []
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        problem = str(err).splitlines()[0]
        items = None
    else:
        problem = ("an item is not a key=value string" if isinstance(items, list) else
                   f"it holds a {type(items).__name__}")
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise CheckpointError(f"{saved} is not a list of overrides ({problem}): it is what "
                              "rebuilds the run's config; restore it (Hydra writes one "
                              "'- key=value' line per override), or train the run again")
    return items


@dataclass
class Trained:
    """A run read back: its config, the model (on its device, eval mode), corpus and device,
    and the checkpoint files its weights came from."""

    run: Any
    config: dict[str, Any]
    model: Any
    corpus: Any
    device: Any
    checkpoints: list[str]


def _best_instead(run_dir: Path, cfg, failed: list, states: list, used: list) -> str | None:
    """load's fallback where every step checkpoint failed its checks: checkpoints/best.pt, the
    best validation's weights, with a warning naming its step (appended to states and used);
    the precision it trained in, or None (not there, already tried, or failed too: in failed)."""
    from heads_lab.training import checkpoint  # lazy: start-up time (torch)

    best = checkpoint.checkpoint_dir(run_dir) / "best.pt"
    if not best.is_file() or "best.pt" in failed:
        return None
    try:
        state = checkpoint.load(best)
    except CheckpointError as err:
        failed.append(f"best.pt ({err})")
        return None
    _check_same_model(state.get("config") or {}, cfg, best)
    step = state.get("progress", {}).get("step")
    states.append(state["model"])
    used.append(f"best.pt (step {step})")
    log.warning("no step checkpoint passed its checks (%s): reading checkpoints/best.pt, the "
                "best validation's weights (step %s)", ", ".join(failed), step)
    return checkpoint.trained_in(state)


def _checkpoint_files(run_dir: Path, run, average_last: int) -> list:
    """The (step, path) checkpoints to read, newest first: best.pt for the weights `train`
    evaluated, analysis.step's, or the step checkpoints; a CheckpointError saying why there
    are none."""
    from heads_lab.training import checkpoint  # lazy: start-up time (torch)

    files = checkpoint.step_files(run_dir)
    if not run.trainer.save_checkpoint:  # nothing on disk to read back, best weights included
        raise CheckpointError(
            f"{run_dir} was trained with trainer.save_checkpoint=false: no weights were written "
            "(with eval.checkpoint=best they were kept in memory for train's own evaluation "
            "only); train it again with trainer.save_checkpoint=true to read them back")
    if run.analysis.step is None and average_last == 1 and evaluated_best(run):
        files = [_best(run_dir)]  # the weights `train` evaluated (eval.checkpoint=best)
    elif not files:
        failed = run_dir / "failed.json"
        if failed.is_file():  # a sweep job that failed before its first checkpoint
            error = json.loads(failed.read_text()).get("error", "")
            raise CheckpointError(f"{run_dir} is a failed run, with no checkpoints: {error}")
        raise CheckpointError(NO_CHECKPOINTS.format(run_dir=run_dir))
    if run.analysis.step is not None:  # `analyze` of an earlier checkpoint (analysis.step)
        chosen = [(step, path) for step, path in files if step == run.analysis.step]
        if not chosen:
            steps = ", ".join(str(step) for step, _ in sorted(files))
            raise CheckpointError(f"analysis.step={run.analysis.step}: {run_dir} has no checkpoint "
                                  f"of that step; it has steps {steps} (train with "
                                  "trainer.keep_last and trainer.save_every to keep more)")
        files = chosen
    return files


def load(run_dir: Path, overrides: list[str], average_last: int | None = 1,
         computes: str | None = None) -> Trained:
    """The run in `run_dir` with `overrides`, its weights those `train` evaluated — the best
    validation's (checkpoints/best.pt) for an eval.checkpoint=best run, else the newest valid
    step checkpoint — or the element-wise mean of the newest `average_last` step checkpoints
    (None: the run's eval.average_last; corrupt ones skipped with a warning), or the step
    analysis.step names. A model trained with head gates gets them back (they decide which
    heads count). Its trainer.precision is what the caller computes in: `computes` where the
    caller has one precision of its own (analyze: "fp32", whatever the run's setting), else the
    setting, with `auto` the precision the run trained in (`_read_back_precision`)."""
    import torch  # lazy: start-up time (torch)

    from heads_lab.model.heads import install_gates  # lazy: start-up time (torch)
    from heads_lab.training import checkpoint  # lazy: start-up time (torch)

    # lazy: start-up time (torch)
    from heads_lab.training.device import check_precision, resolve_device, resolve_precision
    from heads_lab.training.tasks import task_of  # lazy: start-up time (torch)

    cfg, run = compose_run(run_dir, overrides)
    average_last = run.eval.average_last if average_last is None else average_last
    files = _checkpoint_files(run_dir, run, average_last)
    if run.trainer.threads:
        torch.set_num_threads(run.trainer.threads)
    device = resolve_device(run.trainer.device)
    setting = computes or str(run.trainer.precision)
    precision = resolve_precision(device, setting)  # auto: what this machine has
    check_precision(device, precision)
    states, used, failed, trained = [], [], [], None
    for _, path in files:  # newest first
        if len(states) == average_last:
            break
        try:
            state = checkpoint.load(path)
        except CheckpointError as err:
            log.warning("skipping %s", err)
            failed.append(path.name)
            continue
        _check_same_model(state.get("config") or {}, cfg, path)
        trained = trained or checkpoint.trained_in(state)  # the newest recording one's
        states.append(state["model"])
        used.append(path.name if path.name != "best.pt" else
                    f"best.pt (step {state.get('progress', {}).get('step', '?')})")
        del state  # its optimizer moments are not needed: not held through prepare()
    if not states and average_last == 1:  # the step checkpoints failed their checks
        trained = _best_instead(run_dir, cfg, failed, states, used) or trained
    if not states:
        raise CheckpointError(
            f"{checkpoint.checkpoint_dir(run_dir)} holds no valid checkpoint ({', '.join(failed)} "
            "failed their checks), so this run has no weights to read back: use another run "
            "dir, or train this one again")
    if len(states) < average_last:
        raise CheckpointError(
            f"eval.average_last={average_last} but {run_dir} has only {len(states)} valid "
            f"checkpoint(s); a run keeps its last trainer.keep_last={run.trainer.keep_last}, "
            f"written every trainer.save_every={run.trainer.save_every} steps and at its end: "
            f"train with both set to leave {average_last}")
    if setting == "auto":  # the precision the run trained in, where it can be computed here
        precision = _read_back_precision(trained or _results_precision(run_dir), precision)
    run.trainer.precision = type(run.trainer.precision)(precision)
    corpus = _corpus(run, run_dir)
    model = task_of(run).model_class(run.model, len(corpus.tokenizer), corpus.tokenizer.pad)
    if any(k.startswith("gates.") for k in states[0]):
        install_gates(model, run.prune)
    model.load_state_dict(average(states))
    log.info("loaded %s", ", ".join(used))
    return Trained(run, to_dict(cfg), model.to(device).eval(), corpus, device, used)


# model settings that shape training only, not what the trained weights compute
TRAINING_ONLY = {"dropout", "attention_dropout", "mix_init"}


def _check_same_model(saved: dict[str, Any], cfg, path: Path) -> None:
    """The model a checkpoint was written by is the one its run dir's .hydra/overrides.yaml
    rebuilds: a changed file (by hand, or by a refused resume before heads-lab kept it) would
    otherwise load the weights into another model wherever the shapes allow (model.heads under
    mha changes no shape) and give that model's numbers. A setting the checkpoint lacks was added
    since it was written, and is passed over, as are those that act in training only
    (TRAINING_ONLY: dropout, a mix's start)."""
    from heads_lab.output.tracking import flatten  # lazy: start-up time (rich)
    from heads_lab.report.labels import as_written  # lazy: only here

    old, new = flatten(saved.get("model") or {}), flatten(to_dict(cfg).get("model") or {})
    for key in sorted(set(old) & set(new) - TRAINING_ONLY):
        if old[key] != new[key]:
            raise CheckpointError(
                f"{path} was written by a model with model.{key}={as_written(old[key])}, but "
                f"{path.parents[1] / '.hydra' / 'overrides.yaml'} now rebuilds model.{key}="
                f"{as_written(new[key])}: that file (or a preset it names) changed after "
                f"training; set model.{key}={as_written(old[key])} there (a last line "
                f"'- model.{key}={as_written(old[key])}' overrides the rest)")


def _corpus(run, run_dir: Path):
    """The run's corpus, read as it trained on it; a DataError says that is what is read."""
    from heads_lab.data import prepare  # lazy: start-up time (torch)

    try:
        return prepare(run.data, cache_dir(run.paths), run.task)
    except DataError as err:
        moved = ("; if the files moved, say where they are now: add data.root=<their dir> (or "
                 "set HEADS_LAB_DATA) to this command." if "missing" in str(err)
                 or "not found" in str(err) else "")
        raise DataError(f"{run_dir} is read back with the data it trained on (data={run.data.name}:"
                        f" its splits, and the training side's counts for analyze): {err}"
                        f"{moved}") from None


def _results_precision(run_dir: Path) -> str | None:
    """results.json's `precision`: what a finished run trained and was evaluated in."""
    try:
        value = json.loads((run_dir / "results.json").read_text()).get("precision")
    except (OSError, ValueError, AttributeError):
        return None
    return value if value in ("fp32", "bf16") else None


def _read_back_precision(trained: str | None, native: str) -> str:
    """trainer.precision=auto for a run read back (eval, prune; analyze is fp32): the precision it
    trained in (the loaded checkpoint's record, else results.json's: a checkpoint from before
    checkpoints recorded it), so that its numbers are the run's own, not what `auto` means on
    this machine; a bf16 run where bf16 is not native is read in fp32 (emulated bf16 is tens of
    times slower), saying so. A run that does not say: `native`."""
    if trained is None or trained == native:
        return native
    if trained == "fp32":
        log.info("trainer.precision=auto: the run trained in fp32, so it is read back in fp32 "
                 "(name trainer.precision=bf16 for bf16, native here)")
        return "fp32"
    log.warning("the run trained in bf16, which is not native here: it is read back in fp32, so "
                "its numbers may differ a little from its own (a GPU or a CPU with AVX512-BF16 or "
                "AMX computes them in bf16)")
    return "fp32"


def evaluated_best(run) -> bool:
    """Whether the run was evaluated on its best validation's weights (eval.checkpoint=best)."""
    return str(getattr(run.eval.checkpoint, "value", run.eval.checkpoint)) == "best"


def _best(run_dir: Path) -> tuple[int | None, Path]:
    """checkpoints/best.pt as a (step, path) entry of the files to load."""
    from heads_lab.training import checkpoint  # lazy: start-up time (torch)

    path = checkpoint.checkpoint_dir(run_dir) / "best.pt"
    if not path.is_file():
        steps = ", ".join(str(step) for step, _ in checkpoint.step_files(run_dir)) or "none"
        raise CheckpointError(f"{run_dir} was evaluated on its best validation's weights "
                              "(eval.checkpoint=best) but has no checkpoints/best.pt; use a step "
                              f"checkpoint (steps: {steps}) with eval.checkpoint=last (eval, "
                              "prune) or analysis.step=N (analyze)")
    return None, path


def average(states: list[dict]) -> dict:
    """The element-wise mean of model state dicts (in float64, cast back)."""
    if len(states) == 1:
        return states[0]
    out = {}
    for key, first in states[0].items():
        if first.is_floating_point():
            total = sum(s[key].double() for s in states)
            out[key] = (total / len(states)).to(first.dtype)
        else:
            out[key] = first
    return out
