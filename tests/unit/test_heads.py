"""Heads as units: masks equal removal, importance equals a finite difference, Hard Concrete
gates behave as the distribution says and close under a large L0 weight."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from heads_lab.analysis import head_importance, importance_by_kind, least_important
from heads_lab.config.schemas import AttentionKind, ModelConfig
from heads_lab.config.variants import out_heads
from heads_lab.data import Split
from heads_lab.errors import ConfigError
from heads_lab.model import Transformer
from heads_lab.model.heads import (
    HardConcreteGates,
    apply_kept,
    attach_gates,
    attention_modules,
    count_heads,
    fold_gates,
    format_heads,
    gates_of,
    head_counts,
    head_kinds,
    masked,
    parse_head_mask,
    remove_heads,
)
from heads_lab.training.optim import adam

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
    counts = out_heads(ModelConfig(d_model=32, heads=4, encoder_layers=2, decoder_layers=3))
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
    heads = parse_head_mask(spec, head_counts(model))
    removed = copy.deepcopy(model)
    before = sum(p.numel() for p in removed.parameters())
    kept = remove_heads(removed, heads)
    with torch.no_grad():
        with masked(model, heads):
            want = model(src, tgt)
        got, full = removed(src, tgt), model(src, tgt)  # the mask left with the block
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
        with torch.no_grad(), masked(model, {("enc-self", 0): [1]}):  # every variant masks
            assert torch.isfinite(model(*_batch())).all()


TALKING = {"attention": AttentionKind.talking_heads}
KINDS = [({}, {"head": 4}),
         ({**TALKING, "heads_k": 8, "heads": 4, "heads_v": 8}, {"qk": 8, "softmax": 4, "value": 8}),
         ({**TALKING, "heads_k": 8, "heads": 16, "heads_v": 8}, {"qk": 8, "softmax": 16, "value": 8}),
         ({**TALKING, "heads_k": 2, "heads": 8, "heads_v": 4}, {"qk": 2, "softmax": 8, "value": 4})]


@pytest.mark.parametrize("kw, kinds", KINDS)
def test_importance_of_every_kind_equals_a_finite_difference_of_the_loss(kw, kinds):
    """|∂L/∂ξ| per head of each kind (talking heads: J's query/key heads, W's softmax heads, O's
    value heads) against a central difference of the float64 loss with one head's multiplier
    moved; and head_importance (what pruning ranks) is the removal kind's."""
    heads = kw.pop("heads", 4)
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, heads=heads, d_ff=64, encoder_layers=2, decoder_layers=2,
                      dropout=0.0, **kw)
    model = Transformer(cfg, VOCAB).eval().double()
    kw["heads"] = heads  # the parametrised dict is shared between runs
    with torch.no_grad():  # mixes away from any identity start, so every kind matters
        for module in attention_modules(model).values():
            for mix in (getattr(module, "logits_mix", None), getattr(module, "weights_mix", None)):
                if mix is not None:
                    mix.add_(0.3 * torch.randn_like(mix))
    g = np.random.default_rng(0)
    src = [g.integers(4, VOCAB, n).tolist() for n in (5, 7, 6)]
    tgt = [g.integers(4, VOCAB, n).tolist() for n in (6, 4, 5)]
    split = Split(None, None, src, tgt)
    got = importance_by_kind(model, split, None, 10_000, torch.device("cpu"))  # one batch
    modules = attention_modules(model)
    assert {k: head_kinds(m) for k, m in modules.items()} == dict.fromkeys(modules, kinds)
    assert set(got) == {(site, layer, kind) for (site, layer) in modules for kind in kinds}
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())  # clean
    assert all(p.requires_grad for p in model.parameters())
    from heads_lab.data import collate

    batch = collate(split, np.arange(3))
    keep = batch.tgt_out != 0

    def loss(key, kind, h, value) -> float:
        """The loss with head h of `kind` scaled by `value`, written out on the weights: an
        output head's columns of out_proj, a query/key head's row of P_l (J's head before the
        mix), a softmax head's row of P_w (W's head before the mix)."""
        module = modules[key]
        weight, index = {"qk": (getattr(module, "logits_mix", None), h),
                         "softmax": (getattr(module, "weights_mix", None), h)}.get(
            kind, (module.out_proj.weight, (slice(None), slice(h * module.head_dim,
                                                               (h + 1) * module.head_dim))))
        saved = weight.detach().clone()
        with torch.no_grad():
            weight[index] *= value
            hidden = model.decode(batch.tgt_in, model.encode(batch.src))[keep]
            out = torch.nn.functional.cross_entropy(model.logits(hidden),
                                                    batch.tgt_out[keep]).item()
            weight.copy_(saved)
        return out

    eps = 1e-5
    for key in modules:
        for kind, n in kinds.items():
            grads = [(loss(key, kind, h, 1 + eps) - loss(key, kind, h, 1 - eps)) / (2 * eps)
                     for h in range(n)]
            want = np.abs(grads) / np.linalg.norm(grads)
            np.testing.assert_allclose(got[(*key, kind)], want, rtol=1e-5, atol=1e-8)
    removal = "value" if "value" in kinds else "head"
    pruning = head_importance(model, split, None, 10_000, torch.device("cpu"))
    assert pruning.keys() == modules.keys()
    for key, v in pruning.items():
        np.testing.assert_allclose(v, got[(*key, removal)])


def test_pruning_by_importance_takes_the_least_important_unmasked_heads_first():
    """One step of Michel et al.'s pruning (heads-lab prune method=importance, and of hf:
    models): the n lowest scores across sites and layers, heads already masked passed over."""
    scores = {("enc-self", 0): np.array([0.5, 0.1, 0.9]), ("enc-self", 1): np.array([0.3, 0.05]),
              ("dec-enc", 0): np.array([0.2, 0.7])}
    assert least_important(scores, {}, 3) == [("enc-self", 1, 1), ("enc-self", 0, 1),
                                               ("dec-enc", 0, 0)]
    masked = {("enc-self", 1): [1], ("enc-self", 0): [1]}
    assert least_important(scores, masked, 2) == [("dec-enc", 0, 0), ("enc-self", 1, 0)]
    assert least_important(scores, masked, 99)[-1] == ("enc-self", 0, 2)  # all that are left
    assert len(least_important(scores, masked, 99)) == 5
    tie = {("enc-self", 1): np.array([0.0]), ("dec-enc", 2): np.array([0.0, 0.0])}
    assert least_important(tie, {}, 3) == [("dec-enc", 2, 0), ("dec-enc", 2, 1), ("enc-self", 1, 0)]


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
    start = 1.2 * 0.9 - 0.1  # σ(log α) = init_keep = 0.9, stretched to (−0.1, 1.1)
    for g in gates.test_gates().values():  # every head open at the start, at ẑ (voita rule)
        torch.testing.assert_close(g, torch.full((4,), start))


@pytest.mark.parametrize("gamma, zeta", [(-0.1, 1.1), (-0.2, 1.05)])
def test_test_time_gates_follow_the_closed_form_of_each_rule(gamma, zeta):
    """ẑ = clamp(σ(log α)(ζ − γ) + γ, 0, 1); voita keeps a head iff ẑ > 0 (log α > −ln(−ζ/γ))
    at ẑ, binary iff ẑ > 0.5 at 1; checked in float64 against math on both sides of each
    threshold."""
    edge = -math.log(-zeta / gamma)  # −ln 11 ≈ −2.398 for the default stretch
    values = [-6.0, edge - 1e-3, edge + 1e-3, -1.0, -1e-3, 1e-3, 1.5, 6.0]
    for rule in ("voita", "binary"):
        gates = HardConcreteGates(_model(), sites=("enc-self",), stretch=(gamma, zeta), rule=rule)
        gates.double()
        assert gates.keys == [("enc-self", 0), ("enc-self", 1)]  # 4 heads each: 8 values
        with torch.no_grad():
            for i, p in enumerate(gates.log_alpha.values()):
                p.copy_(torch.tensor(values[4 * i:4 * i + 4], dtype=torch.float64))
        for i, key in enumerate(gates.keys):
            la = values[4 * i:4 * i + 4]
            z = [min(1.0, max(0.0, (zeta - gamma) / (1 + math.exp(-a)) + gamma)) for a in la]
            want = z if rule == "voita" else [1.0 if v > 0.5 else 0.0 for v in z]
            got = gates.test_gates()[key].tolist()
            assert got == pytest.approx(want, abs=1e-12)
            # binary: ẑ > 0.5 ⇔ σ(log α) > (0.5 − γ)/(ζ − γ): log α > 0 for a stretch
            # symmetric about 0.5, as the default
            half = math.log((0.5 - gamma) / (zeta - 0.5))
            assert (half == pytest.approx(0.0)) == (gamma + zeta == pytest.approx(1.0))
            alive = [a > edge for a in la] if rule == "voita" else [a > half for a in la]
            assert [g > 0 for g in got] == alive
            assert gates.closed()[key] == [h for h, a in enumerate(alive) if not a]
    # Voita et al.'s start, log α = 0: every head alive at ẑ = 0.5 (voita), none (binary)
    for rule, kept in (("voita", 0.5 * (zeta - gamma) + gamma), ("binary", 0.0)):
        gates = HardConcreteGates(_model(), stretch=(gamma, zeta), init_keep=0.5, rule=rule)
        assert all(float(v) == 0.0 for p in gates.log_alpha.values() for v in p.detach())
        assert all(g.tolist() == pytest.approx([kept] * 4) for g in gates.test_gates().values())


@pytest.mark.parametrize("rule", ["voita", "binary"])
def test_folding_the_gates_then_removing_closed_heads_keeps_the_gated_function(rule):
    model = _model(seed=3)
    gates = attach_gates(model, HardConcreteGates(model, rule=rule))
    with torch.no_grad():  # some heads closed under both rules, others at partial ẑ
        for i, p in enumerate(gates.log_alpha.values()):
            p.copy_(torch.tensor([-3.0, -1.0, 0.5, 3.0])[torch.arange(4).roll(i)])
    src, tgt = _batch()
    with torch.no_grad():
        gated = model(src, tgt)  # eval mode: the test-time gates on every module
    closed = fold_gates(model)
    assert gates_of(model) is None and closed == {k: sorted(v) for k, v in closed.items()}
    assert not any(m._forward_pre_hooks for m in model.modules())  # the gates' hooks went too
    assert sum(map(len, closed.values())) == (6 if rule == "voita" else 12)  # 1 or 2 of 4
    remove_heads(model, closed)
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), gated, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rule", ["voita", "binary"])
@pytest.mark.parametrize("l0_lambda, closed", [(20.0, True), (0.0, False)])
def test_gates_close_on_a_toy_problem_with_a_large_l0_weight(l0_lambda, closed, rule):
    model = _model().train()
    gates = attach_gates(model, HardConcreteGates(model, l0_lambda=l0_lambda, lr=0.1, rule=rule))
    opt = adam(model, 1e-3, (0.9, 0.98), 1e-9, extra=gates)
    src, tgt = _batch()
    torch.manual_seed(0)
    for _ in range(60):
        logits = model(src, tgt)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())
        (loss + gates.loss()).backward()
        opt.step()
        opt.zero_grad()
    test = gates.test_gates()
    open_heads = sum(int((g > 0).sum()) for g in test.values())
    assert open_heads == (0 if closed else 24) == gates.metrics()["train/heads_open"]
    model.eval()  # eval mode: the first module's head outputs scaled by its test-time gate
    first = attention_modules(model)[("enc-self", 0)]
    seen = []
    first.out_proj.register_forward_pre_hook(lambda _, inputs: seen.append(inputs[0]))
    with torch.no_grad():
        model(src, tgt)
        with gates.suspended():
            model(src, tgt)
    gated, plain = seen  # the recorder runs after the gates' own pre-hook
    scale = test[("enc-self", 0)].repeat_interleave(first.head_dim)
    torch.testing.assert_close(gated, plain * scale)
    if rule == "binary":
        assert set(test[("enc-self", 0)].tolist()) <= {0.0, 1.0}


def test_relative_position_biases_and_gates_get_their_own_learning_rates():
    """Adam's first step moves every parameter with a gradient by about its group's lr."""
    model = _model(relative_positions=2).train()
    gates = attach_gates(model, HardConcreteGates(model, l0_lambda=0.1, lr=0.1))
    opt = adam(model, 1e-3, (0.9, 0.98), 1e-9, weight_decay=0.01, position_bias_lr=0.05,
               extra=gates)
    biases = [m.position_bias for m in attention_modules(model).values()
              if m.position_bias is not None]
    assert len(biases) == 4  # enc-self and dec-self, 2 layers each; cross-attention has none
    lrs = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    assert all(lrs[id(b)] == 0.05 for b in biases)
    assert all(lrs[id(p)] == 0.1 for p in gates.parameters())
    assert sorted(set(lrs.values())) == [1e-3, 0.05, 0.1]
    assert len(lrs) == sum(1 for _ in model.parameters())  # every parameter in one group
    src, tgt = _batch()
    before = [b.detach().clone() for b in biases]
    logits = model(src, tgt)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten()).backward()
    opt.step()
    moved = torch.cat([(b - a).abs().flatten() for a, b in zip(before, biases)])
    assert 0.04 < moved.max() < 0.0501
