"""Layer-wise relevance propagation per head (heads_lab.analysis.lrp): the step-by-step forward
is the model's, relevance is conserved layer by layer, LRP-0 equals gradient × input where the
network is linear, and a logit that depends on one head gives that head all of its layer's
relevance."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from heads_lab.analysis import lrp
from heads_lab.config.compose import to_object
from heads_lab.data import Split
from heads_lab.model import Transformer
from heads_lab.model.heads import attention_modules
from tests.conftest import TINY, compose

VARIANTS = {
    "mha pre-norm": [],
    "mha post-norm": ["model.norm=post"],
    "admin": ["model.norm=post", "model.init=admin"],
    "gelu": ["model.activation=gelu"],
    "grouped-query": ["model.kv_heads=2"],
    "relative positions": ["model.relative_positions=4"],
    "talking heads": ["model.attention=talking_heads", "model.heads_k=2", "model.heads=8",
                      "model.heads_v=4"],
}
SRC = torch.tensor([[5, 9, 12, 7, 30, 3]])  # ends with EOS
TGT = torch.tensor([[2, 8, 6, 11, 21]])  # BOS + tokens


def _model(extra: list[str], seed: int = 0) -> Transformer:
    run = to_object(compose([*TINY, "model.encoder_layers=2", "model.decoder_layers=2", *extra]))
    torch.manual_seed(seed)
    model = Transformer(run.model, 40).double().eval()
    with torch.no_grad():  # biases and LayerNorm gains away from their 0 / 1 start
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("extra", VARIANTS.values(), ids=VARIANTS.keys())
def test_the_relevance_forward_is_the_model_and_relevance_is_conserved(extra):
    model = _model(extra)
    logits, _ = lrp.forward(model, SRC, TGT)
    reference = model.logits(model.decode(TGT, model.encode(SRC)))
    torch.testing.assert_close(logits, reference, rtol=0, atol=1e-12)
    rel = lrp.relevance(model, SRC, TGT, eps=0.0)  # the raw rule
    # one seed per target position: its top-1 logit
    torch.testing.assert_close(rel.seeds, reference[0].max(-1).values.detach(), rtol=0, atol=1e-12)
    # per seed, the total at every layer boundary is the seed (biases spread, never absorbed)
    assert len(rel.totals) == 2 + 2 + 1 + 2
    for total in rel.totals:
        torch.testing.assert_close(total, rel.seeds, rtol=1e-5, atol=1e-5)
    # and what reaches the inputs adds up to it too
    torch.testing.assert_close(rel.src_input.sum((1, 2)) + rel.tgt_input.sum((1, 2)), rel.seeds,
                               rtol=1e-5, atol=1e-5)
    modules = attention_modules(model)
    for key, heads in rel.heads.items():
        assert heads.shape == (TGT.shape[1], modules[key].out_heads)


def test_lrp0_equals_gradient_times_input_where_the_network_is_linear():
    # zero biases and LayerNorm shifts, ReLU, the softmax and LayerNorm σ held constant: the
    # network is linear and homogeneous in its inputs, so LRP-0 = gradient × input
    model = _model([])
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear | nn.LayerNorm) and module.bias is not None:
                module.bias.zero_()
    rel = lrp.relevance(model, SRC, TGT, eps=0.0)
    logits, tape = lrp.forward(model, SRC, TGT, frozen=True)
    top = logits[0].argmax(-1)
    for t in range(TGT.shape[1]):
        g_src, g_tgt = torch.autograd.grad(logits[0, t, top[t]], [tape["x_src"], tape["y_tgt"]],
                                           retain_graph=True)
        torch.testing.assert_close(rel.src_input[t], (tape["x_src"] * g_src)[0].detach(),
                                   rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(rel.tgt_input[t], (tape["y_tgt"] * g_tgt)[0].detach(),
                                   rtol=1e-8, atol=1e-10)
    # with biases the two differ: LRP spreads the biases' share, gradient × input drops it
    biased = _model([])
    rel = lrp.relevance(biased, SRC, TGT, eps=0.0)
    logits, tape = lrp.forward(biased, SRC, TGT, frozen=True)
    g = torch.autograd.grad(logits[0, 0].max(), tape["x_src"])[0]
    assert not torch.allclose(rel.src_input[0], (tape["x_src"] * g)[0].detach(), atol=1e-6)


@pytest.mark.parametrize("extra", [VARIANTS["mha pre-norm"], VARIANTS["talking heads"]],
                         ids=["mha", "talking heads"])
def test_a_logit_that_depends_on_one_head_gives_that_head_relevance_one(extra):
    model = _model(extra, seed=3)
    modules = attention_modules(model)
    chosen = {("enc-self", 1): 2, ("dec-enc", 0): 1, ("dec-self", 1): 3}
    with torch.no_grad():  # every other head of these layers writes nothing into the stream
        for key, head in chosen.items():
            m = modules[key]
            keep = torch.zeros(m.out_heads * m.head_dim, dtype=torch.bool)
            keep[head * m.head_dim:(head + 1) * m.head_dim] = True
            m.out_proj.weight[:, ~keep] = 0.0  # its bias left in: its share goes to that head
    rel = lrp.relevance(model, SRC, TGT, eps=0.0)
    for key, head in chosen.items():  # per target token, all of the layer's |relevance|
        r = rel.heads[key]
        share = r.abs() / r.abs().sum(-1, keepdim=True)
        torch.testing.assert_close(share[:, head], torch.ones(len(r), dtype=r.dtype))
    ids = [list(SRC[0, :-1]), [7, 4, 9]]
    split = Split(None, None, ids, [list(TGT[0, 1:]), [5, 6]])
    shares = lrp.head_relevance(model, split, None, torch.device("cpu"), eps=0.0)
    for key, head in chosen.items():  # averaged over both sentences' target tokens
        expected = np.zeros(modules[key].out_heads)
        expected[head] = 1.0
        np.testing.assert_allclose(shares[key], expected, atol=1e-12)
    # the other layers spread their relevance over several heads
    free = shares[("enc-self", 0)]
    assert (np.abs(free) > 0.01).sum() > 1 and np.abs(free).sum() == pytest.approx(1.0)


def test_masked_heads_get_no_relevance_and_relevance_is_still_conserved():
    from heads_lab.model.heads import masked

    model = _model([])
    modules = attention_modules(model)
    chosen = {("enc-self", 0): [1, 3], ("dec-enc", 1): [0]}
    assert all(modules[key].out_proj.bias.abs().min() > 0 for key in chosen)  # biases left in
    with masked(model, chosen):  # the heads' outputs scaled by 0 in out_proj's pre-hook
        logits, _ = lrp.forward(model, SRC, TGT)
        reference = model.logits(model.decode(TGT, model.encode(SRC)))
        torch.testing.assert_close(logits, reference, rtol=0, atol=1e-12)
        rel = lrp.relevance(model, SRC, TGT, eps=0.0)
    for total in rel.totals:
        torch.testing.assert_close(total, rel.seeds, rtol=1e-5, atol=1e-5)
    for key, heads in chosen.items():
        r = rel.heads[key]
        assert torch.all(r[:, heads] == 0) and r.abs().sum() > 0
