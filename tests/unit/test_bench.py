"""The benchmark's pieces (not its speeds): the baseline, the depth pairing, a smoke run."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from heads_lab.bench.baseline import TorchTransformer
from heads_lab.bench.depth import pair
from heads_lab.bench.measure import Variant, Workload, decode_throughput, train_throughput
from heads_lab.config.cost import Lengths, account, parameter_count
from heads_lab.config.schemas import AttentionKind, ModelConfig
from heads_lab.model import Transformer
from heads_lab.training import device as device_mod

SMALL = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=1, decoder_layers=1)


def test_torch_baseline_trains_and_decodes_like_our_model():
    work = Workload(batch=4, length=6, vocab=50)
    rows = train_throughput([Variant("torch", SMALL, baseline=True), Variant("ours", SMALL)], work,
                            steps=2, warmup=1)
    assert all(r["tokens_per_s"] > 0 for r in rows)
    rate, out = decode_throughput(Variant("torch", SMALL, baseline=True), work, 2, use_cache=False,
                                  reps=1)
    assert rate > 0 and all(len(o) == 6 for o in out)  # EOS held back: fixed-length outputs
    base = TorchTransformer(SMALL, 50)
    ours = sum(p.numel() for p in Transformer(SMALL, 50).parameters())
    assert sum(p.numel() for p in base.parameters()) == ours  # same dims, same parameter count


def test_the_marian_peer_is_transformers_own_model_trained_by_the_bench_step():
    """bench --peers' Marian: with its dims from heads-lab's config, its logits are those of
    transformers' MarianMTModel forward (the library's own, on a padded batch, dropout off);
    the bench step trains it; it decodes by its own generate; torch.nn.Transformer's forward is
    its decode of its encode."""
    pytest.importorskip("transformers", reason="the hf extra (make test installs it)")
    from heads_lab.bench.baseline import MarianPeer

    cfg = dataclasses.replace(SMALL, dropout=0.0)
    torch.manual_seed(0)
    peer = MarianPeer(cfg, 50).eval()
    src = torch.randint(3, 50, (3, 7))
    src[0, 5:] = 0  # padding
    tgt = torch.randint(3, 50, (3, 5))
    with torch.no_grad():
        ours = peer.logits(peer(src, tgt))
        theirs = peer.hf(input_ids=src, attention_mask=(src != 0).long(),
                         decoder_input_ids=tgt).logits
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    assert peer.hf.config.d_model == 32 and peer.hf.config.encoder_attention_heads == 4
    assert peer.hf.config.encoder_ffn_dim == 64 and peer.hf.config.decoder_layers == 1
    (row,) = train_throughput([Variant("marian", SMALL, baseline=True, peer="marian")],
                              Workload(batch=4, length=6, vocab=50), steps=2, warmup=1)
    assert row["tokens_per_s"] > 0 and len(row["losses"]) == 6
    # decoding: its own generate, exactly `length` tokens; greedy is the argmax of its own
    # logits step by step (from its start token, EOS held back), computed here without a cache
    work = Workload(batch=3, length=5, vocab=50)
    for beam in (1, 4):
        rate, out = decode_throughput(Variant("marian", cfg, baseline=True, peer="marian"), work,
                                      beam, use_cache=True, reps=1)
        assert rate > 0 and [len(o) for o in out] == [5, 5, 5]
        if beam == 1:
            torch.manual_seed(0)
            again = MarianPeer(cfg, 50).eval()
            src = work.tensors(0)[0]
            ids = torch.zeros((3, 1), dtype=torch.long)  # the decoder's start token (pad)
            with torch.no_grad():
                enc = again.encode(src)
                for _ in range(5):
                    logits = again.logits(again.decode(ids, enc))[:, -1]
                    logits[:, 2] = float("-inf")  # EOS held back
                    ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
            assert ids[:, 1:].tolist() == out
    base = TorchTransformer(SMALL, 50).eval()
    with torch.no_grad():
        assert torch.equal(base(src, tgt), base.decode(tgt, base.encode(src)))


@pytest.mark.slow  # compiles two models: `make test-slow` (CI runs it)
def test_the_peers_train_through_torch_compile_as_their_users_would():
    """bench --peers --compile's rows: torch.nn.Transformer and Marian through torch.compile,
    trained by the bench's step, their losses those of the eager step (dropout off, same
    weights and batch) within float rounding."""
    pytest.importorskip("transformers", reason="the hf extra (make test installs it)")
    cfg = dataclasses.replace(SMALL, dropout=0.0)
    work = Workload(batch=4, length=6, vocab=50)
    for peer in ("torch.nn", "marian"):
        rows = train_throughput([Variant(peer, cfg, baseline=True, peer=peer),
                                 Variant(f"{peer} compiled", cfg, baseline=True, peer=peer,
                                         compile=True)], work, steps=2, warmup=1)
        eager, compiled = (r["losses"] for r in rows)
        assert compiled == pytest.approx(eager, rel=1e-4), peer


def test_the_peers_table_adds_marian_and_compiled_peers_and_their_target():
    """bench --peers: Marian at h=8; with --compile torch.nn.Transformer and Marian compiled
    too; the captured h=8 row is held to 1.3× the fastest of them."""
    from heads_lab.bench.suite import MHA8, targets, variants

    model = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=1, decoder_layers=1)
    rows = {v.name: v for v in variants(model, quick=True, precision="bf16", compile=True,
                                        peers=True)}
    assert {n: (v.peer, v.compile) for n, v in rows.items() if v.baseline} == {
        "torch.nn.Transformer h=8": ("torch.nn", False), "Marian h=8": ("marian", False),
        "torch.nn.Transformer h=8 compiled": ("torch.nn", True),
        "Marian h=8 compiled": ("marian", True)}
    assert not any(v.peer == "marian" for v in variants(model, quick=True, precision="bf16"))
    row = {"tokens_per_s": 100.0, "mfu": 0.5, "losses": []}
    by = {MHA8: row, f"{MHA8} fp32": row, "torch.nn.Transformer h=8": row,
          "Marian h=8 compiled": {**row, "tokens_per_s": 200.0},
          f"{MHA8} captured": {**row, "tokens_per_s": 300.0}}
    (found,) = [t for t in targets(by, None, decode=False, precision="bf16") if "peer" in t[0]]
    assert found == ("h=8 captured ≥ 1.3× the fastest peer (Marian h=8 compiled)", "1.50×", True)


def _their_name(ours: str) -> str:
    """torch.nn.Transformer's name for a parameter of heads-lab's model (pre-norm, mha)."""
    if ours == "embed.weight":
        return ours
    for side in ("encoder", "decoder"):
        if ours.startswith(f"{side}_norm."):
            return f"core.{side}.norm." + ours.split(".", 1)[1]
    side, layer, rest = ours.split(".", 2)
    renames = {"self_attn.in_proj.": "self_attn.in_proj_", "cross_attn.in_proj.":
               "multihead_attn.in_proj_", "cross_attn.": "multihead_attn.", "ffn.fc1": "linear1",
               "ffn.fc2": "linear2", "res_self.norm": "norm1",
               "res_cross.norm": "norm2", "res_ffn.norm": "norm2" if side == "encoder" else "norm3"}
    for a, b in renames.items():
        if rest.startswith(a):
            rest = b + rest[len(a):]
            break
    return f"core.{side}.layers.{layer}.{rest}"


def test_torch_baseline_computes_our_models_function():
    """The bench's baseline is the same network as heads-lab's model, built from torch's own
    modules: with our weights copied in, it gives our logits (float64, padded batch, 2+2 layers)
    to 1e-12. Scaled embeddings, sinusoid positions, pre-norm, masks and the tied output layer
    all enter the logits."""
    cfg = dataclasses.replace(SMALL, encoder_layers=2, decoder_layers=2)
    torch.manual_seed(0)
    ours = Transformer(cfg, 50).double().eval()
    base = TorchTransformer(cfg, 50).double().eval()
    theirs = dict(base.named_parameters())
    with torch.no_grad():
        for name, weight in ours.named_parameters():
            theirs.pop(_their_name(name)).copy_(weight)
    assert not theirs  # every parameter of the baseline came from ours
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
    tgt = torch.tensor([[1, 11, 12, 13], [1, 14, 15, 0]])
    with torch.no_grad():
        want = ours.logits(ours.decode(tgt, ours.encode(src)))
        got = base.logits(base.decode(tgt, base.encode(src)))
    real = tgt != 0  # a padded position's output is nobody's
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-12)
    assert (got[real] - want[real]).abs().max() < 1e-12 < want[real].abs().max()


class _Clock:
    """A fake perf_counter, and products that take flops / rate of its seconds."""

    def __init__(self, gflops_per_s: float):
        self.t, self.rate, self.products = 0.0, gflops_per_s, 0

    def randn(self, *shape, **_):
        return _SlowMatrix(self, shape)


class _SlowMatrix:
    def __init__(self, clock, shape):
        self.clock, self.shape = clock, shape

    def __matmul__(self, other):
        self.clock.t += 2 * self.shape[0] * self.shape[1] * other.shape[1] / (self.clock.rate * 1e9)
        self.clock.products += 1


@pytest.mark.parametrize("rate", [80.0, 0.5])
def test_matmul_ceiling_finds_a_planted_rate_within_its_budget(monkeypatch, rate):
    """A machine whose products run at a known rate: 80 GFLOP/s (every shape, 1 + 10 products
    each) and 0.5 GFLOP/s (bf16 on a CPU without native bf16, where all shapes × 13 products
    took over ten minutes): the ceiling is the planted rate and the clock stays in the budget."""
    clock = _Clock(rate)
    monkeypatch.setattr(device_mod.torch, "randn", clock.randn)
    monkeypatch.setattr(device_mod, "time", SimpleNamespace(perf_counter=lambda: clock.t))
    ceiling = device_mod.matmul_ceiling(torch.bfloat16, budget_s=10.0)
    assert ceiling == pytest.approx(rate)
    assert clock.t <= 10.0
    if rate == 80.0:
        assert clock.products == 11 * len(device_mod.CEILING_SHAPES)
    else:  # 2048×1024×1024 once (8.6 s); then only 1280×256×1024 fits once (1.3 s)
        assert clock.products == 2


def test_deep_single_head_twin_has_the_same_heads_parameters_and_flops():
    shallow = ModelConfig(d_model=256, heads=8, d_ff=1024, encoder_layers=3, decoder_layers=3)
    s, d = pair(shallow)
    assert (d.heads, d.d_head, d.encoder_layers, d.d_ff) == (1, 32, 24, 128)
    assert s.heads * s.encoder_layers == d.heads * d.encoder_layers  # same total heads
    ps, pd = parameter_count(s, 8000), parameter_count(d, 8000)
    assert pd["attention"] == pytest.approx(ps["attention"], rel=0.01)
    assert pd["ffn"] == pytest.approx(ps["ffn"], rel=0.01)
    fs = account(s, 8000, Lengths(20, 20))["flops_per_token"]["train"]
    fd = account(d, 8000, Lengths(20, 20))["flops_per_token"]["train"]
    assert fd == pytest.approx(fs, rel=0.01)
    with pytest.raises(ValueError, match="divisible"):
        pair(ModelConfig(d_model=24, heads=5, head_dim=4, d_ff=12))


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_bench_command_runs_and_writes_its_targets(tmp_path, monkeypatch):
    from heads_lab.bench import main

    monkeypatch.setattr("heads_lab.bench.suite.matmul_ceiling", lambda dtype, device: 100.0)
    monkeypatch.setattr("heads_lab.bench.suite.native_bf16", lambda: True)  # any CPU: tiny dims
    out = tmp_path / "bench.json"
    assert main(["--quick", "--steps", "1", "--warmup", "0", "--json", str(out), "--device", "cpu",
                 "--batch", "4", "--length", "6", "model.d_model=32", "model.d_ff=64",
                 "model.encoder_layers=1", "model.decoder_layers=1"]) == 0
    result = json.loads(out.read_text())
    names = {r["name"] for r in result["rows"]}
    assert {"torch.nn.Transformer h=8", "mha h=8", "talking_heads h=32", "mha h=8 bf16"} <= names
    mha = next(r for r in result["rows"] if r["name"] == "mha h=8")
    assert mha["cache_identical"] is True and mha["greedy_uncached"] > 0
    assert len(result["targets"]) >= 8


def test_a_cpu_without_native_bf16_gets_no_bf16_rows_and_its_bf16_targets_say_why():
    """bench --quick on an AVX2 CPU ran its emulated bf16 rows for over ten minutes without a
    line; they are left out there, and the two bf16 targets are n/a, saying why."""
    from heads_lab.bench.suite import MHA8, targets, variants

    model = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=1, decoder_layers=1)
    with_bf16 = {v.name for v in variants(model, quick=True)}
    without = {v.name for v in variants(model, quick=True, bf16=False)}
    assert {"mha h=8 bf16", "talking_heads h=8 bf16"} <= with_bf16
    assert without == with_bf16 - {"mha h=8 bf16", "talking_heads h=8 bf16"}
    row = {"tokens_per_s": 100.0, "mfu": 0.5, "losses": [9.0, 8.0]}
    out = targets({MHA8: row, "torch.nn.Transformer h=8": row}, None, decode=False)
    assert [t for t in out if t[0].startswith("bf16")] == [
        ("bf16 ≥ 1.4× fp32 (h=8)", "n/a (no native bf16 on this CPU)", None),
        ("bf16 loss curve within 2 % of fp32", "n/a (no native bf16 on this CPU)", None)]


def test_the_compiled_table_captures_every_variants_rows_and_targets_talking_heads_captured():
    """bench --compile --capture-all: multi-head h = 1, 8, 32 and kv_heads=1 and talking heads
    h = 8 and 32 each captured (trainer.capture), beside the compiled h = 8 row; and the
    target that talking heads captured reach 0.9× multi-head captured, met or not as measured."""
    from heads_lab.bench.suite import MHA8, targets, variants

    model = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=1, decoder_layers=1)
    rows = {v.name: v for v in variants(model, quick=True, precision="bf16", compile=True,
                                        capture_all=True)}
    captured = {name for name, v in rows.items() if v.capture}
    assert captured == {"mha h=1 captured", "mha h=8 captured", "mha h=32 captured",
                        "mha h=8 kv_heads=1 captured", "talking_heads h=8 captured",
                        "talking_heads h=32 captured"}
    assert rows["talking_heads h=32 captured"].model.attention == AttentionKind.talking_heads
    assert rows["talking_heads h=32 captured"].model.heads == 32
    assert rows["mha h=8 kv_heads=1 captured"].model.kv_heads == 1
    assert {n for n, v in rows.items() if v.compile} == {f"{MHA8} compiled"}
    assert not any(v.capture for v in variants(model, quick=True, precision="bf16"))
    assert [v.name for v in variants(model, quick=True, precision="bf16", compile=True)
            if v.capture] == ["mha h=8 captured"]  # the GPU check's bench, as measured
    row = {"tokens_per_s": 100.0, "mfu": 0.5, "losses": []}
    for th, met in ((95.0, True), (85.0, False)):
        by = {MHA8: row, "torch.nn.Transformer h=8": row, f"{MHA8} fp32": row,
              "mha h=8 captured": row, "talking_heads h=8 captured": {**row, "tokens_per_s": th}}
        (found,) = [t for t in targets(by, None, decode=False, precision="bf16")
                    if "captured" in t[0]]
        assert found == ("talking heads h=8 captured ≥ 0.9× mha captured", f"{th / 100:.2f}×", met)


def test_bench_rejects_other_overrides():
    from heads_lab.bench import main
    from heads_lab.errors import ConfigError

    with pytest.raises(ConfigError, match="model.KEY=VALUE overrides only"):
        main(["trainer.lr=1"])
    with pytest.raises(ConfigError, match="model.heads=3 does not divide"):
        main(["model.heads=3"])
    with pytest.raises(ConfigError, match="bench --capture-all .* add --compile"):
        main(["--capture-all"])
    with pytest.raises(ConfigError, match="bench --capture profiles .* --profile train"):
        main(["--profile", "greedy", "--capture"])


@pytest.mark.slow  # long end to end: `make test-slow` (CI runs it)
def test_bench_in_bf16_runs_every_row_in_bf16_beside_one_fp32_row(tmp_path, monkeypatch):
    """The GPU's table (--precision bf16): torch.nn.Transformer in bf16 too, multi-head h=8 in
    fp32 for the loss-curve check, and the GPU targets' wording. Run here on CPU with bf16
    allowed (tiny dims, so emulated bf16 costs nothing)."""
    from heads_lab.bench import main

    monkeypatch.setattr("heads_lab.bench.suite.matmul_ceiling", lambda dtype, device: 100.0)
    monkeypatch.setattr("heads_lab.training.device.native_bf16", lambda: True)
    out = tmp_path / "bench.json"
    assert main(["--quick", "--steps", "1", "--warmup", "0", "--json", str(out), "--device", "cpu",
                 "--precision", "bf16", "--batch", "3", "--length", "5", "model.d_model=32",
                 "model.d_ff=64", "model.encoder_layers=1", "model.decoder_layers=1"]) == 0
    result = json.loads(out.read_text())
    rows = {r["name"]: r for r in result["rows"]}
    assert rows["torch.nn.Transformer h=8"]["precision"] == "bf16"
    assert rows["mha h=8"]["precision"] == "bf16" and rows["mha h=8 fp32"]["precision"] == "fp32"
    assert "mha h=8 bf16" not in rows
    assert result["workload"] == {"batch": 3, "length": 5, "vocab": 8000, "device": "cpu"}
    assert result["targets"][0][0] == "bf16 h=8 ≥ 1.3× torch.nn.Transformer"
    assert result["precision"] == "bf16" and result["device"] == "cpu"


def test_bench_refuses_a_device_it_cannot_use():
    from heads_lab.bench import main
    from heads_lab.errors import ConfigError

    with pytest.raises(ConfigError, match="is not a device"):
        main(["--device", "tpu"])
    if not __import__("torch").cuda.is_available():
        with pytest.raises(ConfigError,
                           match=r"^--device=cuda: no CUDA device here .*; use --device=cpu, or auto$"):
            main(["--device", "cuda"])


@pytest.mark.parametrize("what", ["train", "greedy"])
def test_bench_profile_writes_a_trace_and_the_operators_that_take_the_step(tmp_path, what):
    """--profile: torch.profiler over a few steps; the table's rows are the trace's own
    operators, their self times summing to no more than the step's."""
    from heads_lab.bench import main

    out, trace = tmp_path / "profile.json", tmp_path / "trace.json"
    assert main(["--profile", what, "--steps", "2", "--warmup", "1", "--rows", "8", "--device",
                 "cpu", "--json", str(out), "--trace", str(trace), "model.d_model=32",
                 "model.d_ff=64", "model.encoder_layers=1", "model.decoder_layers=1"]) == 0
    result = json.loads(out.read_text())
    assert result["what"] == what and result["clock"] == "cpu" and len(result["rows"]) == 8
    shares = [r["share"] for r in result["rows"]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert all(r["name"] in names for r in result["rows"])
    assert ("aten::mm" in names or "aten::addmm" in names) and f"{what} 0" in names


@pytest.mark.slow  # compiles the step: `make test-slow` (CI runs it)
def test_bench_profiles_the_captured_step_as_a_gpu_run_trains(tmp_path):
    """--profile train --capture: the step trainer.capture compiles (forward, loss and backward
    as one) is what is recorded: the trace holds the compiled region, its table the step's own
    operators."""
    from heads_lab.bench import main

    out, trace = tmp_path / "profile.json", tmp_path / "trace.json"
    assert main(["--profile", "train", "--capture", "--steps", "2", "--warmup", "2", "--rows",
                 "8", "--device", "cpu", "--json", str(out), "--trace", str(trace),
                 "model.d_model=32", "model.d_ff=64", "model.encoder_layers=1",
                 "model.decoder_layers=1"]) == 0
    result = json.loads(out.read_text())
    assert result["variant"] == "mha h=8 captured" and result["what"] == "train"
    names = {e.get("name", "") for e in json.loads(trace.read_text())["traceEvents"]}
    assert any("Compiled" in n or "compiled" in n for n in names), sorted(names)[:40]


@pytest.mark.slow  # a process per point: `make test-slow` (CI runs it)
def test_bench_depth_measures_each_point_in_its_own_process_and_plots_it(tmp_path):
    """--depth's curves: each model at each point measured in a fresh process (finite tokens/s,
    and memory that is the training's own, not the ~300 MB of importing torch), then the PNG."""
    import matplotlib.image

    from heads_lab.bench import depth

    small = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=1, decoder_layers=1)
    result = depth.run(small, batches=(2,), lengths=(4,), steps=1, log=lambda *_: None)
    assert result["params"]["deep"] == pytest.approx(result["params"]["shallow"], rel=0.05)
    assert result["models"]["deep"]["encoder_layers"] == 4 and result["models"]["deep"]["heads"] == 1
    points = {(p["axis"], p["value"], p["model"]): p for p in result["points"]}
    assert set(points) == {(a, v, m) for a, v in (("batch", 2), ("length", 4))
                           for m in ("shallow", "deep")}
    for p in points.values():
        assert 0 < p["tokens_per_s"] < float("inf")
        # ~100 MB here (the runtime's first allocations, the same for any model); the whole
        # process's peak, torch's import in it, is above 300 MB
        assert 0 <= p["peak_mb"] < 200, p
    depth.plot(result, tmp_path / "depth.png")
    assert matplotlib.image.imread(tmp_path / "depth.png").shape[:2] == (840, 1200)


@pytest.mark.slow  # spawns a process
def test_bench_depth_names_a_point_whose_process_failed():
    from heads_lab.bench import depth
    from heads_lab.bench.measure import Workload

    broken = ModelConfig(d_model=32, heads=4, d_ff=-4, encoder_layers=1, decoder_layers=1)
    with pytest.raises(RuntimeError, match=r"the point batch=2 length=4 of 1\+1 layers × 4 heads "
                                           r"failed in its process \(exit code 1"):
        depth.measure(broken, Workload(batch=2, length=4), 1)


def test_bench_depth_refuses_a_device_or_precision_it_does_not_measure():
    from heads_lab.bench import main
    from heads_lab.errors import ConfigError

    for flags in (["--device", "cuda"], ["--precision", "bf16"]):
        with pytest.raises(ConfigError, match="--depth measures fp32 on the CPU only"):
            main(["--depth", *flags])


def test_bench_refuses_counts_it_cannot_measure_and_makes_its_files_folder(tmp_path):
    """--steps 0 (once a traceback after minutes of measuring) and an output folder that cannot
    be made are refused before anything is measured."""
    from heads_lab.bench import main
    from heads_lab.errors import ConfigError

    with pytest.raises(ConfigError, match="--steps 0: it must be >= 1"):
        main(["--quick", "--steps", "0"])
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(ConfigError, match="cannot write .*a-file/x.json: its folder"):
        main(["--quick", "--json", str(tmp_path / "a-file" / "x.json")])
    with pytest.raises(ConfigError, match="--depth measures fp32"):  # refused: nothing made
        main(["--depth", "--device", "cuda", "--json", str(tmp_path / "new" / "x.json")])
    assert not (tmp_path / "new").exists()
