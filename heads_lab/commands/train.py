"""One training run end to end, given a validated config and a run dir: the stages in order,
with every artefact written into the run dir. Kept apart from cli.py so it runs without Hydra
(tests and scripts call it directly)."""

from __future__ import annotations

import hashlib
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from heads_lab.config.compose import cache_dir
from heads_lab.config.cost import Lengths, account
from heads_lab.config.schemas import LoggerConfig, RunConfig
from heads_lab.config.unread import unread_prune_settings, unread_train_settings
from heads_lab.config.variants import variant
from heads_lab.data import collate, epoch_batches, prepare, testsets, train_subset
from heads_lab.data.cleaning import describe
from heads_lab.errors import ConfigError, DataError, finished_run
from heads_lab.model import Transformer, admin_init, count_parameters
from heads_lab.model.heads import gates_kept, gates_of, install_gates
from heads_lab.output.files import ensure_writable, write_json
from heads_lab.output.tracking import Tracker, console, environment, short_name, summary_table
from heads_lab.training import checkpoint
from heads_lab.training import parallel as data_parallel
from heads_lab.training.captured import capture_on
from heads_lab.training.checkpoint import Checkpoints, auto_precision
from heads_lab.training.device import (
    PeakMemory,
    check_precision,
    matmul_ceiling,
    resolve_device,
    resolve_precision,
)
from heads_lab.training.loop import seed_everything, train
from heads_lab.training.runs import evaluated_best
from heads_lab.training.stops import stop_signals
from heads_lab.training.tasks import task_of

log = logging.getLogger(__name__)
DEFAULT_THREADS = torch.get_num_threads()  # at start-up: all cores unless OMP_NUM_THREADS says


def run_training(run: RunConfig, config: dict[str, Any], run_dir: Path,
                 overrides: list[str], name: str | None = None,
                 group: str | None = None) -> dict[str, Any]:
    """Train and evaluate one config; returns the dict written to run_dir/results.json.
    `name` (default: every override) and `group` (default: the experiment name) are the run's
    name and group in its trackers (wandb, TensorBoard); a sweep passes its varying settings and
    the sweep's id."""
    started = time.perf_counter()
    ranks, device, precision = _start(run, run_dir)
    main_rank = ranks is None or ranks.is_main
    unread = unread_prune_settings(overrides, "train", run.prune) + \
        unread_train_settings(overrides, run)
    for warning in unread if main_rank else []:
        log.warning(warning)
    peak = PeakMemory(device)
    run_name = name or short_name(overrides)

    corpus = _data(run, run_dir, main_rank)
    data_s = time.perf_counter() - started
    train_split = corpus.splits["train"]
    model = _model(run, corpus, device, ranks)
    params = count_parameters(model)
    lengths = Lengths(float(train_split.src_lens.mean()), float(train_split.tgt_lens.mean()))
    costs = account(run.model, len(corpus.tokenizer), lengths, str(run.task))
    log.info("model: %s parameters (%s, d_k %d); %.2f MFLOP per target token per training step",
             f"{params['total']:,}", _heads_text(run), run.model.d_head,
             costs["flops_per_token"]["train"] / 1e6)

    tracker = Tracker(run.logger if main_rank else LoggerConfig(), run_dir, run_name, config,
                      group=group or run.name, tags=list(run.tags))
    checkpoints = (Checkpoints(run_dir, run.trainer, config, is_writer=main_rank)
                   if run.trainer.save_checkpoint else None)
    try:
        if main_rank:
            tracker.start(run.trainer.max_steps, run.trainer.max_time)
        with stop_signals() as stop:
            result = train(model, train_split, corpus.splits["valid"], run.trainer, run.seed,
                           device, tracker.log, checkpoints=checkpoints, stop_requested=stop,
                           parallel=ranks, extra=gates_of(model), peak_mb=peak.mb,
                           keep_best=_best_in_memory(run) and main_rank)
        tracker.stop_progress(result.steps)
        if result.resumed_from is not None:
            log.info("resumed from step %d; trained to step %d", result.resumed_from, result.steps)
        if not main_rank:  # rank 0 evaluates and writes the results
            tracker.finish()
            ranks.barrier()
            return {}

        evaluated = _evaluated_weights(run, model, run_dir, result)
        eval_started = time.perf_counter()
        scored = task_of(run).evaluate(run, model, corpus, device, run_dir, "")
        eval_s = time.perf_counter() - eval_started

        peak_mb = max(peak.mb(), result.peak_mem_mb)  # a resumed run: its earlier processes' too
        metrics = _metrics(result, scored.metrics, params, costs, peak_mb, model)
        metrics.update(_evaluated_validation(result, evaluated))
        _gpu_mfu(metrics, costs, device, precision)
        results = {
            "status": "complete", "name": run_name, "overrides": overrides,
            "run_dir": str(run_dir), "metrics": metrics, "params": params, "cost": costs,
            **scored.records, "recipe": _recipe(run),
            "train": _train_record(result, run, evaluated, ranks),
            "timings": {"data_s": data_s, "train_s": result.train_seconds, "eval_s": eval_s,
                        "total_s": time.perf_counter() - started},
            "data": corpus.stats, "device": str(device), "threads": torch.get_num_threads(),
            "precision": str(run.trainer.precision),
            "config": config, "env": environment(), **tracker.where(),
        }
        write_json(run_dir / "results.json", results)
        tracker.finish(summary=metrics)
        if ranks is not None:
            ranks.barrier()
    except BaseException as err:
        tracker.stop_progress(getattr(err, "step", None))  # Preempted: where the signal stopped it
        tracker.finish(failed=True)
        raise
    _print_summary(results, overrides, run_dir, scored)
    return results


def _start(run: RunConfig, run_dir: Path):
    """Before any work: refuse a finished run dir, clear a failed attempt's record, set threads
    and seeds; the data-parallel ranks (None alone), the device and the precision it computes in
    (trainer.precision=auto resolved: bf16 where native, else fp32, or what the run it resumes
    trained in; trainer.capture=auto: on for a CUDA device; both written back into the
    config)."""
    if (run_dir / "results.json").is_file():
        raise finished_run(run_dir)
    ensure_writable(run_dir, "the run dir")
    # a failed sweep job run again is no longer failed (if it fails again, it says so again)
    (run_dir / "failed.json").unlink(missing_ok=True)
    (run_dir / "stopped.json").unlink(missing_ok=True)
    torch.set_num_threads(run.trainer.threads or DEFAULT_THREADS)  # never inherit a sweep job's
    seed_everything(run.seed)
    ranks = data_parallel.from_env(run.trainer.dist_timeout_s)
    device = resolve_device(run.trainer.device)
    precision = resolve_precision(device, run.trainer.precision)  # auto: what this machine has
    if run.trainer.precision == "auto" and run.trainer.save_checkpoint and \
            run.trainer.resume == "auto":  # ... or what the run to resume trained in
        precision = auto_precision(run_dir, precision)
    check_precision(device, precision)
    run.trainer.precision = type(run.trainer.precision)(precision)
    # trainer.capture=auto resolved (on for a CUDA device) and written back, as precision is
    # (results.json's train.captured records it; its config keeps what was asked)
    plain = ranks is None and run.prune.l0_lambda == 0  # no data-parallel ranks, no head gates
    run.trainer.capture = "true" if capture_on(run.trainer, device, plain) else "false"
    if ranks is not None and device.type == "cuda":
        device = torch.device("cuda", ranks.local_rank)
    return ranks, device, precision


def _train_record(result, run: RunConfig, evaluated: dict[str, Any], ranks) -> dict[str, Any]:
    """results.json's "train": how training went and ended, which weights were evaluated."""
    return {"steps": result.steps, "epochs": result.epochs, "tokens": result.tokens,
            "seconds": result.train_seconds, "valid_history": result.history,
            "skipped_steps": result.skipped_steps, "resumed_from": result.resumed_from,
            "stopped_by": result.stopped_by, "max_time": run.trainer.max_time,
            "best_step": result.best_step, "evaluated": evaluated,
            "data_parallel": ranks.world if ranks else 1,
            "captured": run.trainer.capture == "true"}  # trainer.capture (auto) as it ran


def _stopped_by(train: dict[str, Any]) -> str:
    """', stopped by patience' where something other than the step or epoch count ended it."""
    by = train.get("stopped_by")
    return f", stopped by {by}" if by in ("patience", "max_time") else ""


def _print_summary(results: dict[str, Any], overrides: list[str], run_dir: Path,
                   scored) -> None:
    console.print(summary_table("heads-lab train", _summary_rows(results, scored.rows)))
    console.print(f"overrides: {' '.join(overrides) or 'none'}")
    for line in scored.notes:
        console.print(line)
    console.print(f"results: {run_dir / 'results.json'}")


def _recipe(run: RunConfig) -> dict[str, Any]:
    """How it was trained, in words results.json keeps: the task, optimiser and schedule."""
    t = run.trainer
    return {"task": str(run.task), "optimizer": t.optimizer, "schedule": str(t.schedule),
            "lr": t.lr, "warmup_steps": t.warmup_steps, "min_lr": t.min_lr,
            "weight_decay": t.weight_decay, "label_smoothing": t.label_smoothing,
            "dropout": run.model.dropout, "clip_norm": t.clip_norm,
            "positions": ("sinusoidal (absolute)" if run.model.positions != "none" else
                          "none") + (
                f", relative biases ±{run.model.relative_positions}"
                if run.model.relative_positions else "")}


def _metrics(result, scored: dict[str, float], params, costs, peak_mb: float,
             model) -> dict[str, float]:
    """results.json's metrics (the keys CONTRIBUTING.md fixes) of a trained and evaluated run;
    `scored`: its task's metrics of the evaluated split."""
    metrics = {
        "train/loss": result.train_loss,
        "train/tokens_per_s": result.tokens_per_s,
        "valid/loss": result.valid["loss"],
        "valid/ppl": result.valid["ppl"],
        **({"valid/bits_per_byte": result.valid["bits_per_byte"]}
           if "bits_per_byte" in result.valid else {}),
        **scored,
        "cost/params": params["total"],
        "cost/params_attention": params["attention"],
        "cost/params_talking_heads": params["talking_heads"],
        "cost/flops_per_token": costs["flops_per_token"]["train"],
        "cost/decode_flops_per_token": costs["flops_per_token"]["decode"],
        "cost/attention_act_kb": sum(costs["attention_activation_bytes"].values()) / 1024,
        "cost/train_gflops_per_s": costs["flops_per_token"]["train"] * result.tokens_per_s / 1e9,
        "cost/peak_mem_mb": peak_mb,
    }
    if gates_of(model) is not None:  # heads the test-time gates keep, per attention type
        metrics.update({f"heads_kept/{site}": n for site, n in gates_kept(model).items()})
    return metrics


def _gpu_mfu(metrics: dict[str, float], costs: dict[str, Any], device, precision: str) -> None:
    """On a GPU, cost/mfu: the training GFLOP/s over this GPU's matmul ceiling at the run's
    precision, measured here (about a second; recorded as cost.ceiling_gflops)."""
    if device.type != "cuda":
        return
    costs["ceiling_gflops"] = matmul_ceiling(
        torch.bfloat16 if precision == "bf16" else torch.float32, device=device)
    metrics["cost/mfu"] = metrics["cost/train_gflops_per_s"] / costs["ceiling_gflops"]


def _data(run: RunConfig, run_dir: Path, main_rank: bool):
    """The run's corpus (its tokenizer copied into the run dir), every sentence within the
    model's positions, its counts logged."""
    if run.eval.sacrebleu_test:  # offline and not downloaded: said now, not after training
        testsets.fetch(run.eval.sacrebleu_test, run.data.src, run.data.tgt)
    corpus = prepare(run.data, cache_dir(run.paths), run.task)
    if main_rank and corpus.tokenizer.path is not None:  # (data=repeats: ids, no tokenizer)
        shutil.copyfile(corpus.tokenizer.path, run_dir / "tokenizer.model")
    if run.data.train_fraction < 1:
        _subset_train(run, corpus)
    for name, split in corpus.splits.items():  # positions: BOS/EOS + tokens
        longest = int(max(split.src_lens.max(), split.tgt_lens.max()))
        if longest + (0 if corpus.lm else 1) > run.model.max_positions:  # an LM: BOS + text
            raise DataError(f"the {name} split has a sentence of {longest - 1} subword tokens, "
                            f"more than model.max_positions={run.model.max_positions} allows; "
                            "raise model.max_positions")
    for split in ("train", "valid", "test"):
        log.info("data %s %s", run.data.name, describe(split, corpus.stats[split])
                 if corpus.lm is None else f"{split}: {corpus.stats[split]}")
    return corpus


def _best_in_memory(run: RunConfig) -> bool:
    """eval.checkpoint=best without checkpoints (trainer.save_checkpoint=false): the training
    loop keeps the best validation's weights in memory instead of checkpoints/best.pt."""
    return evaluated_best(run) and not run.trainer.save_checkpoint


def _evaluated_weights(run: RunConfig, model, run_dir: Path, result) -> dict[str, Any]:
    """eval.checkpoint=best: the best validation's weights (checkpoints/best.pt, or the copy the
    loop kept in memory where no checkpoint is written) into the model before it is evaluated.
    Returns which weights are evaluated, for results.json."""
    if not evaluated_best(run):
        return {"checkpoint": "last", "step": result.steps}
    if _best_in_memory(run):
        if result.best_weights is None:  # no finite validation: there is no best
            log.warning("no validation set a best loss: evaluating the last weights")
            return {"checkpoint": "last", "step": result.steps}
        model.load_state_dict(result.best_weights)
        step = result.best_step
    else:
        state = checkpoint.load(checkpoint.checkpoint_dir(run_dir) / "best.pt")
        model.load_state_dict(state["model"])
        step = state["progress"]["step"]
    log.info("evaluating the best validation's weights (step %d of %d)", step, result.steps)
    return {"checkpoint": "best", "step": step}


def _evaluated_validation(result, evaluated: dict[str, Any]) -> dict[str, float]:
    """The validation numbers of the weights that were evaluated (valid/loss, valid/ppl and a
    language model's valid/bits_per_byte): with eval.checkpoint=best, the best validation's (its
    entry in the history), not the last validation's, so that a row's valid and test numbers
    come from one model. Empty where the last weights were."""
    if evaluated["checkpoint"] != "best":
        return {}
    found = [h for h in result.history if h.get("step") == evaluated["step"] and "valid/loss" in h]
    if not found:  # cannot happen: best.pt is written at a validation, kept in the history
        log.warning("no validation at the best step %d in the history: valid/ppl is the last "
                    "validation's", evaluated["step"])
        return {}
    keys = ("valid/loss", "valid/ppl", "valid/bits_per_byte")
    return {k: found[-1][k] for k in keys if k in found[-1]}


def _subset_train(run: RunConfig, corpus) -> None:
    """data.train_fraction: the fixed training subset in place of the split (the tokenizer
    stays the full split's), its size and a fingerprint of its sentences in the corpus stats."""
    full = corpus.splits["train"]
    subset, chosen = train_subset(full, run.data.train_fraction)
    tokens = subset.target_tokens()
    if tokens < run.trainer.max_tokens:
        raise DataError(f"data.train_fraction={run.data.train_fraction} leaves {len(subset):,} "
                        f"training pairs ({tokens:,} target tokens), less than one batch of "
                        f"trainer.max_tokens={run.trainer.max_tokens}: raise data.train_fraction "
                        "or lower trainer.max_tokens")
    corpus.splits["train"] = subset
    digest = hashlib.sha256(chosen.astype(np.int64).tobytes()).hexdigest()[:16]
    corpus.stats["train"] = {**corpus.stats["train"], "fraction": run.data.train_fraction,
                             "of": len(full), "kept": len(subset), "subset_sha256": digest}


def _model(run: RunConfig, corpus, device: torch.device, ranks) -> Transformer:
    """The model on its device: Admin's ω profiled on the first training batch (a resumed
    run's ω is then replaced by its checkpoint's), Hard Concrete gates for gates from scratch."""
    model = task_of(run).model_class(run.model, len(corpus.tokenizer),
                                     corpus.tokenizer.pad).to(device)
    if run.model.init == "admin":
        train_split = corpus.splits["train"]
        first = epoch_batches(train_split, run.trainer.max_tokens, run.seed, 0)[0]
        batch = collate(train_split, first).to(device)
        omegas = admin_init(model, batch.src, batch.tgt_in)
        log.info("Admin: ω from %.2f to %.2f over %d residual branches", min(omegas),
                 max(omegas), len(omegas))
    if run.prune.l0_lambda > 0:  # Hard Concrete head gates trained from scratch (Voita et al.)
        if ranks is not None:
            raise ConfigError("prune.l0_lambda (head gates) trains in one process; drop torchrun")
        gates = install_gates(model, run.prune)
        log.info("Hard Concrete gates on %s heads (λ = %g, start σ(log α) = %g, heads kept by "
                 "the %s rule)", sum(len(g) for g in gates.test_gates().values()),
                 run.prune.l0_lambda, run.prune.init_keep, run.prune.gate_eval)
    return model


def _heads_text(run: RunConfig) -> str:
    return variant(run.model, "lm-self" if run.task == "lm" else "enc-self").label(run.model)


def _summary_rows(results: dict[str, Any], scored_rows) -> list[tuple[str, str]]:
    m, t = results["metrics"], results["timings"]
    valid = [("valid PPL", f"{m['valid/ppl']:.2f}")] + (
        [("valid bits per byte", f"{m['valid/bits_per_byte']:.4f}")]
        if "valid/bits_per_byte" in m else [])
    return [
        ("parameters", f"{results['params']['total']:,}"),
        ("steps (epochs)", f"{results['train']['steps']} ({results['train']['epochs']:.1f})"
                           + _stopped_by(results["train"])),
        ("train tokens/s", f"{m['train/tokens_per_s']:,.0f}"),
        ("train FLOPs/token · GFLOP/s", f"{m['cost/flops_per_token'] / 1e6:.1f} M · "
                                        f"{m['cost/train_gflops_per_s']:.1f}"),
        ("peak memory", f"{m['cost/peak_mem_mb']:,.0f} MB"),
        *valid,
        *scored_rows,
        (("time train (every process) / eval / total (this process)"
          if results["train"].get("resumed_from") is not None else "time train / eval / total"),
         f"{t['train_s']:.0f}s / {t['eval_s']:.0f}s / {t['total_s']:.0f}s"),
    ]
