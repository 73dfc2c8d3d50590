"""Checkpoints: atomic and checksummed, corrupt ones skipped, a full disk harmless; exact resume
after a stop; non-finite steps skipped and counted; divergence stops with a checkpoint."""

from __future__ import annotations

import errno
import logging
import math

import numpy as np
import pytest
import torch

from heads_lab.config.schemas import TrainerConfig
from heads_lab.errors import CheckpointError
from heads_lab.training import checkpoint
from heads_lab.training.checkpoint import Checkpoints
from heads_lab.training.loop import train
from heads_lab.training.state import Diverged, Preempted
from tests.unit.test_train import _model, _split

CPU = torch.device("cpu")
CONFIG = {"model": {"heads": 4}, "seed": 0, "trainer": {"lr": 0.003, "max_steps": 12}}


def _state(step: int) -> dict:
    return {"step": step, "w": torch.arange(5.0) * step, "rng": checkpoint.rng_state()}


def test_save_and_load_round_trip(tmp_path):
    path = tmp_path / "c" / "step_0000003.pt"
    checkpoint.save(path, _state(3))
    back = checkpoint.load(path)
    assert back["step"] == 3 and torch.equal(back["w"], torch.arange(5.0) * 3)
    assert not list(path.parent.glob("*.tmp"))


@pytest.mark.parametrize("damage,reason", [
    (lambda b: b[:-10], "checksum"),  # truncated
    (lambda b: b[:-100] + bytes([b[-100] ^ 1]) + b[-99:], "checksum"),  # one bit flipped
    (lambda b: b[:20], "truncated"),
    (lambda b: b"PK\x03\x04 not ours", "not a heads-lab checkpoint"),
])
def test_damaged_checkpoints_are_detected(tmp_path, damage, reason):
    path = tmp_path / "step_0000001.pt"
    checkpoint.save(path, _state(1))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError, match=reason):
        checkpoint.load(path)


def test_latest_skips_a_corrupt_newest_checkpoint_with_a_warning(tmp_path, caplog):
    for step in (4, 8):
        checkpoint.save(checkpoint.step_path(tmp_path, step), _state(step))
    newest = checkpoint.step_path(tmp_path, 8)
    newest.write_bytes(newest.read_bytes()[:-1])
    with caplog.at_level(logging.WARNING):
        state, path = checkpoint.latest(tmp_path)
    assert state["step"] == 4 and path.name == "step_0000004.pt"
    assert "step_0000008.pt is corrupt" in caplog.text


def test_latest_with_only_corrupt_checkpoints_is_a_user_error(tmp_path):
    assert checkpoint.latest(tmp_path) is None  # no checkpoints at all: a fresh run
    path = checkpoint.step_path(tmp_path, 2)
    checkpoint.save(path, _state(2))
    path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="holds no valid checkpoint"):
        checkpoint.latest(tmp_path)


def test_a_full_disk_while_saving_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch,
                                                                         caplog):
    keeper = Checkpoints(tmp_path, TrainerConfig(keep_last=2), CONFIG)
    first = keeper.save(_state(5), 5, best=True)
    before = first.read_bytes()
    real_open = open

    class Full:
        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, data):
            self.written += len(data)
            if self.written > 1000:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(checkpoint, "open", lambda *a, **k: Full(real_open(*a, **k)),
                        raising=False)
    with caplog.at_level(logging.WARNING):
        assert keeper.save(_state(10), 10, best=True) is None  # a warning, training continues
    assert "No space left on device" in caplog.text and "step_0000005.pt) is intact" in caplog.text
    assert first.read_bytes() == before and checkpoint.load(first)["step"] == 5
    assert not checkpoint.step_path(tmp_path, 10).exists()
    assert not list(checkpoint.checkpoint_dir(tmp_path).glob("*.tmp"))
    assert checkpoint.load(checkpoint.checkpoint_dir(tmp_path) / "best.pt")["step"] == 5


def test_keep_last_and_best(tmp_path):
    keeper = Checkpoints(tmp_path, TrainerConfig(keep_last=2), CONFIG)
    for step, best in ((1, True), (2, False), (3, True), (4, False)):
        keeper.save(_state(step), step, best)
    assert [s for s, _ in checkpoint.step_files(tmp_path)] == [4, 3]
    assert checkpoint.load(checkpoint.checkpoint_dir(tmp_path) / "best.pt")["step"] == 3


def _cfg(**kw) -> TrainerConfig:
    base = dict(max_steps=12, max_tokens=64, lr=3e-3, warmup_steps=3, valid_every=5,
                log_every=4, save_every=4, keep_last=3)
    return TrainerConfig(**{**base, **kw})


def _train(tmp_path, cfg: TrainerConfig, model=None, config=CONFIG, **kw):
    split = _split(60)
    model = model or _model(dropout=0.3)  # seeds torch itself
    result = train(model, split, split, cfg, seed=0, device=CPU,
                   checkpoints=Checkpoints(tmp_path, cfg, config), **kw)
    return model, result


def test_a_stopped_and_resumed_run_equals_an_uninterrupted_one(tmp_path):
    """Stop (as on SIGTERM) at step 6, mid-epoch and between checkpoints, then resume: the final
    weights, losses and validation history equal an uninterrupted run's bit for bit (dropout
    on, so the RNG state must be restored too)."""
    whole, ref = _train(tmp_path / "whole", _cfg())
    calls = iter(range(100))
    with pytest.raises(Preempted, match="stopped by SIGTERM at step 6"):
        _train(tmp_path / "cut", _cfg(), stop_requested=lambda: "SIGTERM" if next(calls) == 5
               else None)
    assert checkpoint.latest(tmp_path / "cut")[0]["progress"]["step"] == 6
    fresh = _model(dropout=0.3)
    torch.manual_seed(123)  # a resumed process starts from another RNG state
    resumed, res = _train(tmp_path / "cut", _cfg(), model=fresh)
    assert res.resumed_from == 6 and res.steps == ref.steps == 12
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert res.train_loss == ref.train_loss
    assert res.history == ref.history and res.valid == ref.valid


def test_a_resumed_run_reports_the_largest_peak_memory_of_all_its_processes(tmp_path):
    """Peak memory is a process's; a run killed after training, during its evaluation, and run
    again trains no more in its new process, whose own peak is the evaluation's. So each
    checkpoint keeps the largest peak so far, and the resumed run reports it."""
    calls = iter(range(100))
    with pytest.raises(Preempted):
        _train(tmp_path, _cfg(), peak_mb=iter([700.0, 300.0, 500.0, 650.0]).__next__,
               stop_requested=lambda: "SIGTERM" if next(calls) == 9 else None)
    state, path = checkpoint.latest(tmp_path)
    # saves at steps 4, 5 (a new best), 8 and the stop's 10, each with one reading: the largest,
    # taken at step 4, is carried on though keep_last=3 has since deleted that checkpoint
    assert path.name == "step_0000010.pt" and state["progress"]["peak_mem_mb"] == 700.0
    assert not checkpoint.step_path(tmp_path, 4).exists()
    _, res = _train(tmp_path, _cfg(), peak_mb=lambda: 100.0)  # this process: small
    assert res.resumed_from == 10 and res.steps == 12
    assert res.peak_mem_mb == 700.0
    assert checkpoint.latest(tmp_path)[0]["progress"]["peak_mem_mb"] == 700.0
    # without a reader (heads-lab prune's fine-tuning) nothing is recorded
    _, fresh = _train(tmp_path / "other", _cfg())
    assert fresh.peak_mem_mb == 0.0


def test_resume_refuses_a_checkpoint_of_another_config(tmp_path):
    _train(tmp_path, _cfg(max_steps=4))
    split = _split(60)
    other = {**CONFIG, "model": {"heads": 2}}
    cfg = _cfg()
    with pytest.raises(CheckpointError, match="model.heads=4, not 2"):
        train(_model(), split, split, cfg, seed=0, device=CPU,
              checkpoints=Checkpoints(tmp_path, cfg, other))


def test_non_finite_steps_are_skipped_and_counted(tmp_path, caplog):
    model = _model()
    real_loss, calls = model.loss, iter(range(1000))

    def sometimes_nan(hidden, target, eps):
        loss, nll = real_loss(hidden, target, eps)
        return (loss * math.nan if next(calls) in (2, 3) else loss), nll

    model.loss = sometimes_nan
    with caplog.at_level(logging.WARNING):
        _, result = _train(tmp_path, _cfg(max_steps=8, save_every=0), model=model)
    assert result.skipped_steps == 2 and result.steps == 8
    assert "non-finite loss; update skipped" in caplog.text
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # the fused optimizer skipped them on the device: Adam counted 8 updates, not 10
    state, _ = checkpoint.latest(tmp_path)
    assert {float(s["step"]) for s in state["optimizer"]["state"].values()} == {8.0}


def test_a_run_of_non_finite_steps_stops_with_a_checkpoint_from_before(tmp_path):
    model = _model()
    real_loss, calls = model.loss, iter(range(1000))

    def blows_up(hidden, target, eps):
        loss, nll = real_loss(hidden, target, eps)
        return (loss * math.inf if next(calls) >= 3 else loss), nll

    model.loss = blows_up
    with pytest.raises(Diverged, match="3 non-finite steps in a row after step 3"):
        _train(tmp_path, _cfg(max_steps=20, save_every=0, max_bad_steps=3), model=model)
    state, _ = checkpoint.latest(tmp_path)
    assert state["progress"]["step"] == 3 and state["progress"]["skipped"] == 3
    for name, value in state["model"].items():
        assert torch.equal(value, model.state_dict()[name])  # the weights before the blow-up


@pytest.mark.parametrize("name", ["SIGTERM", "SIGUSR2", "SIGINT"])
def test_stop_signals_are_caught_and_reported_then_handlers_restored(name):
    import os
    import signal

    from heads_lab.commands.train import stop_signals

    sig = signal.Signals[name]
    before = signal.getsignal(sig)
    with stop_signals() as stop:
        assert stop() is None
        os.kill(os.getpid(), sig)
        assert stop() == name  # the loop sees it after the current update
        if name == "SIGINT":  # a second Ctrl-C stops at once
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), sig)
    assert signal.getsignal(sig) is before


def test_resume_ignores_analysis_settings_and_accepts_settings_added_since(tmp_path, caplog):
    """What cannot change a trajectory (analysis.*, report.*) may differ, and a setting the
    checkpoint lacks (added by a newer heads-lab) resumes with a warning; a changed training
    setting still refuses."""
    saved = {**CONFIG, "analysis": {"max_sentences": 500}}
    _train(tmp_path, _cfg(max_steps=4), config=saved)
    split = _split(60)
    newer = {**CONFIG, "analysis": {"max_sentences": 9, "min_arcs": 20},
             "report": {"base": {"model.heads": 8}}, "prune": {"init_keep": 0.9}}
    cfg = _cfg()
    with caplog.at_level(logging.WARNING, logger="heads_lab.training.checkpoint"):
        result = train(_model(), split, split, cfg, seed=0, device=CPU,
                       checkpoints=Checkpoints(tmp_path, cfg, newer))
    assert result.resumed_from == 4
    assert "no setting prune.init_keep (added since it was written)" in caplog.text
    assert "analysis" not in caplog.text
    with pytest.raises(CheckpointError, match="trainer.lr=0.003, not 0.001"):
        changed = {**newer, "trainer": {**CONFIG["trainer"], "lr": 0.001}}
        train(_model(), split, split, cfg, seed=0, device=CPU,
              checkpoints=Checkpoints(tmp_path, cfg, changed))


def test_a_sweep_worker_keeps_catching_stop_signals_between_jobs_and_catches_reads_proc():
    """In a joblib worker the stop handler stays in place after a job (a signal between two jobs
    must neither kill the worker nor be lost), training's stop_signals() reuses it, and the
    sweep's process sees from /proc which processes catch SIGTERM (only those are sent it)."""
    import os
    import signal

    from heads_lab.sweeps.signals import catches
    from heads_lab.training.stops import keep_stop_signals, stop_signals

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)}
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        assert not catches(os.getpid(), signal.SIGTERM)
        assert keep_stop_signals() is None
        assert catches(os.getpid(), signal.SIGTERM) and catches(os.getpid(), signal.SIGUSR2)
        with stop_signals() as stop:
            assert stop() is None
        assert catches(os.getpid(), signal.SIGTERM)  # still caught after the job
        os.kill(os.getpid(), signal.SIGUSR2)  # between two jobs
        assert keep_stop_signals() == "SIGUSR2"  # the next job must not start
        with stop_signals() as stop:
            assert stop() == "SIGUSR2"
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    assert not catches(os.getpid() + 10**7, signal.SIGTERM)  # no such process


def test_a_talking_heads_run_from_before_mix_init_resumes_only_with_its_old_start(tmp_path, caplog):
    """Its rectangular mixes started as the identity, the default before model.mix_init: the
    default now means N(0, 1/fan-in), so resuming under it would mislabel the run."""
    rect = {"attention": "talking_heads", "heads": 4, "heads_k": 8, "heads_v": 8}
    _train(tmp_path, _cfg(max_steps=4), config={**CONFIG, "model": rect})
    split = _split(60)
    cfg = _cfg()
    now = {**CONFIG, "model": {**rect, "mix_init": None}}
    with pytest.raises(CheckpointError, match="written before model.mix_init existed, by a run "
                       r"that started as model.mix_init=identity; resume with model.mix_init="
                       "identity"):
        train(_model(), split, split, cfg, seed=0, device=CPU,
              checkpoints=Checkpoints(tmp_path, cfg, now))
    named = {**CONFIG, "model": {**rect, "mix_init": "identity"}}
    with caplog.at_level(logging.WARNING, logger="heads_lab.training.checkpoint"):
        result = train(_model(), split, split, cfg, seed=0, device=CPU,
                       checkpoints=Checkpoints(tmp_path, cfg, named))
    assert result.resumed_from == 4 and "no setting model.mix_init" in caplog.text


def test_a_square_talking_heads_run_from_before_mix_init_resumes_under_the_default(tmp_path):
    square = {"attention": "talking_heads", "heads": 4}
    _train(tmp_path, _cfg(max_steps=4), config={**CONFIG, "model": square})
    split = _split(60)
    cfg = _cfg()
    result = train(_model(), split, split, cfg, seed=0, device=CPU, checkpoints=Checkpoints(
        tmp_path, cfg, {**CONFIG, "model": {**square, "mix_init": None}}))
    assert result.resumed_from == 4


def _auto(precision: str | None = "auto") -> dict:
    return {**CONFIG, "trainer": {**CONFIG["trainer"], "precision": precision}}


def _saved_in(tmp_path, computes: str, config: dict, record: bool = True):
    """A checkpoint of a run with `config` that computed in `computes` (as `heads-lab train`
    resolves trainer.precision=auto on its machine); record=False: one from before checkpoints
    recorded their precision."""
    state = {"progress": {"step": 4}, "w": torch.zeros(2)}
    if record:
        Checkpoints(tmp_path, _cfg(precision=computes), config).save(state, 4, best=False)
    else:
        checkpoint.save(checkpoint.step_path(tmp_path, 4), {**state, "config": config})


def test_a_run_records_the_precision_it_computes_in_and_resumes_only_in_it(tmp_path):
    """trainer.precision=auto is bf16 where bf16 is native (a GPU, an AMX Xeon) and fp32
    elsewhere: a checkpoint records what its run computed in, and a run never resumes in
    another precision (it would silently change precision mid-trajectory)."""
    _train(tmp_path / "loop", _cfg(max_steps=4))
    assert checkpoint.latest(tmp_path / "loop")[0]["precision"] == "fp32"  # the loop's saves
    # the loop given an unresolved `auto` computes in fp32, and says so
    Checkpoints(tmp_path / "unresolved", _cfg(precision="auto"), _auto()).save(
        {"progress": {"step": 4}}, 4, best=False)
    assert checkpoint.latest(tmp_path / "unresolved")[0]["precision"] == "fp32"

    _saved_in(tmp_path / "gpu", "bf16", _auto())
    with pytest.raises(CheckpointError, match=r"step_0000004.pt trained in bf16 \(trainer.precision"
                       r"=auto\), but this run computes in fp32; resume it with trainer.precision="
                       r"bf16 \(or auto\) where bf16 is native, or use another run dir"):
        Checkpoints(tmp_path / "gpu", _cfg(precision="fp32"), _auto()).resume_state()
    _saved_in(tmp_path / "cpu", "fp32", _auto())
    with pytest.raises(CheckpointError, match=r"trained in fp32 \(trainer.precision=auto\), but "
                       r"this run computes in bf16; resume it with trainer.precision=fp32 \(or "
                       r"auto\), or use"):
        Checkpoints(tmp_path / "cpu", _cfg(precision="bf16"), _auto()).resume_state()
    # auto and the precision it resolved to resume each other, both ways
    assert Checkpoints(tmp_path / "cpu", _cfg(precision="fp32"), _auto()).resume_state()
    assert Checkpoints(tmp_path / "cpu", _cfg(precision="fp32"), _auto("fp32")).resume_state()
    _saved_in(tmp_path / "fp32", "fp32", _auto("fp32"))
    assert Checkpoints(tmp_path / "fp32", _cfg(precision="fp32"), _auto()).resume_state()
    # an explicit setting other than the one trained in is refused, as before
    with pytest.raises(CheckpointError, match=r"trained in fp32 \(trainer.precision=fp32\), but "
                       "this run computes in bf16; resume it with trainer.precision=fp32"):
        Checkpoints(tmp_path / "fp32", _cfg(precision="bf16"), _auto("bf16")).resume_state()


def test_auto_resolves_to_the_precision_of_the_run_it_resumes(tmp_path, caplog):
    """`heads-lab train` resolves trainer.precision=auto before training (auto_precision): a
    new run computes in what is native; a resumed one in what its checkpoint trained in: fp32
    anywhere, bf16 only where bf16 is native (elsewhere one line saying where it can)."""
    assert checkpoint.auto_precision(tmp_path / "new", "bf16") == "bf16"
    assert checkpoint.auto_precision(tmp_path / "new", "fp32") == "fp32"
    _saved_in(tmp_path / "cpu", "fp32", _auto())
    with caplog.at_level(logging.INFO, logger="heads_lab.training.checkpoint"):
        assert checkpoint.auto_precision(tmp_path / "cpu", "bf16") == "fp32"  # e.g. on a GPU
    assert "step_0000004.pt trained in fp32, so the run resumes in fp32" in caplog.text
    assert checkpoint.auto_precision(tmp_path / "cpu", "fp32") == "fp32"
    _saved_in(tmp_path / "gpu", "bf16", _auto())
    assert checkpoint.auto_precision(tmp_path / "gpu", "bf16") == "bf16"
    with pytest.raises(CheckpointError, match=r"step_0000004.pt trained in bf16 \(trainer.precision"
                       r"=auto\), and bf16 is not native here; resume it where it is \(a GPU, a "
                       r"CPU with AVX512-BF16 or AMX\)"):
        checkpoint.auto_precision(tmp_path / "gpu", "fp32")
    _saved_in(tmp_path / "explicit", "bf16", _auto("bf16"), record=False)  # the setting says it
    with pytest.raises(CheckpointError, match="trained in bf16"):
        checkpoint.auto_precision(tmp_path / "explicit", "fp32")
    _saved_in(tmp_path / "old", "bf16", _auto(), record=False)  # unknown: what is native
    assert checkpoint.auto_precision(tmp_path / "old", "fp32") == "fp32"


def test_an_auto_checkpoint_from_before_precision_was_recorded_resumes_with_a_warning(
        tmp_path, caplog):
    _saved_in(tmp_path / "auto", "fp32", _auto(), record=False)
    with caplog.at_level(logging.WARNING, logger="heads_lab.training.checkpoint"):
        assert Checkpoints(tmp_path / "auto", _cfg(precision="bf16"), _auto()).resume_state()
    assert ("step_0000004.pt does not record the precision it trained in (trainer.precision=auto"
            in caplog.text and "it resumes in bf16, what auto is here" in caplog.text)
    caplog.clear()  # named explicitly, as the warning says: no warning
    with caplog.at_level(logging.WARNING, logger="heads_lab.training.checkpoint"):
        assert Checkpoints(tmp_path / "auto", _cfg(precision="fp32"), _auto("fp32")).resume_state()
    assert "precision" not in caplog.text
    # one with an explicit setting says what it trained in: no warning, and a change is refused
    _saved_in(tmp_path / "bf16", "bf16", _auto("bf16"), record=False)
    with caplog.at_level(logging.WARNING, logger="heads_lab.training.checkpoint"):
        assert Checkpoints(tmp_path / "bf16", _cfg(precision="bf16"), _auto()).resume_state()
    assert "precision" not in caplog.text
    with pytest.raises(CheckpointError, match=r"trained in bf16 \(trainer.precision=bf16\)"):
        Checkpoints(tmp_path / "bf16", _cfg(precision="fp32"), _auto()).resume_state()
    # an older checkpoint's config without the setting at all (the loop alone) checks nothing
    _saved_in(tmp_path / "none", "fp32", CONFIG, record=False)
    assert Checkpoints(tmp_path / "none", _cfg(precision="bf16"), CONFIG).resume_state()


def test_checkpoint_averaging_is_the_float64_mean_cast_back():
    """`heads-lab eval eval.average_last=N`: each float tensor the mean of the N checkpoints'
    (summed in float64, then in its own dtype, bf16 included); integer buffers from the first."""
    from heads_lab.training.runs import average

    g = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(4, 3, generator=g), "b": torch.randn(5, generator=g).bfloat16(),
               "step": torch.tensor([7 + i])} for i in range(3)]
    out = average(states)
    w = np.mean([s["w"].double().numpy() for s in states], axis=0)
    b = np.mean([s["b"].double().numpy() for s in states], axis=0)
    assert out["w"].dtype == torch.float32 and out["b"].dtype == torch.bfloat16
    assert torch.equal(out["w"], torch.from_numpy(w).float())
    assert torch.equal(out["b"], torch.from_numpy(b).bfloat16())
    assert torch.equal(out["step"], states[0]["step"])
    assert average(states[:1]) is states[0]


def test_a_read_back_model_is_checked_against_the_checkpoints_own_record(tmp_path):
    """eval, analyze and prune rebuild a run's model from .hydra/overrides.yaml; a model
    setting that differs from the checkpoint's record is refused, written as an override writes
    it (null, not None); settings that act in training only (dropout, a mix's start, which a
    preset may change later) and settings the checkpoint predates pass."""
    from heads_lab.training.runs import _check_same_model
    from tests.conftest import compose

    cfg = compose(["model.attention=talking_heads", "model.mix_init=normal",
                   "model.dropout=0.3"])
    path = tmp_path / "run" / "checkpoints" / "step_0000004.pt"
    saved = {"model": {"attention": "talking_heads", "heads": 4, "mix_init": "identity",
                       "dropout": 0.1, "heads_k": None}}
    _check_same_model(saved, cfg, path)  # passes: training-only settings, heads_v not recorded
    saved["model"]["heads_k"] = 2
    with pytest.raises(CheckpointError, match=r"model.heads_k=2, but .*run/.hydra/overrides.yaml "
                                              r"now rebuilds model.heads_k=null: .*set "
                                              r"model.heads_k=2 there"):
        _check_same_model(saved, cfg, path)
