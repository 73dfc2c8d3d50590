"""The training loop: schedule, gradient accumulation, stopping, determinism, learning."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from heads_lab.config.schemas import ModelConfig, TrainerConfig
from heads_lab.data.batching import Split, epoch_batches
from heads_lab.model import Transformer
from heads_lab.training.loop import train
from heads_lab.training.optim import inverse_sqrt

CPU = torch.device("cpu")


def test_inverse_sqrt_schedule_peaks_at_warmup():
    f = inverse_sqrt(4)
    assert [f(s) for s in range(1, 6)] == [0.25, 0.5, 0.75, 1.0, math.sqrt(4 / 5)]
    assert f(16) == 0.5
    assert inverse_sqrt(0)(1) == 1.0 and inverse_sqrt(0)(4) == 0.5


def test_learning_rates_applied_per_update():
    split = _split(40)
    model = _model()
    seen = []
    cfg = TrainerConfig(max_steps=6, max_tokens=64, lr=1.0, warmup_steps=4, log_every=1,
                        valid_every=100)
    train(model, split, split, cfg, seed=0, device=CPU,
          on_log=lambda step, m: seen.append(m["train/lr"]) if "train/lr" in m else None)
    # after update s the scheduler holds the rate of update s + 1
    assert seen == pytest.approx([0.5, 0.75, 1.0, math.sqrt(4 / 5), math.sqrt(4 / 6),
                                  math.sqrt(4 / 7)])


def _split(n: int, seed: int = 0) -> Split:
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, 30, rng.integers(2, 8)).astype(np.int32) for _ in range(n)]
    tgt = [np.array(list(reversed(s)), dtype=np.int32) for s in src]  # learnable: reverse
    return Split([""] * n, [""] * n, src, tgt)


def _model(seed: int = 0, dropout: float = 0.0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=1, decoder_layers=1,
                      dropout=dropout)
    return Transformer(cfg, 30)


def test_update_freq_gives_the_gradient_of_the_whole_update():
    """Two batches accumulated in one update = one batch holding both: same parameters after."""
    split = _split(16)
    small = next(t for t in range(8, 500) if len(epoch_batches(split, t, seed=0, epoch=0)) == 2)
    big = 10_000
    assert len(epoch_batches(split, big, seed=0, epoch=0)) == 1
    a, b = _model().double(), _model().double()
    common = dict(max_steps=1, lr=1e-2, warmup_steps=0, valid_every=100, log_every=100)
    train(a, split, split, TrainerConfig(max_tokens=small, update_freq=2, **common), 0, CPU)
    train(b, split, split, TrainerConfig(max_tokens=big, update_freq=1, **common), 0, CPU)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, msg=name)


def test_max_epochs_stops_after_whole_epochs_and_keeps_short_groups():
    split = _split(40)
    batches = len(epoch_batches(split, 64, seed=0, epoch=0))
    cfg = TrainerConfig(max_steps=None, max_epochs=2, max_tokens=64, update_freq=3,
                        valid_every=1000)
    result = train(_model(), split, split, cfg, seed=0, device=CPU)
    per_epoch = [math.ceil(len(epoch_batches(split, 64, 0, e)) / 3) for e in (0, 1)]
    assert result.steps == sum(per_epoch) and batches > 3
    assert result.epochs == pytest.approx(2.0)  # every target token seen twice


def test_same_seed_same_training_and_the_model_learns():
    split = _split(200)
    cfg = TrainerConfig(max_steps=60, max_tokens=256, lr=3e-3, warmup_steps=10, valid_every=30,
                        log_every=10)
    runs = [train(_model(dropout=0.1), split, split, cfg, seed=3, device=CPU) for _ in range(2)]
    assert runs[0].history == runs[1].history and runs[0].train_loss == runs[1].train_loss
    assert runs[0].history[-1]["valid/loss"] < runs[0].history[0]["valid/loss"] < math.log(30)


def test_bf16_training_follows_the_fp32_loss_curve():
    split = _split(300)
    cfg = dict(max_steps=60, max_tokens=256, lr=3e-3, warmup_steps=10, valid_every=20,
               log_every=10)
    fp32 = train(_model(dropout=0.1), split, split, TrainerConfig(**cfg), seed=3, device=CPU)
    bf16 = train(_model(dropout=0.1), split, split, TrainerConfig(precision="bf16", **cfg), seed=3,
                 device=CPU)
    for a, b in zip(fp32.history, bf16.history):
        assert b["valid/loss"] == pytest.approx(a["valid/loss"], rel=0.05)
    assert bf16.history[-1]["valid/loss"] < bf16.history[0]["valid/loss"] - 0.1  # it learns
    assert all(p.dtype == torch.float32 for p in _model().parameters())  # fp32 master weights


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_compiled_training_follows_eager_training_and_keeps_the_checkpoint_keys():
    """trainer.compile=true runs the training forward through torch.compile (really: dynamo
    traces a graph) and trains the same model as eager, within float rounding; the model's own
    parameter names, which checkpoints hold, are unchanged."""
    from torch._dynamo.utils import counters

    split = _split(120)
    cfg = dict(max_steps=12, max_tokens=256, lr=3e-3, warmup_steps=4, valid_every=6, log_every=6)
    eager = train(_model(), split, split, TrainerConfig(**cfg), seed=3, device=CPU)
    torch._dynamo.reset()
    counters.clear()
    model = _model()
    keys = list(model.state_dict())
    compiled = train(model, split, split, TrainerConfig(compile=True, **cfg), seed=3, device=CPU)
    assert counters["stats"]["unique_graphs"] >= 1
    assert list(model.state_dict()) == keys
    assert [h["step"] for h in compiled.history] == [h["step"] for h in eager.history]
    for a, b in zip(eager.history, compiled.history):
        assert b["valid/loss"] == pytest.approx(a["valid/loss"], rel=1e-4)
    assert compiled.train_loss == pytest.approx(eager.train_loss, rel=1e-4)


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_captured_step_follows_eager_training_on_padded_batches():
    """trainer.capture=true (forward, full-shape loss and backward in one compiled function)
    with trainer.pad_multiple=8 trains the same model as the eager step, within float
    rounding: dropout off, so padding, the loss's summation order and the compiled kernels
    are all that differ. The padded rows and positions take no part."""
    from torch._dynamo.utils import counters

    split = _split(120)
    cfg = dict(max_steps=10, max_tokens=128, lr=3e-3, warmup_steps=4, valid_every=5, log_every=5,
               update_freq=2)  # accumulating into the gradients allocated before capture
    eager = train(_model(dropout=0.0), split, split, TrainerConfig(**cfg), seed=3, device=CPU)
    torch._dynamo.reset()
    counters.clear()
    captured = train(_model(dropout=0.0), split, split,
                     TrainerConfig(capture=True, pad_multiple=8, **cfg), seed=3, device=CPU)
    assert counters["stats"]["unique_graphs"] >= 1  # really compiled
    assert [h["step"] for h in captured.history] == [h["step"] for h in eager.history]
    for a, b in zip(eager.history, captured.history):
        assert b["valid/loss"] == pytest.approx(a["valid/loss"], rel=1e-4)
    assert captured.train_loss == pytest.approx(eager.train_loss, rel=1e-4)
    assert eager.history[-1]["valid/loss"] < eager.history[0]["valid/loss"]  # it learned


def test_capture_auto_captures_on_a_cuda_device_only():
    """trainer.capture=auto (the default) is on for a CUDA device and off on a CPU, and off where
    trainer.compile=true asks for the compiled forward instead or the training is not plain
    (head gates, data-parallel ranks); true and false are as set, as YAML booleans too (read
    back as 'True' and 'False')."""
    from heads_lab.config.compose import to_object
    from heads_lab.config.validate import validate
    from heads_lab.training.captured import capture_on
    from tests.conftest import compose

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    default = TrainerConfig()
    assert default.capture == "auto"
    assert capture_on(default, cuda) and not capture_on(default, cpu)
    assert not capture_on(TrainerConfig(compile=True), cuda)
    assert not capture_on(default, cuda, plain=False)  # head gates, data-parallel ranks
    assert capture_on(TrainerConfig(capture="true"), cuda, plain=False)  # unless asked
    for setting, on in (("true", True), ("false", False), (True, True), (False, False)):
        assert capture_on(TrainerConfig(capture=setting), cpu) is on
        assert capture_on(TrainerConfig(capture=setting), cuda) is on
    for overrides, on in ((["trainer.capture=true"], True), (["trainer.capture=false"], False),
                          (["trainer.compile=true"], False), ([], True)):
        run = to_object(compose(overrides))
        validate(run)  # compile=true beside capture=auto is no clash
        assert capture_on(run.trainer, cuda) is on, overrides


def test_padded_batches_give_the_same_loss_and_gradients():
    """pad_batch adds empty rows (source EOS, target input BOS, targets all padding) and
    padding positions: in float64 the summed loss and every gradient equal the unpadded
    batch's, and no attention row is fully masked (the loss stays finite)."""
    from heads_lab.data.batching import collate
    from heads_lab.training.captured import pad_batch

    split = _split(30)
    batch = collate(split, np.arange(5))
    padded = pad_batch(batch, 8)
    assert padded.src.shape[0] == 8 and padded.src.shape[1] % 8 == 0
    assert padded.tgt_in.shape[1] % 8 == 0 and padded.tgt_in.shape == padded.tgt_out.shape
    assert pad_batch(batch, 1) is batch
    model = _model(dropout=0.0).double()
    grads = []
    for b in (batch, padded):
        model.zero_grad()
        keep = b.tgt_out != model.pad_id
        hidden = model(b.src, b.tgt_in, hidden_only=True)[keep]
        loss, nll = model.loss(hidden, b.tgt_out[keep], 0.1)
        loss.backward()
        grads.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    assert math.isfinite(grads[1][0])
    assert grads[1][0] == pytest.approx(grads[0][0], rel=1e-12)
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


def test_bf16_is_refused_on_a_cpu_without_native_bf16(monkeypatch):
    import heads_lab.training.device as device
    from heads_lab.errors import ConfigError

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(device, "native_bf16", lambda: False)
    with pytest.raises(ConfigError, match="no native bf16 .* add trainer.precision=fp32"):
        device.check_precision(cpu, "bf16")
    device.check_precision(cpu, "fp32")
    device.check_precision(gpu, "bf16")  # GPUs multiply bf16 natively
    monkeypatch.setattr(device, "native_bf16", lambda: True)
    device.check_precision(cpu, "bf16")
    # auto: bf16 where native, fp32 elsewhere; explicit settings stay as they are
    monkeypatch.setattr(device, "native_bf16", lambda: False)
    assert device.resolve_precision(cpu, "auto") == "fp32"
    assert device.resolve_precision(cpu, "bf16") == "bf16" and device.resolve_precision(cpu, "fp32") == "fp32"
    monkeypatch.setattr(device, "native_bf16", lambda: True)
    assert device.resolve_precision(cpu, "auto") == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert device.resolve_precision(gpu, "auto") == "fp32"  # an old GPU without bf16
    # the probe itself answers from PyTorch's own CPU feature checks
    monkeypatch.undo()
    assert device.native_bf16() == (torch.cpu._is_avx512_bf16_supported()
                                          or torch.cpu._is_amx_tile_supported())


class _Clock:
    """train.py's `time` with a perf_counter that moves 0.5 s per call (two calls per update:
    each update takes 0.5 s)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 0.5
        return self.now


def test_each_update_reads_its_results_back_once_inside_its_timed_window(monkeypatch):
    """On CUDA a step's kernels run asynchronously, and reading a result back (`.item()`,
    `.tolist()`) waits for them: the read must come before the update's clock stops, or the
    optimizer's device time is missing from train_seconds, tok/s and trainer.max_time; and
    every read inside a step stalls the host, so an update reads back once (its losses and
    its finite flag, after the optimizer's kernels are queued). The log: each perf_counter
    call and each read, in order; the updates' windows are the pairs of clock reads."""
    from heads_lab.training import loop as train_module

    events = []

    class Clock:
        def perf_counter(self) -> float:
            events.append("clock")
            return float(len(events))

    item, tolist = torch.Tensor.item, torch.Tensor.tolist

    def logged_item(self):
        events.append("read")
        return item(self)

    def logged_tolist(self):
        events.append("read")
        return tolist(self)

    monkeypatch.setattr(train_module, "time", Clock())
    monkeypatch.setattr(torch.Tensor, "item", logged_item)
    monkeypatch.setattr(torch.Tensor, "tolist", logged_tolist)
    split = _split(40)
    cfg = TrainerConfig(max_steps=4, max_tokens=64, valid_every=100, log_every=100, keep_last=1,
                        update_freq=3)
    result = train(_model(), split, split, cfg, 0, CPU)
    assert result.steps == 4
    clocks = [i for i, e in enumerate(events) if e == "clock"]
    assert len(clocks) == 2 * 4  # a start and an end per update, nothing else on this clock
    windows = list(zip(clocks[::2], clocks[1::2]))
    for (_, end), (start, _) in zip(windows, windows[1:]):
        assert "read" not in events[end:start], f"a read between updates: {events[end:start]}"
    for start, end in windows:  # three batches, one read
        assert events[start:end].count("read") == 1, events[start:end]


def test_a_time_budget_stops_after_the_update_that_spends_it_and_resumes_with_more(
        monkeypatch, tmp_path):
    from heads_lab.training import loop as train_module
    from heads_lab.training.checkpoint import Checkpoints

    monkeypatch.setattr(train_module, "time", _Clock())
    split = _split(40)
    common = dict(max_steps=50, max_tokens=64, valid_every=100, log_every=100, keep_last=1)
    cfg = TrainerConfig(max_time=2.0, **common)
    checkpoints = Checkpoints(tmp_path, cfg, {"trainer": {"max_time": 2.0}})
    result = train(_model(), split, split, cfg, 0, CPU, checkpoints=checkpoints)
    # 4 updates of 0.5 s spend the 2 s; the budget ended before the first validation (step 100),
    # yet the run validated and saved as at max_steps
    assert (result.steps, result.stopped_by, result.train_seconds) == (4, "max_time", 2.0)
    assert result.history[-1]["step"] == 4 and math.isfinite(result.valid["ppl"])
    assert (tmp_path / "checkpoints" / "step_0000004.pt").is_file()
    # resumed with a larger budget: it goes on from step 4 and spends only what is left
    more = TrainerConfig(max_time=3.0, **common)
    resumed = train(_model(), split, split, more, 0, CPU,
                    checkpoints=Checkpoints(tmp_path, more, {"trainer": {"max_time": 3.0}}))
    assert (resumed.resumed_from, resumed.steps, resumed.stopped_by) == (4, 6, "max_time")
    # no budget: max_steps decides, as before
    plain = train(_model(), split, split, TrainerConfig(**{**common, "max_steps": 3}), 0, CPU)
    assert (plain.steps, plain.stopped_by) == (3, "max_steps")


def test_patience_stops_after_that_many_validations_without_a_new_best(monkeypatch):
    from heads_lab.training import loop as train_module

    losses = iter([3.0, 2.0, 2.5, 2.1, 2.2, 1.0, 0.5])  # best at the 2nd validation, then worse

    def fake_perplexity(*_, **__):
        loss = next(losses)
        return {"loss": loss, "ppl": math.exp(loss)}

    monkeypatch.setattr(train_module, "perplexity", fake_perplexity)
    cfg = TrainerConfig(max_steps=50, max_tokens=64, valid_every=2, log_every=100, patience=3)
    result = train(_model(), _split(40), _split(40), cfg, 0, CPU)
    # validations at steps 2, 4 (best), 6, 8, 10: three in a row without a new best → stop at 10
    assert (result.steps, result.stopped_by, result.best_step) == (10, "patience", 4)
    assert [h["step"] for h in result.history] == [2, 4, 6, 8, 10]


def test_best_weights_kept_in_memory_are_best_pt_s(tmp_path, monkeypatch):
    """keep_best (eval.checkpoint=best without checkpoints): the copy kept at each new best
    validation equals checkpoints/best.pt of the same run with checkpoints, which is the best
    step's weights, not the last step's; keeping it changes no number of the training."""
    from heads_lab.training import checkpoint
    from heads_lab.training import loop as train_module
    from heads_lab.training.checkpoint import Checkpoints

    real, calls = train_module.perplexity, []

    def penalised(model, *args, **kwargs):  # as measured, then worse from the 3rd validation on
        out = real(model, *args, **kwargs)
        calls.append(out["loss"])
        return {"loss": out["loss"] + (0.0 if len(calls) <= 2 else 10.0), "ppl": out["ppl"]}

    monkeypatch.setattr(train_module, "perplexity", penalised)
    cfg = TrainerConfig(max_steps=10, max_tokens=64, lr=1e-2, warmup_steps=2, valid_every=2,
                        log_every=100)
    on_disk = train(_model(), _split(40), _split(8, 1), cfg, 0, CPU,
                    checkpoints=Checkpoints(tmp_path, cfg, {}))
    calls.clear()
    model = _model()
    kept = train(model, _split(40), _split(8, 1), cfg, 0, CPU, keep_best=True)
    assert on_disk.best_weights is None and on_disk.best_step == kept.best_step == 4
    best = checkpoint.load(tmp_path / "checkpoints" / "best.pt")
    assert best["progress"]["step"] == 4
    assert kept.best_weights.keys() == best["model"].keys()
    assert all(torch.equal(kept.best_weights[k], v) for k, v in best["model"].items())
    # the last weights moved on after step 4: the kept copy is not a view of them
    assert not all(torch.equal(kept.best_weights[k], v) for k, v in model.state_dict().items())
    assert kept.history == on_disk.history and kept.train_loss == on_disk.train_loss


def test_no_finite_validation_keeps_no_best_weights(monkeypatch):
    from heads_lab.training import loop as train_module

    monkeypatch.setattr(train_module, "perplexity", lambda *_, **__: {"loss": math.nan,
                                                                       "ppl": math.nan})
    cfg = TrainerConfig(max_steps=4, max_tokens=64, valid_every=2, log_every=100)
    result = train(_model(), _split(40), _split(8, 1), cfg, 0, CPU, keep_best=True)
    assert result.best_weights is None and result.best_step is None
    assert [h["step"] for h in result.history] == [2, 4]


def test_a_cuda_device_this_machine_lacks_is_refused_in_one_line(monkeypatch):
    """trainer.device=cuda on a machine without one (a CPU build of torch) failed at the first
    CUDA call with a traceback, after the run dir was made; cuda:N past the last GPU likewise."""
    import heads_lab.training.device as device
    from heads_lab.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^trainer.device=cuda: no CUDA device here \(torch .*"
                                          r"\); use trainer.device=cpu, or auto$"):
        device.resolve_device("cuda")
    with pytest.raises(ConfigError, match="^trainer.device=gpu is not a device: use auto, cpu"):
        device.resolve_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(device, "no_cudnn_attention", lambda: None)
    with pytest.raises(ConfigError, match=r"^trainer.device=cuda:3: this machine has 1 CUDA device "
                                          r"\(cuda:0 to cuda:0\); use one of those"):
        device.resolve_device("cuda:3")
    assert device.resolve_device("cuda:0") == torch.device("cuda", 0)


def test_a_cuda_device_takes_cudnn_out_of_fused_attention_and_a_cpu_one_leaves_it(monkeypatch):
    """cuDNN's attention builds a plan for every new batch shape, and heads-lab's token-packed
    batches nearly all have their own (training.device.no_cudnn_attention): a cuda device turns
    it off for the process (a run's, the bench's); a cpu device (auto without a GPU too) leaves
    PyTorch's order alone."""
    import heads_lab.training.device as device

    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        assert device.resolve_device("auto") == torch.device("cpu")
        assert device.resolve_device("cpu") == torch.device("cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()
        torch.backends.cuda.enable_cudnn_sdp(True)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        assert device.resolve_device("cuda:1") == torch.device("cuda", 1)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert device.resolve_device("auto") == torch.device("cuda")
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        # the bench's workload too, also in the fresh process that measures peak memory
        from heads_lab.bench.measure import Workload

        torch.backends.cuda.enable_cudnn_sdp(True)
        assert Workload(device="cpu").torch_device == torch.device("cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()
        assert Workload(device="cuda:0").torch_device == torch.device("cuda", 0)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
