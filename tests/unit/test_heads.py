"""Heads as units: masks equal removal, importance equals a finite difference, Hard Concrete
gates behave as the distribution says and close under a large L0 weight."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from heads_lab.analysis import head_importance
from heads_lab.config import AttentionKind, ModelConfig
from heads_lab.data import Split
from heads_lab.errors import ConfigError
from heads_lab.heads import (
    HardConcreteGates,
    apply_kept,
    attention_modules,
    config_head_counts,
    count_heads,
    format_heads,
    mask_heads,
    parse_head_mask,
    remove_heads,
)
from heads_lab.model import Transformer
from heads_lab.train import adam

VOCAB = 40


def _model(seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=2, decoder_layers=2,
                      dropout=0.0, **kw)
    return Transformer(cfg, VOCAB).eval()


def _batch(seed: int = 1, b: int = 3, s: int = 7, t: int = 6):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (b, s), generator=g)
    src[0, -2:] = 0  # padding
    return src, torch.randint(4, VOCAB, (b, t), generator=g)


def test_parse_head_mask_and_its_errors():
    counts = config_head_counts(ModelConfig(d_model=32, heads=4, encoder_layers=2,
                                            decoder_layers=3))
    spec = parse_head_mask("enc:0:3,dec-enc:2:*+dec:1:0", counts)
    assert spec == {("enc-self", 0): [3], ("dec-enc", 2): [0, 1, 2, 3], ("dec-self", 1): [0]}
    assert parse_head_mask(format_heads(spec), counts) == spec
    for bad, text in (("enc:2:0", "no enc-self layer '2'"), ("enc:0:4", "head '4'"),
                      ("foo:0:1", "site:layer:head"), ("enc:0", "site:layer:head")):
        with pytest.raises(ConfigError, match=text):
            parse_head_mask(bad, counts)


@pytest.mark.parametrize("relative", [0, 3])
@pytest.mark.parametrize("spec", ["enc:0:1,dec:1:0,dec:1:3,dec-enc:0:2", "enc:1:*,dec-enc:0:0"])
def test_masking_heads_equals_removing_them(spec, relative):
    model = _model(relative_positions=relative)
    with torch.no_grad():  # relative-position biases go with their heads
        for module in attention_modules(model).values():
            if module.position_bias is not None:
                module.position_bias.normal_()
    src, tgt = _batch()
    heads = parse_head_mask(spec, attention_modules(model))
    masked = copy.deepcopy(model)
    mask_heads(masked, heads)
    removed = copy.deepcopy(model)
    before = sum(p.numel() for p in removed.parameters())
    kept = remove_heads(removed, heads)
    with torch.no_grad():
        want, got = masked(src, tgt), removed(src, tgt)
        full = model(src, tgt)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(full, want, atol=1e-4)  # the mask did change the function
    n = sum(len(v) for v in heads.values())
    d, dk = 32, 8  # per head: q, k, v rows (with bias) of in_proj and dk columns of out_proj
    self_heads = sum(len(v) for (site, _), v in heads.items() if site != "dec-enc")
    assert before - sum(p.numel() for p in removed.parameters()) == \
        n * (3 * dk * (d + 1) + dk * d) + self_heads * (2 * relative + 1 if relative else 0)
    assert count_heads(removed) == {s: 8 - sum(len(v) for (site, _), v in heads.items()
                                               if site == s) for s in count_heads(model)}
    # a pruned checkpoint loads into a model reshaped by apply_kept
    rebuilt = _model(seed=5, relative_positions=relative)
    apply_kept(rebuilt, kept)
    rebuilt.load_state_dict(removed.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(src, tgt), got)


def test_removal_refuses_shared_or_mixed_heads():
    for kw in ({"kv_heads": 2}, {"attention": AttentionKind.talking_heads}):
        model = _model(**kw)
        with pytest.raises(ConfigError, match="mask them instead"):
            remove_heads(model, {("enc-self", 0): [1]})
        mask_heads(model, {("enc-self", 0): [1]})  # masking works for every variant
        with torch.no_grad():
            assert torch.isfinite(model(*_batch())).all()


def test_importance_equals_a_finite_difference_of_the_loss():
    model = _model().double()
    g = np.random.default_rng(0)
    src = [g.integers(4, VOCAB, n).tolist() for n in (5, 7, 6)]
    tgt = [g.integers(4, VOCAB, n).tolist() for n in (6, 4, 5)]
    split = Split(None, None, src, tgt)
    got = head_importance(model, split, None, 10_000, torch.device("cpu"))  # one batch
    assert all(m.head_gate is None for m in attention_modules(model).values())  # left clean
    from heads_lab.data import collate

    batch = collate(split, np.arange(3))
    keep = batch.tgt_out != 0

    def loss(gates) -> float:
        for key, module in attention_modules(model).items():
            module.head_gate = gates[key]
        with torch.no_grad():
            hidden = model.decode(batch.tgt_in, model.encode(batch.src))[keep]
            return torch.nn.functional.cross_entropy(model.logits(hidden),
                                                     batch.tgt_out[keep]).item()

    eps = 1e-5
    for key, module in attention_modules(model).items():
        grads = []
        for h in range(module.out_heads):
            gates = {k: torch.ones(m.out_heads, dtype=torch.float64)
                     for k, m in attention_modules(model).items()}
            gates[key][h] = 1 + eps
            up = loss(gates)
            gates[key][h] = 1 - eps
            grads.append((up - loss(gates)) / (2 * eps))
        want = np.abs(grads) / np.linalg.norm(grads)
        np.testing.assert_allclose(got[key], want, rtol=1e-5, atol=1e-8)


def test_hard_concrete_samples_stay_in_unit_interval_and_l0_matches_its_closed_form():
    model = _model()
    gates = HardConcreteGates(model)
    log_alpha = torch.linspace(-4, 4, 9).repeat(40_000)
    torch.manual_seed(0)
    z = gates.sample(log_alpha)
    assert z.min() >= 0 and z.max() <= 1
    assert (z == 0).any() and (z == 1).any()  # the stretch puts mass on exactly 0 and 1
    nonzero = (z > 0).double().view(40_000, 9).mean(0)
    closed = torch.sigmoid(torch.linspace(-4, 4, 9) - 0.33 * math.log(0.1 / 1.1)).double()
    torch.testing.assert_close(nonzero, closed, atol=0.01, rtol=0)
    torch.testing.assert_close(gates.prob_open(torch.linspace(-4, 4, 9)).double(), closed)
    per_module = [gates.prob_open(gates.log_alpha[f"{s}_{i}"]).sum() for s, i in gates.keys]
    torch.testing.assert_close(gates.penalty(), torch.stack(per_module).mean())
    assert all(g.sum() == 4 for g in gates.test_gates().values())  # all open at the start


@pytest.mark.parametrize("l0_lambda, closed", [(20.0, True), (0.0, False)])
def test_gates_close_on_a_toy_problem_with_a_large_l0_weight(l0_lambda, closed):
    model = _model().train()
    model.gates = HardConcreteGates(model, l0_lambda=l0_lambda, lr=0.1)
    opt = adam(model, 1e-3, (0.9, 0.98), 1e-9)
    src, tgt = _batch()
    torch.manual_seed(0)
    for _ in range(60):
        logits = model(src, tgt)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())
        (loss + model.gates.l0_lambda * model.gates.penalty()).backward()
        opt.step()
        opt.zero_grad()
    open_heads = sum(int(g.sum()) for g in model.gates.test_gates().values())
    assert open_heads == (0 if closed else 24)
    model.eval()
    with torch.no_grad():
        model(src, tgt)  # eval mode: the 0/1 test-time gates are on every module
    assert all(set(m.head_gate.tolist()) <= {0.0, 1.0} for m in attention_modules(model).values())


def test_relative_position_biases_and_gates_get_their_own_learning_rates():
    """Adam's first step moves every parameter with a gradient by about its group's lr."""
    model = _model(relative_positions=2).train()
    model.gates = HardConcreteGates(model, l0_lambda=0.1, lr=0.1)
    opt = adam(model, 1e-3, (0.9, 0.98), 1e-9, weight_decay=0.01, position_bias_lr=0.05)
    biases = [m.position_bias for m in attention_modules(model).values()
              if m.position_bias is not None]
    assert len(biases) == 4  # enc-self and dec-self, 2 layers each; cross-attention has none
    lrs = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    assert all(lrs[id(b)] == 0.05 for b in biases)
    assert all(lrs[id(p)] == 0.1 for p in model.gates.parameters())
    assert sorted(set(lrs.values())) == [1e-3, 0.05, 0.1]
    assert len(lrs) == sum(1 for _ in model.parameters())  # every parameter in one group
    src, tgt = _batch()
    before = [b.detach().clone() for b in biases]
    logits = model(src, tgt)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten()).backward()
    opt.step()
    moved = torch.cat([(b - a).abs().flatten() for a, b in zip(before, biases)])
    assert 0.04 < moved.max() < 0.0501
