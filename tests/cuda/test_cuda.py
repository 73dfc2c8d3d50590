"""heads-lab on a CUDA GPU: each test runs a path on the device and checks it against a reference
that does not share the path (fp32 against bf16, the fused SDPA kernel against the explicit
softmax, a float64 einsum on CPU, the CPU's own decoding, removal against masking, one process
against a data-parallel group, ...).

`python -m pytest -m cuda tests/cuda` on a machine with a GPU (scripts/gpu_check.py runs them
there); without one every test skips, saying why. HEADS_LAB_CUDA_TESTS_ON=cpu runs them on the
CPU instead, to check their logic where there is no GPU: each comparison is then CPU against CPU.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from heads_lab.analysis import collect_maps
from heads_lab.config.schemas import AttentionKind, ModelConfig, TrainerConfig
from heads_lab.data import Split
from heads_lab.data.tokenizer import EOS
from heads_lab.model import MultiHeadAttention, TalkingHeadsAttention, Transformer
from heads_lab.model import attention as attention_module
from heads_lab.model.decode import beam_search, greedy
from heads_lab.model.heads import gates_of, head_counts, install_gates, masked, parse_head_mask, remove_heads
from heads_lab.training import checkpoint
from heads_lab.training.captured import capture_on
from heads_lab.training.checkpoint import Checkpoints
from heads_lab.training.loop import train
from tests.conftest import TINY

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def device():
    """The GPU; with HEADS_LAB_CUDA_TESTS_ON=cpu and no GPU, the CPU (a check of the tests'
    logic: every comparison is then CPU against CPU); else every test skips."""
    if torch.cuda.is_available():
        with pytest.MonkeyPatch.context() as mp:
            # NVIDIA's PyTorch images set TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1: every fp32 cuBLAS
            # matmul in TF32, whatever allow_tf32 says. PyTorch reads it at the first matmul, which
            # comes after this (subprocesses inherit it too)
            if os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "0") != "0":
                mp.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "0")
            yield torch.device("cuda")
    elif os.environ.get("HEADS_LAB_CUDA_TESTS_ON") == "cpu":
        yield CPU
    else:
        pytest.skip("no CUDA device: these tests run on a GPU (python scripts/gpu_check.py run ...)")


@pytest.fixture
def no_tf32(device):
    """fp32 matmuls in full fp32 within the test (TF32 rounds inputs to 10 mantissa bits, ~1e-3
    relative, which no 1e-5 comparison survives); checked on a product, so that an override
    the flags cannot undo fails here, saying so."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(256, 512, generator=g), torch.randn(512, 256, generator=g)
        want = a.double() @ b.double()
        err = ((a.to(device) @ b.to(device)).cpu().double() - want).abs().max() / want.abs().max()
        if err > 1e-5:
            pytest.fail(f"fp32 matmuls on {device} round like TF32 (error {err:.1e}) with allow_tf32 "
                        "off: unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE / NVIDIA_TF32_OVERRIDE")
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float, what: str = "") -> None:
    """`got` within rtol of `want`, relative to each element and, near zero, to want's largest
    element (a sum's rounding error scales with its terms, not its result)."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    scale = max(want.abs().max().item(), 1e-30)
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * scale, msg=lambda m: f"{what}: {m}")


def _reverse_split(n: int, seed: int = 0) -> Split:
    """A learnable toy task (target = source reversed), as tests/unit/test_train.py's."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, 30, rng.integers(2, 8)).astype(np.int32) for _ in range(n)]
    tgt = [np.array(list(reversed(s)), dtype=np.int32) for s in src]
    return Split([""] * n, [""] * n, src, tgt)


def _small_model(dropout: float = 0.0, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)  # on CPU, so every device starts from the same weights
    cfg = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=1, decoder_layers=1,
                      dropout=dropout)
    return Transformer(cfg, 30)


def _padding_mask(lengths: list[int], m: int, device) -> torch.Tensor:
    """[batch, 1, 1, m], True where a key may be attended."""
    return (torch.arange(m)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :].to(device)


# --- a. bf16 autocast training --------------------------------------------------------------

def test_bf16_training_follows_the_fp32_loss_curve_on_the_device(device):
    """Same initial weights, batches and seed, in fp32 and under bf16 autocast: the loss curves
    agree within tests/unit/test_train.py's bf16 tolerance (5 % relative), bf16 did change the
    numbers (autocast was on), and the model learns."""
    split = _reverse_split(300)
    common = dict(max_steps=40, max_tokens=256, lr=3e-3, warmup_steps=10, valid_every=10,
                  log_every=10)
    curves = {}
    for precision in ("fp32", "bf16"):
        model = _small_model().to(device)  # no dropout: rounding is the only difference
        logged: list[tuple[int, float]] = []
        result = train(model, split, split, TrainerConfig(precision=precision, **common), seed=3,
                       device=device,
                       on_log=lambda s, m, logged=logged: logged.append((s, m["train/loss"]))
                       if "train/loss" in m else None)
        assert all(p.dtype == torch.float32 and p.device.type == device.type
                   for p in model.parameters())  # fp32 master weights, on the device
        curves[precision] = (result.history, logged)
    (valid32, train32), (valid16, train16) = curves["fp32"], curves["bf16"]
    assert [h["step"] for h in valid32] == [h["step"] for h in valid16] == [10, 20, 30, 40]
    for a, b in zip(valid32, valid16, strict=True):
        assert b["valid/loss"] == pytest.approx(a["valid/loss"], rel=0.05), (a, b)
    assert [s for s, _ in train32] == [s for s, _ in train16] == [10, 20, 30, 40]
    for (_, a), (_, b) in zip(train32, train16, strict=True):
        assert b == pytest.approx(a, rel=0.05), (train32, train16)
    assert [h["valid/loss"] for h in valid16] != [h["valid/loss"] for h in valid32]  # bf16 ran
    assert valid16[-1]["valid/loss"] < valid16[0]["valid/loss"] - 0.1  # it learns


@pytest.mark.slow  # compiles: on the CPU in `make test-slow`; on a GPU with every CUDA test
@pytest.mark.parametrize("update_freq", [1, 2])
def test_captured_step_follows_the_eager_step_on_the_device(device, update_freq):
    """trainer.capture (auto on CUDA, true on a CPU) with pad_multiple=8, 50 token-batched
    steps (on CUDA: cudagraph trees replaying forward, loss and backward, the fused Adam
    skipping non-finite updates on the device) trains as the eager step does, in bf16, within
    its tolerance, also accumulating two micro-batches per update (whose gradients must outlive
    the next replay); dynamo compiled a graph and, on CUDA, no part of it fell back from CUDA
    graphs."""
    from torch._dynamo.utils import counters

    split = _reverse_split(300)
    common = dict(max_steps=50, max_tokens=128, lr=3e-3, warmup_steps=10, valid_every=10,
                  log_every=10, precision="bf16", update_freq=update_freq)
    # a GPU run captures without being asked (trainer.capture=auto); a CPU run does not
    assert capture_on(TrainerConfig(), device) is (device.type == "cuda")
    runs = {}
    for capture in ("false", "auto" if device.type == "cuda" else "true"):
        torch._dynamo.reset()
        counters.clear()
        model = _small_model().to(device)
        runs[capture] = train(model, split, split,
                              TrainerConfig(capture=capture,
                                            pad_multiple=1 if capture == "false" else 8,
                                            **common), seed=3, device=device)
    assert counters["stats"]["unique_graphs"] >= 1
    assert counters["inductor"]["cudagraph_skips"] == 0
    eager, captured = runs["false"], runs["auto" if device.type == "cuda" else "true"]
    assert [h["step"] for h in captured.history] == [h["step"] for h in eager.history]
    for a, b in zip(eager.history, captured.history, strict=True):
        assert b["valid/loss"] == pytest.approx(a["valid/loss"], rel=0.05), (a, b)
    assert captured.history[-1]["valid/loss"] < captured.history[0]["valid/loss"] - 0.1


# --- b. fused SDPA against the explicit path --------------------------------------------------

# (kv_heads of 8 query heads, relative-position clip K, mask lengths or None, causal, cross)
SDPA_CASES = {
    "padded": (8, 0, [9, 5, 2], False, False),
    "causal": (8, 0, None, True, False),
    "grouped-padded": (2, 0, [9, 5, 2], False, False),
    "grouped-causal": (2, 0, None, True, False),
    "multi-query-padded": (1, 0, [9, 9, 4], False, False),
    "relative-padded": (8, 3, [9, 5, 2], False, False),
    "relative-causal": (8, 3, None, True, False),
    "relative-grouped-padded-causal": (4, 3, [9, 6, 3], True, False),
    "cross-padded": (8, 0, [11, 4, 7], False, True),
    "grouped-cross-padded": (2, 0, [11, 4, 7], False, True),
}


def _run_attention(module, x, memory, mask, causal, need_weights, grad_out):
    """Output and gradients (input, memory, every parameter) of one forward and backward."""
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    memory = memory.detach().clone().requires_grad_(True) if memory is not None else None
    y, weights = module(x, memory, mask=mask, causal=causal, need_weights=need_weights)
    y.backward(grad_out)
    grads = {"input": x.grad, **({"memory": memory.grad} if memory is not None else {}),
             **{name: p.grad for name, p in module.named_parameters()}}
    return y.detach(), weights, grads


@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_fused_sdpa_equals_the_explicit_attention_path_in_fp32(case, device, no_tf32, monkeypatch):
    """MultiHeadAttention with need_weights=False (F.scaled_dot_product_attention: on CUDA the
    fused kernel) against need_weights=True (matmul, masked softmax, matmul), attention dropout
    0, fp32: outputs and every gradient within 1e-5 relative."""
    kv_heads, relative, lengths, causal, cross = SDPA_CASES[case]
    q_in = torch.zeros(1, 1, 1, 8, device=device)
    if device.type == "cuda":
        assert not attention_module.bmm_is_faster(q_in, q_in)  # the SDPA branch runs as is
    else:  # the CPU takes its own bmm path at these lengths: send it through SDPA, as CUDA does
        monkeypatch.setattr(attention_module, "bmm_is_faster", lambda q, k: False)
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(kwargs.get("is_causal"))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)

    torch.manual_seed(0)
    module = MultiHeadAttention(64, 8, 8, dropout=0.0, kv_heads=kv_heads, relative=relative)
    if relative:
        with torch.no_grad():
            module.position_bias.normal_()  # it starts at zero: make it matter
    module = module.to(device).train()  # train mode: p = attention dropout = 0
    x = torch.randn(3, 9, 64)
    memory = torch.randn(3, 11, 64) if cross else None
    keys = 11 if cross else 9
    mask = _padding_mask(lengths, keys, device) if lengths else None
    grad_out = torch.randn(3, 9, 64)
    x, grad_out = x.to(device), grad_out.to(device)
    memory = memory.to(device) if memory is not None else None

    y_fused, w_fused, g_fused = _run_attention(module, x, memory, mask, causal, False, grad_out)
    assert len(calls) == 1 and w_fused is None  # the SDPA call, no weights
    y_ref, w_ref, g_ref = _run_attention(module, x, memory, mask, causal, True, grad_out)
    assert len(calls) == 1 and w_ref.shape == (3, 8, 9, keys)  # the explicit path
    assert y_fused.device.type == device.type
    _close(y_fused, y_ref, 1e-5, "output")
    assert g_fused.keys() == g_ref.keys()
    for name in g_ref:
        _close(g_fused[name], g_ref[name], 1e-5, f"gradient of {name}")
    if mask is not None:  # the explicit path's weights: none on padded keys
        assert torch.all(w_ref.masked_select(~mask.expand_as(w_ref)) == 0)


# --- c. talking heads against a float64 reference ------------------------------------------

# (heads_k, heads, heads_v) per mixes: "both" with three different counts (rectangular mixes)
TALKING = {"both": (4, 6, 3), "logits": (4, 6, 6), "weights": (6, 6, 3)}
TALKING_CASES = {"padded": ([9, 5, 2], False, False), "causal": (None, True, False),
                 "cross-padded": ([11, 4, 7], False, True)}


def _talking_heads_reference(module, x, memory, mask, causal) -> tuple[torch.Tensor, torch.Tensor]:
    """TalkingHeadsAttention's docstring formulas as float64 einsums on CPU, on the module's
    weights: J = Q·K/√d_k, L = J·P_l (+ relative bias), W = softmax(L), U = W·P_w, O = U·V,
    Y = O·P_o; a mix left out is the identity. Returns (Y, W)."""
    w = {name: p.detach().double().cpu() for name, p in module.state_dict().items()}
    x = x.double().cpu()
    src = x if memory is None else memory.double().cpu()
    d, hk, h, hv = module.head_dim, module.q_heads, module.heads, module.v_heads
    b, n, m = x.shape[0], x.shape[1], src.shape[1]
    w_in, b_in = w["in_proj.weight"], w["in_proj.bias"]
    q = (x @ w_in[: hk * d].T + b_in[: hk * d]).view(b, n, hk, d)
    k = (src @ w_in[hk * d : 2 * hk * d].T + b_in[hk * d : 2 * hk * d]).view(b, m, hk, d)
    v = (src @ w_in[2 * hk * d :].T + b_in[2 * hk * d :]).view(b, m, hv, d)
    j = torch.einsum("bnkd,bmkd->bknm", q, k) / math.sqrt(d)
    p_l = w.get("logits_mix", torch.eye(hk, h, dtype=torch.float64))
    logits = torch.einsum("bknm,kh->bhnm", j, p_l)
    if "position_bias" in w:
        K = module.relative
        offsets = (torch.arange(m)[None, :] - torch.arange(n)[:, None]).clamp(-K, K) + K
        logits = logits + w["position_bias"][:, offsets][None]
    allowed = torch.ones(b, 1, n, m, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask.cpu()
    if causal:
        allowed = allowed & torch.ones(n, m, dtype=torch.bool).tril()
    weights = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
    p_w = w.get("weights_mix", torch.eye(h, hv, dtype=torch.float64))
    mixed = torch.einsum("bhnm,hv->bvnm", weights, p_w)
    o = torch.einsum("bvnm,bmvd->bnvd", mixed, v).reshape(b, n, hv * d)
    return o @ w["out_proj.weight"].T + w["out_proj.bias"], weights


@pytest.mark.parametrize("case", list(TALKING_CASES))
@pytest.mark.parametrize("mixes", list(TALKING))
def test_talking_heads_on_the_device_equal_a_float64_reference(mixes, case, device, no_tf32):
    lengths, causal, cross = TALKING_CASES[case]
    heads_k, heads, heads_v = TALKING[mixes]
    torch.manual_seed(1)
    module = TalkingHeadsAttention(48, heads, 8, dropout=0.0, heads_k=heads_k, heads_v=heads_v,
                                   relative=0 if cross else 3, mixes=mixes)
    with torch.no_grad():  # away from any identity start, relative biases non-zero
        for p in module.mix_parameters():
            p.add_(0.3 * torch.randn_like(p))
        if module.position_bias is not None:
            module.position_bias.normal_()
    assert len(module.mix_parameters()) == (2 if mixes == "both" else 1)
    x = torch.randn(3, 9, 48)
    memory = torch.randn(3, 11, 48) if cross else None
    keys = 11 if cross else 9
    mask = _padding_mask(lengths, keys, CPU) if lengths else None
    y_ref, w_ref = _talking_heads_reference(module, x, memory, mask, causal)

    module = module.to(device).eval()
    with torch.no_grad():
        y, weights = module(x.to(device), memory.to(device) if cross else None,
                            mask=mask.to(device) if mask is not None else None, causal=causal,
                            need_weights=True)
    assert y.device.type == device.type and y.dtype == torch.float32
    assert weights.shape == (3, heads, 9, keys)
    _close(y, y_ref, 1e-5, "output")
    _close(weights, w_ref, 1e-5, "softmax weights")


@pytest.mark.parametrize("case", list(TALKING_CASES))
@pytest.mark.parametrize("mixes", list(TALKING))
def test_folded_talking_heads_on_the_device_equal_a_float64_reference(mixes, case, device,
                                                                     no_tf32, monkeypatch):
    """The fused path (the logits mix folded into the queries, one multi-query SDPA over all
    value heads: model.kernels.folded_talking_heads), forced on, against the same float64
    reference; and in bf16 autocast within bf16's rounding."""
    from heads_lab.model import kernels

    monkeypatch.setattr(kernels, "TALKING_HEADS_PATH", "folded")
    lengths, causal, cross = TALKING_CASES[case]
    heads_k, heads, heads_v = TALKING[mixes]
    torch.manual_seed(1)
    module = TalkingHeadsAttention(48, heads, 8, dropout=0.0, heads_k=heads_k, heads_v=heads_v,
                                   relative=0 if cross else 3, mixes=mixes)
    with torch.no_grad():
        for p in module.mix_parameters():
            p.add_(0.3 * torch.randn_like(p))
        if module.position_bias is not None:
            module.position_bias.normal_()
    x = torch.randn(3, 9, 48)
    memory = torch.randn(3, 11, 48) if cross else None
    mask = _padding_mask(lengths, 11 if cross else 9, CPU) if lengths else None
    y_ref, _ = _talking_heads_reference(module, x, memory, mask, causal)
    module = module.to(device).eval()
    args = (x.to(device), memory.to(device) if cross else None)
    kwargs = dict(mask=mask.to(device) if mask is not None else None, causal=causal)
    with torch.no_grad():
        y, weights = module(*args, **kwargs)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            y_bf16, _ = module(*args, **kwargs)
    assert weights is None and y.dtype == torch.float32
    _close(y, y_ref, 1e-5, "folded output")
    _close(y_bf16.float(), y_ref, 3e-2, "folded output in bf16")


# --- d. decoding ------------------------------------------------------------------------------

DECODES = [("greedy", 1, 0.0), ("beam", 2, 0.6), ("beam", 4, 1.0), ("beam", 5, 0.0)]


def _decoder_model() -> Transformer:
    """A random model whose decisions are clear. Decoding compares scores, so a near-tie (two
    candidates within float rounding) could flip between devices: for this seed (embeddings × 2,
    EOS's × 2.5 more, so outputs end at several lengths) every output stays the same with the
    weights in float64 or perturbed by 3e-4 relative (~100× the fp32 rounding of a GPU against a
    CPU), which the test checks again at 1e-4. Its beams change places (reorder_cache matters:
    without it two of the three beam searches here decode differently)."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0)
    model = Transformer(cfg, 30).eval()
    with torch.no_grad():
        model.embed.weight.mul_(2.0)
        model.embed.weight[EOS].mul_(2.5)
    return model


def _decoder_src() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 30, (6, 7), generator=g)
    src[:, -1] = EOS
    src[2, 4:] = 0  # a padded row
    src[2, 3] = EOS
    return src


def _decode_all(model, src, use_cache: bool = True) -> list[list[list[int]]]:
    return [greedy(model, src, 12, use_cache=use_cache) if kind == "greedy"
            else beam_search(model, src, beam, lenpen, 12, use_cache=use_cache)
            for kind, beam, lenpen in DECODES]


def test_decoding_on_the_device_cached_uncached_and_as_on_the_cpu(device, no_tf32):
    model, src = _decoder_model(), _decoder_src()
    on_cpu = _decode_all(model, src)
    assert len({len(out) for outs in on_cpu for out in outs}) >= 3  # EOS at several lengths
    for seed in (100, 101):  # the reference has no near-tie: small perturbations change nothing
        perturbed = copy.deepcopy(model)
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in perturbed.parameters():
                p.mul_(1 + 1e-4 * torch.randn_like(p))
        assert _decode_all(perturbed, src) == on_cpu, "near-tie in the reference: pick another seed"

    on_device = copy.deepcopy(model).to(device)
    src_device = src.to(device)
    cached = _decode_all(on_device, src_device, use_cache=True)
    uncached = _decode_all(on_device, src_device, use_cache=False)
    for (kind, beam, lenpen), a, b, c in zip(DECODES, cached, uncached, on_cpu, strict=True):
        assert a == b, f"{kind} {beam} {lenpen}: cached != uncached on {device}"
        assert a == c, f"{kind} {beam} {lenpen}: {device} != cpu"


# --- e. head masks, removal and Hard Concrete gates ---------------------------------------

VOCAB = 40


def _heads_model() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=2, decoder_layers=2,
                      dropout=0.0, relative_positions=2)
    model = Transformer(cfg, VOCAB).eval()
    with torch.no_grad():  # relative-position biases go with their heads: make them matter
        for name, p in model.named_parameters():
            if name.endswith("position_bias"):
                p.normal_()
    return model


def _heads_batch(device):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (3, 7), generator=g)
    src[0, -2:] = 0  # padding
    return src.to(device), torch.randint(4, VOCAB, (3, 6), generator=g).to(device)


def test_masked_heads_equal_removed_heads_and_gates_on_the_device(device, tiny_run, no_tf32):
    model = _heads_model().to(device)
    src, tgt = _heads_batch(device)
    heads = parse_head_mask("enc:0:1,enc:1:*,dec:1:0,dec:1:3,dec-enc:0:2", head_counts(model))
    removed = copy.deepcopy(model)
    remove_heads(removed, heads)
    assert all(p.device.type == device.type for p in removed.parameters())
    with torch.no_grad():
        with masked(model, heads):
            want = model(src, tgt)
        got, full = removed(src, tgt), model(src, tgt)
    _close(got, want, 1e-5, "removed vs masked")
    assert not torch.allclose(full, want, atol=1e-4)  # the mask changed the function

    # Hard Concrete gates: closed heads (log α = -6: ẑ = 0) and open ones (+6: ẑ clamps to 1)
    plain = copy.deepcopy(model)
    gates = install_gates(model, tiny_run.prune)
    assert gates_of(model) is gates
    assert all(p.device.type == device.type for p in gates.parameters())
    closed = {("enc-self", 1): [0, 2], ("dec-self", 0): [1], ("dec-enc", 1): [3]}
    with torch.no_grad():
        for site, layer in gates.keys:
            p = gates.log_alpha[f"{site}_{layer}"]
            p.fill_(6.0)
            p[closed.get((site, layer), [])] = -6.0
    assert {k: v for k, v in gates.closed().items() if v} == closed
    with torch.no_grad():
        gated = model(src, tgt)  # eval mode: the test-time gates
    remove_heads(plain, closed)
    with torch.no_grad():
        _close(plain(src, tgt), gated, 1e-5, "gated vs removed")

    model.train()  # train mode: gates sampled on the device, and log α learns
    with torch.no_grad():
        for p in gates.log_alpha.values():
            p.zero_()
    logits = model(src, tgt)
    loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten()) + gates.loss()
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in gates.log_alpha.values()])
    assert grads.device.type == device.type and torch.isfinite(grads).all() and grads.abs().sum() > 0


# --- f. checkpoints across devices ---------------------------------------------------------

def _fit(device, steps: int, run_dir: Path):
    """A small run to `steps` with checkpoints in run_dir (resumed from there when it holds
    one): the model and the TrainResult."""
    model = _small_model().to(device)
    cfg = TrainerConfig(max_steps=steps, max_tokens=256, lr=3e-3, warmup_steps=4, valid_every=4,
                        log_every=4, save_every=4, keep_last=2)
    config = {"seed": 0, "trainer": {"device": device.type}}  # trainer.device may change
    result = train(model, _reverse_split(200), _reverse_split(40, seed=1), cfg, seed=0,
                   device=device, checkpoints=Checkpoints(run_dir, cfg, config))
    return model, result


@pytest.mark.parametrize("direction", ["device-to-cpu", "cpu-to-device"])
def test_a_checkpoint_written_on_one_device_resumes_on_the_other(direction, device, tmp_path,
                                                                  no_tf32):
    first, second = (device, CPU) if direction == "device-to-cpu" else (CPU, device)
    before, _ = _fit(first, 8, tmp_path / "run")
    state = checkpoint.load(tmp_path / "run" / "checkpoints" / "step_0000008.pt")
    tensors = [*state["model"].values(),
               *(t for s in state["optimizer"]["state"].values() for t in s.values()
                 if isinstance(t, torch.Tensor))]
    assert tensors and all(t.device.type == "cpu" for t in tensors)  # map_location="cpu"
    loaded = _small_model(seed=7).to(second)
    loaded.load_state_dict(state["model"])
    for (name, a), b in zip(before.state_dict().items(), loaded.state_dict().values()):
        assert b.device.type == second.type and torch.equal(a.cpu(), b.cpu()), name

    _, resumed = _fit(second, 16, tmp_path / "run")
    _, whole = _fit(second, 16, tmp_path / "whole")  # uninterrupted, on the second device
    assert (resumed.resumed_from, resumed.steps) == (8, 16) and whole.resumed_from is None
    assert [h["step"] for h in resumed.history] == [h["step"] for h in whole.history] == \
        [4, 8, 12, 16]  # steps 4 and 8 from the checkpoint's history, 12 and 16 resumed
    # one device throughout resumes exactly; across devices fp32 rounding differs in the last bits
    rel = 0 if first.type == second.type else 1e-3
    for a, b in zip(resumed.history, whole.history, strict=True):
        assert a["valid/loss"] == pytest.approx(b["valid/loss"], rel=rel), (a, b)
    assert resumed.train_loss == pytest.approx(whole.train_loss, rel=rel)
    assert resumed.tokens == whole.tokens


# --- g and i. heads-lab train on the device (CLI) ---------------------------------------------

def _env(**extra: str) -> dict[str, str]:
    """The test's environment for a heads-lab subprocess: this checkout importable, no torchrun
    variables unless given."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return {**env, **extra}


def _cli_args(device, run_dir: Path) -> list[str]:
    return ["train", *TINY, f"trainer.device={device.type}", "trainer.precision=fp32",
            f"hydra.run.dir={run_dir}"]


def _check(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]


@pytest.fixture(scope="module")
def device_run(device, tmp_path_factory) -> dict:
    """results.json of a tiny `heads-lab train` on the device, one process."""
    cwd = tmp_path_factory.mktemp("device-run")
    proc = subprocess.run([sys.executable, "-m", "heads_lab", *_cli_args(device, cwd / "run")],
                          cwd=cwd, capture_output=True, text=True, timeout=300, env=_env())
    _check(proc)
    return json.loads((cwd / "run" / "results.json").read_text())


def test_train_on_the_device_reports_peak_memory_and_mfu(device, device_run):
    results, metrics = device_run, device_run["metrics"]
    assert results["status"] == "complete" and results["device"].startswith(device.type)
    assert results["train"]["steps"] == 30 and results["train"]["data_parallel"] == 1
    # the step captured without being asked on a GPU (trainer.capture=auto), eager on a CPU
    assert results["train"]["captured"] is (device.type == "cuda")
    assert math.isfinite(metrics["valid/loss"]) and math.isfinite(metrics["test/bleu"])
    assert metrics["cost/peak_mem_mb"] > 0
    if device.type == "cuda":
        assert 0 < metrics["cost/mfu"] <= 1, metrics["cost/mfu"]
    else:  # no MFU on CPU (or, if one is reported, a number)
        assert isinstance(metrics.get("cost/mfu", 0.0), float)


# heads-lab starts a process group only for WORLD_SIZE > 1 (parallel.from_env), and one GPU
# takes one NCCL rank; so the CLI runs with torchrun's variables for two ranks, and this wrapper
# lets the group heads-lab starts (with the backend it picks) have one rank: the data-parallel
# path (the start-time broadcast, DDP with device_ids, the trainer's all-reduces, barriers) on
# a one-rank group, its backend written to $HEADS_LAB_TEST_BACKEND.
ONE_RANK = '''
import os, sys
from pathlib import Path
import torch.distributed as dist
real_init = dist.init_process_group
def one_rank_group(backend=None, **kwargs):
    real_init(backend, rank=0, world_size=1, **kwargs)
    Path(os.environ["HEADS_LAB_TEST_BACKEND"]).write_text(dist.get_backend())
dist.init_process_group = one_rank_group
from heads_lab.commands.cli import main
raise SystemExit(main(sys.argv[1:]))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_data_parallel_train_on_a_one_rank_nccl_group_matches_one_process(device, device_run,
                                                                            tmp_path):
    wrapper, backend = tmp_path / "one_rank.py", tmp_path / "backend.txt"
    wrapper.write_text(ONE_RANK)
    for _ in range(2):  # a port taken between the pick and the bind: try again
        env = _env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(_free_port()), HEADS_LAB_TEST_BACKEND=str(backend))
        proc = subprocess.run([sys.executable, str(wrapper), *_cli_args(device, tmp_path / "run")],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
        if proc.returncode == 0 or "EADDRINUSE" not in proc.stderr + proc.stdout and \
                "Address already in use" not in proc.stderr + proc.stdout:
            break
    _check(proc)
    used = backend.read_text()  # "nccl", or per device, e.g. "cpu:gloo,cuda:nccl"
    assert "nccl" in used if device.type == "cuda" else used == "gloo", used
    ddp = json.loads((tmp_path / "run" / "results.json").read_text())
    one = device_run
    assert ddp["status"] == "complete" and ddp["device"].startswith(device.type)
    assert ddp["train"]["data_parallel"] == 1 and ddp["train"]["steps"] == one["train"]["steps"]
    assert ddp["train"]["tokens"] == one["train"]["tokens"]  # the same batches
    # DDP over one rank averages each gradient with itself: one process's numbers, within the
    # tolerance of tests/integration/test_parallel.py
    for a, b in zip(ddp["train"]["valid_history"], one["train"]["valid_history"], strict=True):
        assert a["step"] == b["step"]
        assert a["valid/loss"] == pytest.approx(b["valid/loss"], rel=1e-4)
    assert ddp["metrics"]["train/loss"] == pytest.approx(one["metrics"]["train/loss"], rel=1e-4)


# --- h. attention maps on the device ---------------------------------------------------------

@pytest.mark.parametrize("attention", ["mha", "talking_heads"])
def test_maps_recorded_on_the_device_equal_the_cpus(attention, device, caplog, no_tf32):
    torch.manual_seed(2)
    kw = {"attention": AttentionKind.talking_heads, "heads_k": 2, "heads_v": 6} \
        if attention == "talking_heads" else {"kv_heads": 2}
    cfg = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=2, decoder_layers=2,
                      dropout=0.0, relative_positions=2, **kw)
    model = Transformer(cfg, VOCAB).eval()
    with torch.no_grad():  # relative-position biases start at zero: make them matter
        for name, p in model.named_parameters():
            if name.endswith("position_bias"):
                p.normal_()
    rng = np.random.default_rng(3)
    src = [rng.integers(4, VOCAB, n).tolist() for n in (5, 9, 3, 7, 6)]
    tgt = [rng.integers(4, VOCAB, n).tolist() for n in (6, 4, 8, 5, 7)]
    split = Split(None, None, src, tgt)
    on_cpu = collect_maps(model, split, None, CPU, batch_size=2)
    with caplog.at_level(logging.INFO, logger="heads_lab.analysis.maps"):
        on_device = collect_maps(copy.deepcopy(model).to(device), split, None, device,
                                 batch_size=2)
    said = "maps recorded through the explicit attention path" in caplog.text
    assert said == (device.type == "cuda"), caplog.text
    assert len(on_device) == len(on_cpu) == 5
    for i, (a, b) in enumerate(zip(on_device, on_cpu)):
        assert (a.src, a.tgt_in) == (b.src, b.tgt_in)
        assert a.maps.keys() == b.maps.keys() == {"enc-self", "dec-self", "dec-enc"}
        for site in b.maps:
            assert a.maps[site].shape == b.maps[site].shape
            np.testing.assert_allclose(a.maps[site], b.maps[site], rtol=0, atol=1e-5,
                                       err_msg=f"sentence {i} {site}")
        rows = b.maps["dec-self"].sum(-1)  # each query's weights sum to one over its keys
        np.testing.assert_allclose(rows, np.ones_like(rows), atol=1e-5)
