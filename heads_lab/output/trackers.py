"""Experiment trackers behind one interface, chosen by config: `logger=wandb` (offline unless
asked), `logger=tensorboard`, both (`logger=wandb logger.tensorboard=true`) or none. Each gets
the same metric keys (`valid/ppl`, `test/bleu`, ...). A tracker never fails or hangs a run: one
that cannot start says so in a warning and is left out, one that fails at the end says so too,
and the run's results.json is written either way.

A new tracker is a class with the methods of `ExperimentTracker` and its entry in `TRACKERS`,
its settings in config/schemas.py (`LoggerConfig`, or a subclass registered in
config/compose.py) and conf/logger/<name>.yaml; results.json then says where its run is under
its name.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import uuid
from pathlib import Path
from typing import Any, ClassVar, Protocol
from urllib.parse import urlparse

from heads_lab.config.schemas import LoggerConfig, WandbConfig, WandbMode
from heads_lab.errors import ConfigError

log = logging.getLogger(__name__)


class ExperimentTracker(Protocol):
    name: ClassVar[str]  # its key in results.json (where its run is) and in warnings
    run_files: ClassVar[tuple[str, ...]]  # what it keeps in a run dir (`--rerun` moves them aside)
    package: ClassVar[str]  # the module it imports, checked before a run starts
    install: ClassVar[str]  # how to install it

    @classmethod
    def wanted(cls, cfg: LoggerConfig) -> bool:
        """Whether the logger config asks for this tracker."""

    @classmethod
    def start(cls, cfg: LoggerConfig, run_dir: Path, name: str, config: dict[str, Any],
              group: str | None, tags: list[str]) -> ExperimentTracker | None:
        """The tracker's run for one training run (`config` flattened), or None, with a
        warning, when it cannot start."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Metrics at a step (train/* every log_every steps, valid/* at each validation)."""

    def summary(self, metrics: dict[str, Any]) -> None:
        """The run's final metrics (test BLEU, costs), once, before `finish`."""

    def finish(self, failed: bool) -> None:
        """Close the run (marked failed when training or evaluation raised)."""

    def where(self) -> dict[str, Any]:
        """Where its run is, for results.json (and `heads-lab report --wandb`)."""


class WandbTracker:
    """Weights & Biases: a run in <run dir>/wandb, offline unless logger.mode=online and the
    server answers; a resumed training run continues the same wandb run (wandb-run-id)."""

    name = "wandb"
    run_files = ("wandb-run-id",)
    package = "wandb"
    install = "pip install 'wandb>=0.19.10' (a heads-lab dependency: `make install`)"

    def __init__(self, run) -> None:
        self.run = run

    @classmethod
    def wanted(cls, cfg: LoggerConfig) -> bool:
        return isinstance(cfg, WandbConfig) and cfg.mode.value != "disabled"

    @classmethod
    def start(cls, cfg: WandbConfig, run_dir: Path, name: str, config: dict[str, Any],
              group: str | None, tags: list[str]) -> WandbTracker | None:
        run = start_wandb(cfg, run_dir, name, config, cfg.group or group, tags)
        return None if run is None else cls(run)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def summary(self, metrics: dict[str, Any]) -> None:
        self.run.summary.update(metrics)

    def finish(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)

    def where(self) -> dict[str, Any]:
        run = self.run
        return {"id": run.id, "name": run.name, "group": run.group, "project": run.project,
                "job_type": run.job_type, "tags": list(run.tags or ()), "mode": run.settings.mode,
                "dir": str(Path(run.dir).parent)}


class TensorBoardTracker:
    """TensorBoard event files in <run dir>/tensorboard. A sweep's job is also linked as
    <sweep dir>/tensorboard/<its swept settings> (h=8,seed=2), so `tensorboard --logdir <sweep
    dir>/tensorboard` lists the runs by short names. At the end the run's head shape, data,
    seed and costs go to the HParams tab as hyperparameters (h, h_K, h_V, kv_heads, attention,
    d_k, params, FLOPs per token) against its final numbers as metrics (`final/valid_ppl`,
    `final/test_bleu`, ...: the values results.json holds), so a sweep's runs can be tabulated
    and compared there; the costs are no single-point charts. The run's name and config are its
    text."""

    name = "tensorboard"
    run_files = ("tensorboard",)
    package = "tensorboard"
    install = "pip install 'tensorboard>=2.14' (a heads-lab dependency: `make install`)"
    # results.json metrics shown as the HParams tab's metrics, under final/
    FINAL = ("valid/ppl", "test/bleu", "test/chrf", "test/ppl", "valid/bleu", "valid/chrf",
             "train/tokens_per_s", "cost/peak_mem_mb")

    def __init__(self, writer, config: dict[str, Any] | None = None) -> None:
        self.writer = writer
        self.config = config or {}
        self.logged: set[str] = set()
        self.last_step = 0

    @classmethod
    def wanted(cls, cfg: LoggerConfig) -> bool:
        return bool(getattr(cfg, "tensorboard", False))

    @classmethod
    def start(cls, cfg: LoggerConfig, run_dir: Path, name: str, config: dict[str, Any],
              group: str | None, tags: list[str]) -> TensorBoardTracker | None:
        try:
            # lazy: start-up time (torch, tensorboard); only a run with TensorBoard needs them
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
            writer.add_text("run", f"{name}\n\n" + "\n".join(
                f"    {k}: {v}" for k, v in sorted(config.items())), 0)
            _link_in_sweep(run_dir, name)
            return cls(writer, config)
        except Exception as err:  # never fail a run for the tracker's sake
            log.warning("tensorboard could not start (%s); continuing without it",
                        str(err).splitlines()[0])
            return None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.logged.update(metrics)
        self.last_step = max(self.last_step, step)

    def summary(self, metrics: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams  # lazy: torch, as in start()

        final = {f"final/{k.replace('/', '_')}": float(metrics[k]) for k in self.FINAL
                 if isinstance(metrics.get(k), int | float)}
        for key, value in metrics.items():  # the other final numbers once, at the last step
            if (isinstance(value, int | float) and key not in self.logged
                    and not key.startswith("cost/")):  # costs: hyperparameters below
                self.writer.add_scalar(key, value, self.last_step)
        for key, value in final.items():
            self.writer.add_scalar(key, value, self.last_step)
        for summary in hparams(hparameters(self.config, metrics), final):
            self.writer.file_writer.add_summary(summary)

    def finish(self, failed: bool) -> None:
        self.writer.close()

    def where(self) -> dict[str, Any]:
        return {"dir": self.writer.log_dir}


def hparameters(config: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """The HParams tab's columns for a run (TensorBoard sorts them by name and shows the first
    few: attention, d_k, data, h, h_K): its head shape with unset counts resolved (h_K, h_V and
    kv_heads = h, d_k = d_model / h), layers, data set and share, seed, and its costs."""
    h = config.get("model.heads")
    d_model = config.get("model.d_model")
    values = {"attention": config.get("model.attention"), "h": h,
              "h_K": config.get("model.heads_k") or h, "h_V": config.get("model.heads_v") or h,
              "kv_heads": config.get("model.kv_heads") or h,
              "d_k": config.get("model.head_dim") or (d_model // h if d_model and h else None),
              "layers": f"{config.get('model.encoder_layers')}+"
                        f"{config.get('model.decoder_layers')}",
              "data": config.get("data.name"), "train_fraction": config.get("data.train_fraction"),
              "seed": config.get("seed"), "params": metrics.get("cost/params"),
              "mflop_per_token": (metrics["cost/flops_per_token"] / 1e6
                                  if metrics.get("cost/flops_per_token") else None)}
    return {k: (v.value if hasattr(v, "value") else v) for k, v in values.items() if v is not None}


def _link_in_sweep(run_dir: Path, name: str) -> None:
    """A sweep job's events under a short name: <sweep dir>/tensorboard/<name> → its own dir
    (Hydra writes multirun.yaml into a sweep's dir). A name taken by another job gets the job
    dir's number."""
    sweep = run_dir.parent
    if not (sweep / "multirun.yaml").is_file():
        return
    index = sweep / "tensorboard"
    index.mkdir(exist_ok=True)
    target = run_dir / "tensorboard"
    for label in (name, f"{name} ({run_dir.name.split('_', 1)[0]})"):
        link = index / label.replace("/", "-")
        if link.is_symlink() and link.resolve() == target.resolve():
            return
        if not link.exists() and not link.is_symlink():
            link.symlink_to(os.path.relpath(target, index), target_is_directory=True)
            return


TRACKERS: tuple[type[ExperimentTracker], ...] = (WandbTracker, TensorBoardTracker)
RUN_FILES = tuple(f for t in TRACKERS for f in t.run_files)


def check_installed(cfg: LoggerConfig) -> None:
    """Before a run starts: every tracker the logger config asks for is importable, else one
    line naming the package and how to install it (ConfigError: exit 2, nothing trained)."""
    for tracker in TRACKERS:
        if tracker.wanted(cfg) and not _installed(tracker.package):
            asked = f"logger={cfg.name}" + (f" logger.{tracker.name}=true"
                                            if tracker.name != cfg.name else "")
            raise ConfigError(f"{asked} needs the {tracker.package} package, which is not "
                              f"installed: {tracker.install}, or choose another logger "
                              "(logger=none)")


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def start_trackers(cfg: LoggerConfig, run_dir: Path, name: str, config: dict[str, Any],
                   group: str | None, tags: list[str]) -> list[ExperimentTracker]:
    """The trackers the logger config asks for that could start, in TRACKERS' order."""
    started = (t.start(cfg, run_dir, name, config, group, tags) for t in TRACKERS if t.wanted(cfg))
    return [t for t in started if t is not None]


def where(trackers: list[ExperimentTracker]) -> dict[str, Any]:
    """results.json's tracker entries: every known tracker by name, None where it did not run."""
    return {t.name: None for t in TRACKERS} | {t.name: t.where() for t in trackers}


def finish(trackers: list[ExperimentTracker], summary: dict[str, Any] | None,
           failed: bool) -> None:
    """Each tracker's summary and end, last started first; a failure is a warning, never the
    run's."""
    for tracker in reversed(trackers):
        try:
            if summary:
                tracker.summary(summary)
            tracker.finish(failed)
        except Exception as err:  # a tracker must never fail a finished run
            log.warning("%s finish failed: %s", tracker.name, err)


def start_wandb(cfg: WandbConfig, run_dir: Path, name: str, config: dict, group: str | None,
                tags: list[str] | None = None, job_type: str | None = None, resume: bool = True):
    """A wandb run in run_dir/wandb (offline unless cfg.mode=online and the server answers);
    None, with a warning, if wandb cannot start: the tracker never fails or hangs a run.
    With `resume`, a run dir's wandb run id is kept, so a resumed training run continues it."""
    import wandb  # lazy: start-up time (wandb takes seconds to import)

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


def report_to_wandb(infos: list[dict[str, Any]], project: str, tags: list[str],
                    config: dict[str, Any], table: dict[str, Any], pngs: list[Path], out: Path,
                    mode: str) -> str | None:
    """`heads-lab report --wandb`: the report as a wandb run (job_type report) in the runs'
    project and group (their results.json's "wandb" entries `infos`, when they share one), the
    table as a wandb.Table, the plots as images. Returns the run's local dir."""
    groups = {i.get("group") for i in infos if i.get("group")}
    project = next((i["project"] for i in infos if i.get("project")), project)
    run = start_wandb(WandbConfig(project=project, mode=WandbMode(mode)), out, "report", config,
                      groups.pop() if len(groups) == 1 else None, tags, job_type="report",
                      resume=False)
    if run is None:
        return None
    import wandb  # lazy: start-up time (wandb takes seconds to import; only --wandb needs it)

    try:
        run.log({"report/table": wandb.Table(columns=table["header"], data=table["rows"]),
                 **{f"report/{png.stem}": wandb.Image(str(png)) for png in pngs}})
        where = str(Path(run.dir).parent)
    finally:
        run.finish()
    return where


def _reachable(url: str, timeout: float = 3.0) -> bool:
    parsed = urlparse(url)
    try:
        port = parsed.port or (80 if parsed.scheme == "http" else 443)
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False
