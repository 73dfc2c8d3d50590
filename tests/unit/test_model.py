"""The Transformer: masking, causality, cached decoding, the loss, per-head weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from heads_lab.config.schemas import ModelConfig, Norm
from heads_lab.model import Transformer, label_smoothed_loss, output_loss
from heads_lab.model.heads import recording

V = 40


def _model(norm: Norm = Norm.pre, heads: int = 4) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, heads=heads, d_ff=64, encoder_layers=2, decoder_layers=2,
                      dropout=0.0, norm=norm)
    return Transformer(cfg, V).double().eval()


@pytest.mark.parametrize("norm", [Norm.pre, Norm.post])
def test_padding_does_not_change_outputs(norm):
    model = _model(norm)
    src = torch.randint(4, V, (1, 6))
    tgt = torch.randint(4, V, (1, 5))
    padded_src = torch.cat([src, torch.zeros(1, 4, dtype=torch.long)], 1)
    padded_tgt = torch.cat([tgt, torch.zeros(1, 3, dtype=torch.long)], 1)
    torch.testing.assert_close(model(padded_src, padded_tgt)[:, :5], model(src, tgt))


def test_decoder_is_causal():
    model = _model()
    src = torch.randint(4, V, (2, 6))
    tgt = torch.randint(4, V, (2, 7))
    changed = tgt.clone()
    changed[:, 4:] = torch.randint(4, V, (2, 3))
    torch.testing.assert_close(model(src, tgt)[:, :4], model(src, changed)[:, :4])
    assert not torch.allclose(model(src, tgt)[:, 4:], model(src, changed)[:, 4:])


def test_cached_incremental_decoding_equals_full_forward():
    model = _model()
    src = torch.randint(4, V, (3, 6))
    src[1, 4:] = 0  # padding in the source
    tgt = torch.randint(4, V, (3, 7))
    full = model(src, tgt)
    enc, caches = model.encode(src), model.new_caches()
    steps = [model.logits(model.decode(tgt[:, t : t + 1], enc, caches=caches, offset=t))
             for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full)


def test_decoding_logits_equal_the_output_layer():
    """The decoder's output layer (oneDNN-packed weight on CPU in fp32) against a float64
    product; a float64 model and autocast keep `logits` itself."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=1, decoder_layers=1)
    model = Transformer(cfg, 300).eval()
    hidden = torch.randn(70, 32)
    with torch.no_grad():
        layer = model.decoding_logits()
        if torch.backends.mkldnn.is_available():  # the packed path is the one taken
            assert getattr(layer, "__func__", None) is not Transformer.logits
        got = layer(hidden)
        reference = hidden.double() @ model.embed.weight.double().t()
        torch.testing.assert_close(got.double(), reference, rtol=1e-5, atol=1e-5)
        assert got.dtype == torch.float32 and got.shape == (70, 300)
        with torch.autocast("cpu", torch.bfloat16):
            in_bf16 = model.decoding_logits()(hidden)
            assert in_bf16.dtype == torch.bfloat16 and torch.equal(in_bf16, model.logits(hidden))
        wide = _model()
        h64 = torch.randn(5, 32, dtype=torch.float64)
        assert torch.equal(wide.decoding_logits()(h64), wide.logits(h64))


def test_label_smoothed_loss_matches_torch_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(50, V, dtype=torch.float64)
    target = torch.randint(0, V, (50,))
    loss, nll = label_smoothed_loss(logits, target, 0.1)
    torch.testing.assert_close(loss, F.cross_entropy(logits, target, label_smoothing=0.1,
                                                     reduction="sum"))
    torch.testing.assert_close(nll, F.cross_entropy(logits, target, reduction="sum"))


@pytest.mark.parametrize("use", ["loss", "nll", "both"])
def test_label_smoothed_loss_gradient_matches_autograd_in_float64(use):
    """The hand-written backward against autograd through torch's own cross entropy."""
    torch.manual_seed(1)
    logits = torch.randn(40, V, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, V, (40,))
    target[:5] = target[5]  # repeated targets: the scatter must add, not overwrite
    w_loss, w_nll = {"loss": (0.7, 0.0), "nll": (0.0, 1.3), "both": (0.7, 1.3)}[use]

    def total(loss, nll):
        return (w_loss * loss if w_loss else 0) + (w_nll * nll if w_nll else 0)

    ours = torch.autograd.grad(total(*label_smoothed_loss(logits, target, 0.1)), logits)[0]
    ref = torch.autograd.grad(total(
        F.cross_entropy(logits, target, label_smoothing=0.1, reduction="sum"),
        F.cross_entropy(logits, target, reduction="sum")), logits)[0]
    torch.testing.assert_close(ours, ref)


def test_label_smoothed_loss_keeps_the_logits_dtype_for_the_gradient():
    torch.manual_seed(2)
    logits = torch.randn(8, V, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, V, (8,))
    loss, _ = label_smoothed_loss(logits, target, 0.1)
    assert loss.dtype == torch.float32  # computed in fp32 from bf16 logits
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16
    up = logits.detach().float().requires_grad_()
    F.cross_entropy(up, target, label_smoothing=0.1, reduction="sum").backward()
    torch.testing.assert_close(logits.grad.float(), up.grad, atol=1e-2, rtol=1e-2)


def test_recorded_attention_weights_per_head_are_distributions():
    model = _model(heads=4)
    src = torch.randint(4, V, (2, 6))
    src[0, 3:] = 0
    tgt = torch.randint(4, V, (2, 5))
    with recording(model) as maps:
        enc = model.encode(src, need_weights=True)
        model.decode(tgt, enc, need_weights=True)
        model.decode(tgt, enc)  # a call without need_weights keeps the maps recorded
    assert not any(m._forward_hooks for m in model.modules())  # the hooks left with the block
    weights: dict[str, list] = {}
    for (site, _), w in maps.items():
        weights.setdefault(site, []).append(w)
    assert set(weights) == {"enc-self", "dec-self", "dec-enc"}
    for per_layer in weights.values():
        assert len(per_layer) == 2
        for w in per_layer:
            assert w.shape[:2] == (2, 4)
            torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    assert torch.all(weights["dec-enc"][0][0, :, :, 3:] == 0)  # padded source keys
    assert torch.all(weights["dec-self"][1][:, :, 0, 1:] == 0)  # no peeking at the future


def test_tied_output_projection_and_zero_pad_embedding():
    model = _model()
    logits = model.logits(torch.ones(1, 32, dtype=torch.float64))
    torch.testing.assert_close(logits[0], model.embed.weight.sum(-1))
    assert torch.all(Transformer(ModelConfig(d_model=16, heads=2), 30).embed.weight[0] == 0)


@pytest.mark.parametrize("chunk", [1, 7, 40, 1000])  # chunks of one row, ragged, exact, one
def test_fused_output_loss_matches_logits_then_cross_entropy_in_float64(chunk):
    torch.manual_seed(3)
    hidden = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, 16, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, V, (40,))
    loss, nll = output_loss(hidden, weight, target, 0.1, chunk=chunk)
    (0.3 * loss).backward()
    ref_h = hidden.detach().clone().requires_grad_()
    ref_w = weight.detach().clone().requires_grad_()
    logits = ref_h @ ref_w.t()
    ref = F.cross_entropy(logits, target, label_smoothing=0.1, reduction="sum")
    (0.3 * ref).backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, F.cross_entropy(logits, target, reduction="sum"))
    torch.testing.assert_close(hidden.grad, ref_h.grad)
    torch.testing.assert_close(weight.grad, ref_w.grad)
    assert not nll.requires_grad


def test_model_loss_trains_through_the_fused_path_like_the_plain_one_under_bf16():
    """Model.loss (fused, chunked) against logits + label_smoothed_loss, fp32 and bf16."""
    from heads_lab.training.device import autocast

    torch.manual_seed(4)
    model = _model(heads=4).float()
    src, tgt = torch.randint(4, V, (3, 6)), torch.randint(4, V, (3, 5))
    target = torch.randint(4, V, (15,))
    for precision, tol in (("fp32", 1e-5), ("bf16", 3e-2)):
        grads = []
        for fused in (True, False):
            model.zero_grad()
            with autocast(torch.device("cpu"), precision):
                hidden = model.decode(tgt, model.encode(src)).reshape(15, -1)
                loss, _ = (model.loss(hidden, target, 0.1) if fused else
                           label_smoothed_loss(model.logits(hidden), target, 0.1))
            loss.backward()
            grads.append(torch.cat([p.grad.flatten().float() for p in model.parameters()]))
            assert loss.dtype == torch.float32
        torch.testing.assert_close(grads[0], grads[1], atol=tol, rtol=tol)
