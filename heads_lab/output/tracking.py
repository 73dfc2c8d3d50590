"""Where results go: a rich progress bar and summary table, wandb (offline unless asked, never
blocking a run), and one results.json per run dir, written atomically."""

from __future__ import annotations

import logging
import os
import platform
import socket
import subprocess
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from heads_lab.config.schemas import LoggerConfig, WandbConfig
from heads_lab.config.sites import SITES
from heads_lab.config.variants import shape_keys, variant
from heads_lab.output.files import write_json  # noqa: F401 (tracking.write_json, kept for callers)
from heads_lab.output.progress import clock

log = logging.getLogger(__name__)
console = Console()


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
            "platform": platform.platform(), "cpu_count": os.cpu_count()}


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


def _reachable(url: str, timeout: float = 3.0) -> bool:
    parsed = urlparse(url)
    try:
        port = parsed.port or (80 if parsed.scheme == "http" else 443)
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


# How settings read in run names (wandb) and report rows: model.heads=8,seed=2 → h=8,seed=2.
SHORT_KEYS = {**{key: short for short, key in shape_keys()}, "model.head_dim": "d_k",
              "model.encoder_layers": "enc", "model.decoder_layers": "dec"}


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
    """Console progress + optional wandb and TensorBoard. `log` takes metrics keyed like
    'valid/ppl' (the same keys go to both)."""

    def __init__(self, logger_cfg: LoggerConfig, run_dir: Path, run_name: str, config: dict,
                 group: str | None = None, tags: list[str] | None = None):
        self.wandb = None
        self.tensorboard = None
        self.progress: Progress | None = None
        self.task = None
        self.last_step, self.logged = 0, set()
        if isinstance(logger_cfg, WandbConfig) and logger_cfg.mode.value != "disabled":
            self.wandb = start_wandb(logger_cfg, run_dir, run_name, flatten(config),
                                     logger_cfg.group or group, tags)
        if getattr(logger_cfg, "tensorboard", False):
            self.tensorboard = start_tensorboard(run_dir, run_name, config)

    def tensorboard_info(self) -> dict[str, Any] | None:
        """Where the TensorBoard event files are (for results.json)."""
        return None if self.tensorboard is None else {"dir": self.tensorboard.log_dir}

    def wandb_info(self) -> dict[str, Any] | None:
        """Where the wandb run is (for results.json and `heads-lab report --wandb`)."""
        if self.wandb is None:
            return None
        run = self.wandb
        return {"id": run.id, "name": run.name, "group": run.group, "project": run.project,
                "job_type": run.job_type, "tags": list(run.tags or ()), "mode": run.settings.mode,
                "dir": str(Path(run.dir).parent)}

    def start(self, total_steps: int | None) -> None:
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=console, transient=False,
        )
        self.progress.start()
        self.task = self.progress.add_task("train", total=total_steps, loss="-", tps="-")
        self.total, self.started, self.first = total_steps, time.monotonic(), None

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
            log.info("step %d  valid loss %.4f  ppl %.2f", step, metrics["valid/loss"],
                     metrics["valid/ppl"])
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if self.tensorboard is not None:
            for key, value in metrics.items():
                self.tensorboard.add_scalar(key, value, step)
            self.logged.update(metrics)
        self.last_step = max(self.last_step, step)

    def progress_line(self, step: int, metrics: dict[str, float]) -> str:
        """One line every trainer.log_every steps, for train.log and a non-interactive stdout
        (a SLURM .out file, nohup, CI), as fairseq writes: step/max, loss, lr, tokens/s,
        elapsed and ETA (from the pace since the first such line, so a resumed run's too)."""
        now = time.monotonic()
        if self.first is None:
            self.first = (step, now)
        done, spent = step - self.first[0], now - self.first[1]
        total = self.total if self.total else None
        eta = (clock(spent / done * (total - step)) if total and done > 0 and step <= total
               else "?")
        return (f"step {step}/{total or '?'}  loss {metrics['train/loss']:.3f}  "
                f"lr {metrics.get('train/lr', float('nan')):.2e}  "
                f"{metrics.get('train/tokens_per_s', float('nan')):,.0f} tok/s  "
                f"elapsed {clock(now - self.started)}  ETA {eta}")

    def stop_progress(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def finish(self, summary: dict[str, Any] | None = None, failed: bool = False) -> None:
        self.stop_progress()
        if self.tensorboard is not None:
            try:  # the run's final metrics (test BLEU, costs) at its last step, once
                for key, value in (summary or {}).items():
                    if isinstance(value, int | float) and key not in self.logged:
                        self.tensorboard.add_scalar(key, value, self.last_step)
                self.tensorboard.close()
            except Exception as err:  # a tracker must never fail a finished run
                log.warning("tensorboard close failed: %s", err)
            self.tensorboard = None
        if self.wandb is not None:
            try:
                if summary:
                    self.wandb.summary.update(summary)
                self.wandb.finish(exit_code=1 if failed else 0)
            except Exception as err:  # a tracker must never fail a finished run
                log.warning("wandb finish failed: %s", err)
            self.wandb = None


def start_wandb(cfg: WandbConfig, run_dir: Path, name: str, config: dict, group: str | None,
                tags: list[str] | None = None, job_type: str | None = None, resume: bool = True):
    """A wandb run in run_dir/wandb (offline unless cfg.mode=online and the server answers);
    None, with a warning, if wandb cannot start: the tracker never fails or hangs a run.
    With `resume`, a run dir's wandb run id is kept, so a resumed training run continues it."""
    import wandb  # lazy: start-up time (wandb)

    mode = cfg.mode.value
    base_url = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    if mode == "online" and not _reachable(base_url):
        log.warning("wandb: %s is unreachable; logging offline instead (sync later with "
                    "`wandb sync %s/wandb`)", base_url, run_dir)
        mode = "offline"
    id_file = run_dir / "wandb-run-id"  # a resumed run continues the same wandb run
    run_id = id_file.read_text().strip() if resume and id_file.is_file() else uuid.uuid4().hex[:8]
    try:
        if resume:
            id_file.write_text(run_id + "\n")
        return wandb.init(
            project=cfg.project, entity=cfg.entity, mode=mode, dir=str(run_dir), name=name,
            group=group, job_type=job_type or cfg.job_type,
            tags=list(dict.fromkeys([*(tags or []), *cfg.tags])) or None,
            notes=cfg.notes, config=config, reinit="create_new", id=run_id,
            resume="allow",
            settings=wandb.Settings(console="off", silent=True, init_timeout=60),
        )
    except Exception as err:  # never fail or hang a run for the tracker's sake
        log.warning("wandb could not start (%s); continuing without it", str(err).splitlines()[0])
        return None


def start_tensorboard(run_dir: Path, name: str, config: dict):
    """A TensorBoard writer in run_dir/tensorboard (one per job, so `tensorboard --logdir
    <sweep dir>` lists a sweep's runs by their job dirs), with the run's name and config as
    text; None, with a warning, if it cannot start (the tracker never fails a run)."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # lazy: start-up time (torch, tensorboard)

        writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        writer.add_text("run", f"{name}\n\n" + "\n".join(
            f"    {k}: {v}" for k, v in sorted(flatten(config).items())), 0)
        return writer
    except Exception as err:
        log.warning("tensorboard could not start (%s); continuing without it",
                    str(err).splitlines()[0])
        return None


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

    def heads(cfg, _) -> str:
        return variant(cfg, "enc-self").label(cfg)

    def act(site):
        return lambda cfg, a: f"{a['attention_activation_bytes'][site] / 1024:.1f} KiB"

    row("attention", lambda cfg, _: cfg.attention.value + (
        f" in {','.join(cfg.talking_heads_in)}" if cfg.attention.value == "talking_heads"
        and len(cfg.talking_heads_in) < 3 else ""))
    row("heads", heads)
    row("d_k = d_v", lambda cfg, _: str(cfg.d_head))
    row("d_model · d_ff", lambda cfg, _: f"{cfg.d_model} · {cfg.d_ff}")
    row("layers enc + dec", lambda cfg, _: f"{cfg.encoder_layers} + {cfg.decoder_layers}")
    row("parameters", lambda _, a: f"{a['params']['total']:,}")
    row("  embeddings (tied)", lambda _, a: f"{a['params']['embeddings']:,}")
    row("  attention", lambda _, a: f"{a['params']['attention']:,}")
    row("  talking-heads mix", lambda _, a: f"{a['params']['talking_heads']:,}")
    row("  ffn + norms", lambda _, a: f"{a['params']['ffn'] + a['params']['norm']:,}")
    row("FLOPs/token train", lambda _, a: _si(a["flops_per_token"]["train"]))
    row("FLOPs/token decode", lambda _, a: _si(a["flops_per_token"]["decode"]))
    for site in SITES:
        row(f"n·m memory {site}", act(site))
    first = columns[0][2]["lengths"]
    table.caption = escape(
        f"FLOPs per target token: 2 per multiply-add of every matmul; train = forward + "
        f"backward; decode = greedy with KV cache (×beam for beam search); at source "
        f"{first['src']:g} / target {first['tgt']:g} tokens (cost.src_len, cost.tgt_len). "
        "n·m memory: the [heads, n, m] fp32 tensors one layer keeps for backward, per sentence "
        "pair, on the CPU matmul path (a GPU's fused multi-head kernel keeps none).")
    return table
