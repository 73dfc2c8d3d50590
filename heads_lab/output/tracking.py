"""Where results go while a run runs: a rich progress bar and progress lines in the log, the
experiment trackers (output/trackers.py: wandb, TensorBoard), the run's environment and name for
results.json, and the summary and cost tables."""

from __future__ import annotations

import logging
import math
import os
import platform
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from heads_lab.config.schemas import LoggerConfig
from heads_lab.config.sites import SITES
from heads_lab.config.variants import shape_keys, variant
from heads_lab.output import trackers
from heads_lab.output.files import write_json  # noqa: F401 (tracking.write_json, kept for callers)
from heads_lab.output.progress import clock

log = logging.getLogger(__name__)
# soft_wrap: a long line (a path) stays one line in a log file; markup off: a path or an
# override with brackets (prune.sites=[enc-self]) prints as it is, not as rich markup
console = Console(soft_wrap=True, markup=False)
VALID_LINE = "step %d  valid loss %.4f  ppl %.2f"  # each validation, in train.log


def valid_history_from_log(text: str) -> list[dict[str, float]]:
    """A run's validations read back from its train.log (VALID_LINE), for a run that has no
    results.json yet (running, killed, cut): [{"step", "valid/loss", "valid/ppl"}] by step, as
    results.json's train.valid_history. A step validated twice (a resumed run redoes the
    validations after its last checkpoint) keeps its last line; valid/ppl is exp of the logged
    4-decimal loss, not the 2-decimal ppl. A validation a resumed run did not redo (it stopped
    earlier, by patience) stays in."""
    pattern = re.compile(r"step (\d+)  valid loss (\S+)  ppl \S+$")
    found = {}
    for line in text.splitlines():
        if m := pattern.search(line.rstrip()):
            found[int(m[1])] = float(m[2])
    return [{"step": s, "valid/loss": found[s], "valid/ppl": math.exp(min(found[s], 50.0))}
            for s in sorted(found)]  # capped as evaluate.perplexity caps it


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'model': {'heads': 8}} → {'model.heads': 8}, so dashboards can group and filter by key."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def environment() -> dict[str, Any]:
    """Library versions, host and the git commit of the heads-lab source, for results.json."""
    versions = {}
    for pkg in ("heads-lab", "torch", "hydra-core", "omegaconf", "sacrebleu", "sentencepiece",
                "wandb", "rich", "datasets", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    versions["python"] = platform.python_version()
    return {"versions": versions, "git": _git_commit(), "host": platform.node(),
            "platform": platform.platform(), "cpu_count": os.cpu_count(), "cpu": cpu_name()}


def cpu_name() -> str:
    """The CPU's model and the vector instructions torch uses on it, e.g. "AMD EPYC (AVX2)":
    speed depends on them, and so does bf16 (native on AMX / AVX512-BF16 only, which torch's
    capability does not name: the model says it), and the machines studies run on change. The
    model from /proc/cpuinfo (Linux), else platform.processor(); the capability where torch is
    loaded (results.json is written by a torch process; this module stays torch-free)."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    torch = sys.modules.get("torch")
    try:
        capability = torch.backends.cpu.get_cpu_capability() if torch else None
    except (AttributeError, RuntimeError):  # an old torch
        capability = None
    return f"{model} ({capability})" if capability else model


def _git_commit() -> dict[str, Any] | None:
    src = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None  # installed from a wheel, or no git
    return {"commit": commit, "dirty": bool(dirty)}


# How settings read in run names (the trackers') and report rows: model.heads=8,seed=2 → h=8,seed=2.
SHORT_KEYS = {**{key: short for short, key in shape_keys()}, "model.head_dim": "d_k",
              "model.encoder_layers": "enc", "model.decoder_layers": "dec", "data.name": "data"}


def short_key(key: str) -> str:
    key = key.lstrip("+~")
    return SHORT_KEYS.get(key, key.split(".")[-1])


def short_name(overrides: list[str], keys: list[str] | None = None) -> str:
    """A run's name from its overrides, e.g. `h=8,seed=2`: only the `keys` given (a sweep's
    varying settings), else every override but hydra's own."""
    wanted = None if keys is None else {k.lstrip("+~") for k in keys}
    parts = []
    for item in overrides:
        key, _, value = item.partition("=")
        bare = key.lstrip("+~")
        if bare.startswith("hydra.") or (wanted is not None and bare not in wanted):
            continue
        parts.append(f"{short_key(bare)}={value}")
    return ",".join(parts) or "defaults"


class Tracker:
    """Console progress and the experiment trackers the logger config asks for (output/trackers.py).
    `log` takes metrics keyed like 'valid/ppl' (the same keys go to every tracker)."""

    def __init__(self, logger_cfg: LoggerConfig, run_dir: Path, run_name: str, config: dict,
                 group: str | None = None, tags: list[str] | None = None):
        self.progress: Progress | None = None
        self.task = None
        self.trackers = trackers.start_trackers(logger_cfg, run_dir, run_name, flatten(config),
                                                group, list(tags or []))
        self.broken: list = []  # trackers that failed to log: still finished, never logged to
        self.total: int | None = None  # set by start()
        self.started = time.monotonic()
        self.first: tuple[int, float] | None = None  # (step, time) of the first progress line
        self.max_time: float | None = None

    def where(self) -> dict[str, Any]:
        """Where each tracker's run is, by tracker name (None: not used), for results.json."""
        return trackers.where(self.trackers)

    def start(self, total_steps: int | None, max_time: float | None = None) -> None:
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(), TextColumn("ETA"), _Remaining(),
            console=console, transient=False,
            disable=not console.is_terminal,  # piped: the plain progress lines alone, no bar
        )
        self.progress.start()
        self.task = self.progress.add_task("train", total=total_steps, loss="-", tps="-")
        self.total, self.started, self.first = total_steps, time.monotonic(), None
        self.max_time = max_time

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.progress is not None and self.task is not None:
            fields = {}
            if "train/loss" in metrics:
                fields = {"loss": f"{metrics['train/loss']:.3f}",
                          "tps": f"{metrics['train/tokens_per_s']:,.0f}"}
            self.progress.update(self.task, completed=step, **fields)
        if "train/loss" in metrics and self.progress is not None:
            log.info(self.progress_line(step, metrics))
        if "valid/ppl" in metrics:
            log.info(VALID_LINE, step, metrics["valid/loss"], metrics["valid/ppl"])
        for tracker in [t for t in self.trackers if t not in self.broken]:
            try:
                tracker.log(step, metrics)
            except Exception as err:  # a tracker must never fail a run: it logs no more
                log.warning("%s failed at step %d (%s); the run goes on without it", tracker.name,
                            step, str(err).splitlines()[0] if str(err) else type(err).__name__)
                self.broken.append(tracker)

    def progress_line(self, step: int, metrics: dict[str, float]) -> str:
        """One line every trainer.log_every steps, for train.log and a non-interactive stdout
        (a SLURM .out file, nohup, CI), as fairseq writes: step/max, loss, lr, tokens/s,
        elapsed and ETA (from the pace since the first such line, so a resumed run's too, and on
        the first line from the updates' pace so far; under trainer.max_time, the budget's
        seconds left where they end the run first)."""
        now = time.monotonic()
        if self.first is None:
            self.first = (step, now)
        done, spent = step - self.first[0], now - self.first[1]
        total = self.total if self.total else None
        left = ([0.0] if total and step >= total  # the last step: nothing left, pace or not
                else [spent / done * (total - step)] if total and done > 0
                # the first line: the updates' own pace so far (train/seconds, kept across
                # resumes), not yet the wall clock's (it said "ETA ?")
                else [metrics["train/seconds"] / step * (total - step)]
                if total and step > 0 and metrics.get("train/seconds") else [])
        if self.max_time is not None and "train/seconds" in metrics:  # a time budget ends it first?
            left.append(max(self.max_time - metrics["train/seconds"], 0.0))
        eta = clock(min(left)) if left else "?"
        return (f"step {step}/{total or '?'}  loss {metrics['train/loss']:.3f}  "
                f"lr {metrics.get('train/lr', float('nan')):.2e}  "
                f"{metrics.get('train/tokens_per_s', float('nan')):,.0f} tok/s  "
                f"elapsed {clock(now - self.started)}  ETA {eta}")

    def stop_progress(self, step: int | None = None) -> None:
        """The bar's last line, at `step` (where training stopped: a stop signal or the time
        budget can end it between two logged steps)."""
        if self.progress is not None:
            if step is not None and self.task is not None:
                self.progress.update(self.task, completed=step)
            if self.task is not None:
                self.progress.stop_task(self.task)
            self.progress.stop()
            self.progress = None

    def finish(self, summary: dict[str, Any] | None = None, failed: bool = False) -> None:
        self.stop_progress()
        tracked, self.trackers = self.trackers, []
        trackers.finish(tracked, summary, failed)


class _Remaining(TimeRemainingColumn):
    """The bar's ETA; none once training stopped short of its last step (patience, the time
    budget, a stop signal), where rich would keep its last estimate."""

    def render(self, task):
        if task.stop_time is not None and not task.finished:
            return Text("-:--:--", style="progress.remaining")
        return super().render(task)


def summary_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=True, header_style="bold", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in rows:
        table.add_row(key, value)
    return table


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f}"


def cost_table(columns: list[tuple[str, Any, dict]]) -> Table:
    """The cost account of one or more configs (label, ModelConfig, account) side by side."""
    table = Table(title="heads-lab info · what the heads cost", title_justify="left",
                  header_style="bold")
    table.add_column("")
    for label, _, _ in columns:
        table.add_column(label, justify="right")

    def row(name: str, fn) -> None:
        table.add_row(name, *[fn(cfg, acct) for _, cfg, acct in columns])

    def heads(cfg, _) -> str:  # the talking heads' where they are only in some sites
        return variant(cfg, next((s for s in SITES if s in cfg.talking_heads_in), "enc-self")
                       ).label(cfg)

    def act(site):
        return lambda cfg, a: (f"{a['attention_activation_bytes'][site] / 1024:.1f} KiB"
                               if site in a["attention_activation_bytes"] else "–")

    def layers(cfg, a) -> str:  # a language model (its account has a KV cache) or a translator
        if "kv_cache_bytes_per_token" in a:
            return f"{cfg.layers if cfg.layers is not None else cfg.decoder_layers} (LM)"
        return f"{cfg.encoder_layers} + {cfg.decoder_layers}"

    lm = [a for _, _, a in columns if "kv_cache_bytes_per_token" in a]
    row("attention", lambda cfg, _: cfg.attention.value + (
        f" in {','.join(cfg.talking_heads_in)}" if cfg.attention.value == "talking_heads"
        and len(cfg.talking_heads_in) < 3 else ""))
    row("heads", heads)
    row("d_k = d_v", lambda cfg, _: str(cfg.d_head))
    row("d_model · d_ff", lambda cfg, _: f"{cfg.d_model} · {cfg.d_ff}")
    row("layers" if lm else "layers enc + dec", layers)
    row("parameters", lambda _, a: f"{a['params']['total']:,}")
    row("  embeddings (tied)", lambda _, a: f"{a['params']['embeddings']:,}")
    row("  attention", lambda _, a: f"{a['params']['attention']:,}")
    row("  talking-heads mix", lambda _, a: f"{a['params']['talking_heads']:,}")
    row("  ffn + norms", lambda _, a: f"{a['params']['ffn'] + a['params']['norm']:,}")
    if any("head_gates" in a["params"] for _, _, a in columns):  # gates from scratch
        row("  head gates (log α)", lambda _, a: f"{a['params'].get('head_gates', 0):,}")
    row("FLOPs/token train", lambda _, a: _si(a["flops_per_token"]["train"]))
    row("FLOPs/token decode", lambda _, a: _si(a["flops_per_token"]["decode"]))
    if lm:  # language models: the cache grouped-query attention shrinks
        row("KV cache bytes/token (fp32)", lambda _, a: f"{a['kv_cache_bytes_per_token']:,}"
            if "kv_cache_bytes_per_token" in a else "–")
    shown = SITES if not lm else ("lm-self",) if len(lm) == len(columns) else (*SITES, "lm-self")
    for site in shown:
        row(f"n·m memory {site}", act(site))
    lengths = {(a["lengths"]["src"], a["lengths"]["tgt"]) for _, _, a in columns}
    at = (f"at source {next(iter(lengths))[0]:g} / target {next(iter(lengths))[1]:g} tokens"
          if len(lengths) == 1 else "at each column's source / target lengths")
    table.caption = (  # plain text: the consoles print without markup
        f"FLOPs per target token: 2 per multiply-add of every matmul; train = forward + "
        f"backward; decode = greedy with KV cache (×beam for beam search); {at} "
        "(cost.src_len, cost.tgt_len; a trained run's: its training data's means). "
        "n·m memory: the [heads, n, m] fp32 tensors one layer keeps for backward, per sentence "
        "pair, on the CPU matmul path (a GPU's fused multi-head kernel keeps none).")
    return table
