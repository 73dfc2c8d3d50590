"""logger=tensorboard: one event-file dir per job under the sweep, the same metric keys and
values as results.json, read back with TensorBoard's own reader."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import TINY
from tests.integration.test_cli import _assert_one_line_error, heads_lab


def _scalars(path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_a_sweeps_runs_write_event_files_with_results_json_values(tmp_path):
    sweep = tmp_path / "sweep"
    proc = heads_lab("train", "-m", *TINY, "logger=tensorboard", "model.heads=2,4",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(p.parent for p in sweep.glob("*/results.json"))
    assert len(jobs) == 2
    for job in jobs:
        results = json.loads((job / "results.json").read_text())
        assert results["tensorboard"] == {"dir": str(job / "tensorboard")}
        scalars = _scalars(job / "tensorboard")
        valid = {h["step"]: h["valid/loss"] for h in results["train"]["valid_history"]}
        assert [s for s, _ in scalars["valid/loss"]] == sorted(valid)
        for step, value in scalars["valid/loss"]:
            assert value == pytest.approx(valid[step], rel=1e-6)  # stored as float32
        last = results["train"]["steps"]
        for key in ("test/bleu", "test/ppl"):
            assert scalars[key] == [(last, pytest.approx(results["metrics"][key], rel=1e-6))]
            final = scalars["final/" + key.replace("/", "_")]
            assert final == [(last, pytest.approx(results["metrics"][key], rel=1e-6))]
        assert not [k for k in scalars if k.startswith("cost/")]  # costs: HParams columns
        assert [s for s, _ in scalars["train/loss"]] == [10, 20, 30]  # every trainer.log_every
        # the HParams tab: the head shape, seed and costs against the final numbers
        hparams, metrics = _hparams(job / "tensorboard")
        heads = results["config"]["model"]["heads"]
        assert {k: hparams[k] for k in ("h", "h_K", "h_V", "kv_heads", "attention", "seed")} == {
            "h": heads, "h_K": heads, "h_V": heads, "kv_heads": heads, "attention": "mha",
            "seed": 1}
        assert hparams["d_k"] == 64 // heads and hparams["params"] == results["metrics"]["cost/params"]
        assert {"final/valid_ppl", "final/test_bleu", "final/test_chrf"} <= set(metrics)
    # short run names: tensorboard --logdir <sweep>/tensorboard lists h=2 and h=4
    index = sweep / "tensorboard"
    assert sorted(p.name for p in index.iterdir()) == ["h=2", "h=4"]
    assert {(index / n).resolve() for n in ("h=2", "h=4")} == {(j / "tensorboard").resolve()
                                                                for j in jobs}


def _hparams(path) -> tuple[dict, list[str]]:
    """A run's HParams: its hyperparameter values and the metric tags the experiment names."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(path), size_guidance={"tensors": 0})
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    data = {tag: plugin_data_pb2.HParamsPluginData.FromString(raw) for tag, raw in content.items()}
    start = next(d.session_start_info for d in data.values() if d.HasField("session_start_info"))
    experiment = next(d.experiment for d in data.values() if d.HasField("experiment"))
    values = {}
    for key, value in start.hparams.items():
        kind = value.WhichOneof("kind")
        values[key] = int(value.number_value) if kind == "number_value" and \
            value.number_value.is_integer() else getattr(value, kind)
    return values, [m.name.tag for m in experiment.metric_infos]


def test_wandb_and_tensorboard_together(tmp_path):
    run = tmp_path / "run"
    proc = heads_lab("train", *TINY, "logger=wandb", "logger.tensorboard=true",
                     f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["wandb"]["mode"] == "offline" and results["tensorboard"]["dir"].endswith("tensorboard")
    assert "valid/ppl" in _scalars(run / "tensorboard")


@pytest.mark.parametrize("args", [["logger=tensorboard"], ["logger=wandb", "logger.tensorboard=true"],
                                  ["-m", "logger=tensorboard", "model.heads=2,4"]])
def test_tensorboard_missing_is_one_line_before_anything_trains(tmp_path, args):
    hide = tmp_path / "hide"  # a Python where `import tensorboard` fails
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['tensorboard'] = None\n")
    where = "hydra.sweep.dir" if "-m" in args else "hydra.run.dir"
    proc = heads_lab("train", *TINY, *args, f"{where}={tmp_path / 'out'}", cwd=tmp_path,
                     env={"PYTHONPATH": str(hide)})
    _assert_one_line_error(proc, f"{' '.join(a for a in args if a.startswith('logger'))} needs "
                           "the tensorboard package", "pip install 'tensorboard>=2.14'")
    assert not list(tmp_path.rglob("results.json")) and not list(tmp_path.rglob("checkpoints"))
