"""Talking heads and grouped/multi-query heads against independent references."""

from __future__ import annotations

import pytest
import torch

from heads_lab.config.schemas import AttentionKind, ModelConfig
from heads_lab.errors import ConfigError
from heads_lab.model import MultiHeadAttention, TalkingHeadsAttention, Transformer

D = 24


def _padding_mask(lengths: list[int], m: int) -> torch.Tensor:
    return (torch.arange(m)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]  # True=keep


def _inputs(case: str):
    """Queries x [2, 5, D], a memory [2, 7, D] and the attention call's keyword arguments of a
    case: padded self-attention, causal self-attention or cross-attention with padding."""
    x = torch.randn(2, 5, D, dtype=torch.float64)
    memory = torch.randn(2, 7, D, dtype=torch.float64)
    kwargs = {"padded-self": dict(mask=_padding_mask([5, 2], 5)), "causal-self": dict(causal=True),
              "cross": dict(memory=memory, mask=_padding_mask([7, 3], 7))}[case]
    return x, memory, kwargs


def _copy_projections(src, dst) -> None:
    with torch.no_grad():
        dst.in_proj.weight.copy_(src.in_proj.weight)
        dst.in_proj.bias.copy_(src.in_proj.bias)
        dst.out_proj.weight.copy_(src.out_proj.weight)
        dst.out_proj.bias.copy_(src.out_proj.bias)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("case", ["padded-self", "causal-self", "cross"])
def test_talking_heads_with_identity_mixes_equal_multi_head(case, need_weights):
    torch.manual_seed(0)
    th = TalkingHeadsAttention(D, 4, 6).double().eval()
    mha = MultiHeadAttention(D, 4, 6).double().eval()
    _copy_projections(th, mha)
    with torch.no_grad():
        th.logits_mix.copy_(torch.eye(4))
        th.weights_mix.copy_(torch.eye(4))
    x, memory, kwargs = _inputs(case)
    y_th, w_th = th(x, need_weights=need_weights, **kwargs)
    y_mha, w_mha = mha(x, need_weights=need_weights, **kwargs)
    torch.testing.assert_close(y_th, y_mha)
    if need_weights:
        torch.testing.assert_close(w_th, w_mha)


def _einsum_reference(att: TalkingHeadsAttention, x, memory, keep):
    """The paper's formulas in float64 einsum, head axes last: Q[n,d,hK] ... Y[n,d_model]."""
    hk, hv, dk = att.k_heads, att.v_heads, att.head_dim
    w, b = att.in_proj.weight, att.in_proj.bias
    wq, wk, wv = w.split(att.sizes)
    bq, bk, bv = b.split(att.sizes)
    Q = (x @ wq.T + bq).view(*x.shape[:2], hk, dk).permute(0, 1, 3, 2)  # [b, n, d_k, h_K]
    K = (memory @ wk.T + bk).view(*memory.shape[:2], hk, dk).permute(0, 1, 3, 2)  # [b, m, d_k, h_K]
    V = (memory @ wv.T + bv).view(*memory.shape[:2], hv, dk).permute(0, 1, 3, 2)  # [b, m, d_v, h_V]
    J = torch.einsum("bndk,bmdk->bnmk", Q, K) / dk**0.5  # [b, n, m, h_K]
    L = torch.einsum("bnmk,kh->bnmh", J, att.logits_mix)  # [b, n, m, h]
    L = L.masked_fill(~keep[..., None], float("-inf"))
    W = L.softmax(dim=2)  # over m
    U = torch.einsum("bnmh,hv->bnmv", W, att.weights_mix)  # [b, n, m, h_V]
    O = torch.einsum("bnmv,bmdv->bndv", U, V)  # [b, n, d_v, h_V]
    Y = O.permute(0, 1, 3, 2).reshape(*O.shape[:2], hv * dk) @ att.out_proj.weight.T + att.out_proj.bias
    return Y, W.permute(0, 3, 1, 2), U.permute(0, 3, 1, 2)  # weights as [b, heads, n, m]


@pytest.mark.parametrize("case", ["padded-self", "causal-self", "cross"])
def test_talking_heads_equal_float64_einsum_of_the_formulas(case):
    torch.manual_seed(1)
    hk, h, hv = 2, 6, 3
    att = TalkingHeadsAttention(D, h, 5, heads_k=hk, heads_v=hv).double().eval()
    with torch.no_grad():
        att.logits_mix.normal_()
        att.weights_mix.normal_()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    if case == "cross":
        memory, lengths = torch.randn(2, 7, D, dtype=torch.float64), [7, 3]
        mask = _padding_mask(lengths, 7)
        keep = mask[:, 0, 0, None, :].expand(2, 5, 7)
        y, w = att(x, memory, mask=mask, need_weights=True)
    elif case == "padded-self":
        memory, mask = x, _padding_mask([5, 2], 5)
        keep = mask[:, 0, 0, None, :].expand(2, 5, 5)
        y, w = att(x, mask=mask, need_weights=True)
    else:
        memory = x
        keep = torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 5, 5)
        y, w = att(x, causal=True, need_weights=True)
    y_ref, w_ref, u_ref = _einsum_reference(att, x, memory, keep)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(w, w_ref)  # W: the softmax heads
    u = torch.einsum("bhnm,hv->bvnm", w, att.weights_mix)  # U = W · P_w from the maps returned
    torch.testing.assert_close(u, u_ref)  # U: the mixed weights (y above equals U's output)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    assert not torch.allclose(u.sum(-1), torch.ones(2, hv, 5, dtype=torch.float64))
    masked = ~keep[:, None].expand_as(u)
    assert torch.all(u[masked] == 0)  # masked keys: zero weight after mixing too
    y_fast, _ = att(x, None if case != "cross" else memory, mask=None if case == "causal-self"
                    else mask, causal=case == "causal-self")
    torch.testing.assert_close(y_fast, y_ref)


@pytest.mark.parametrize("case", ["padded-self", "causal-self", "cross"])
@pytest.mark.parametrize("mixes,counts", [("logits", (2, 6, 6)), ("weights", (6, 6, 3))],
                         ids=["logits only", "weights only"])
def test_a_layer_without_a_mix_is_the_layer_with_that_mix_the_identity(mixes, counts, case):
    """model.mixes: the layer with one mix computes the paper's formulas (the float64 einsum
    reference) with the other mix the identity, and has no parameter for it."""
    torch.manual_seed(4)
    hk, h, hv = counts
    one = TalkingHeadsAttention(D, h, 5, heads_k=hk, heads_v=hv, mixes=mixes).double().eval()
    both = TalkingHeadsAttention(D, h, 5, heads_k=hk, heads_v=hv).double().eval()
    _copy_projections(one, both)
    with torch.no_grad():
        kept = one.logits_mix if mixes == "logits" else one.weights_mix
        kept.normal_()
        (both.logits_mix if mixes == "logits" else both.weights_mix).copy_(kept)
        (both.weights_mix if mixes == "logits" else both.logits_mix).copy_(torch.eye(h))
    assert (one.weights_mix if mixes == "logits" else one.logits_mix) is None
    assert sum(p.numel() for p in one.mix_parameters()) == kept.numel()
    x, memory, kwargs = _inputs(case)
    y_one, w_one = one(x, need_weights=True, **kwargs)
    y_both, w_both = both(x, need_weights=True, **kwargs)
    torch.testing.assert_close(y_one, y_both)
    torch.testing.assert_close(w_one, w_both)
    keep = (kwargs["mask"][:, 0, 0, None, :].expand(2, 5, kwargs["mask"].shape[-1])
            if "mask" in kwargs else torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 5, 5))
    y_ref, _, _ = _einsum_reference(both, x, memory if case == "cross" else x, keep)
    torch.testing.assert_close(y_one, y_ref)
    # the fused path (no weights returned) too
    torch.testing.assert_close(one(x, **kwargs)[0], y_ref)


def test_a_mix_setting_needs_talking_heads_and_matching_head_counts():
    with pytest.raises(ConfigError, match="model.mixes=logits needs model.heads_v = model.heads"):
        TalkingHeadsAttention(D, 4, 6, heads_v=2, mixes="logits")
    with pytest.raises(ConfigError, match="model.mixes=weights needs model.heads_k = model.heads"):
        TalkingHeadsAttention(D, 4, 6, heads_k=2, mixes="weights")


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_grouped_query_equals_multi_head_with_repeated_kv_heads(kv_heads, need_weights):
    torch.manual_seed(2)
    heads, dk = 8, 3
    gqa = MultiHeadAttention(D, heads, dk, kv_heads=kv_heads).double().eval()
    mha = MultiHeadAttention(D, heads, dk).double().eval()
    group = heads // kv_heads
    with torch.no_grad():
        wq, wk, wv = gqa.in_proj.weight.split(gqa.sizes)
        bq, bk, bv = gqa.in_proj.bias.split(gqa.sizes)

        def rep(t):  # kv head j serves query heads j·group ... (j+1)·group - 1
            return t.view(kv_heads, dk, *t.shape[1:]).repeat_interleave(group, 0).reshape(-1, *t.shape[1:])

        mha.in_proj.weight.copy_(torch.cat([wq, rep(wk), rep(wv)]))
        mha.in_proj.bias.copy_(torch.cat([bq, rep(bk), rep(bv)]))
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    x = torch.randn(3, 6, D, dtype=torch.float64)
    memory = torch.randn(3, 4, D, dtype=torch.float64)
    mask = _padding_mask([4, 1, 3], 4)
    for kwargs in (dict(causal=True), dict(memory=memory, mask=mask)):
        y, w = gqa(x, need_weights=need_weights, **kwargs)
        y_ref, w_ref = mha(x, need_weights=need_weights, **kwargs)
        torch.testing.assert_close(y, y_ref)
        if need_weights:
            torch.testing.assert_close(w, w_ref)
    assert gqa.in_proj.weight.shape[0] == (heads + 2 * kv_heads) * dk


VARIANTS = [
    dict(attention=AttentionKind.talking_heads, heads=6, heads_k=2, heads_v=3, head_dim=8),
    dict(attention=AttentionKind.talking_heads, heads=4, talking_heads_in=["dec-enc"]),
    dict(kv_heads=1),
    dict(kv_heads=2),
    dict(relative_positions=2),
    dict(attention=AttentionKind.talking_heads, heads=4, heads_k=2, relative_positions=3),
    dict(attention=AttentionKind.talking_heads, heads=4, heads_k=2, mixes="logits"),
    dict(attention=AttentionKind.talking_heads, heads=4, heads_v=2, mixes="weights"),
]


def _decoding_model(variant: dict) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(**{"d_model": 32, "heads": 4, "d_ff": 64, "encoder_layers": 1,
                         "decoder_layers": 2, "dropout": 0.0, **variant})
    model = Transformer(cfg, 40).double().eval()
    _random_position_bias(model)
    return model


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_decoding_equals_full_forward_for_every_variant(variant):
    model = _decoding_model(variant)
    src = torch.randint(4, 40, (2, 6))
    src[1, 4:] = 0
    tgt = torch.randint(4, 40, (2, 5))
    full = model(src, tgt)
    enc, caches = model.encode(src), model.new_caches()
    steps = [model.logits(model.decode(tgt[:, t : t + 1], enc, caches=caches, offset=t))
             for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, 1), full)


@pytest.mark.parametrize("variant", VARIANTS)
def test_beams_decode_over_their_sentences_memory_kept_once(variant):
    """Beam search's cache: k rows per sentence attend to the sentence's memory, projected and
    kept once (not k times); the logits equal the full forward of the batch with each sentence
    repeated k times, and self-attention's buffer is made once, as long as `positions`."""
    model, k, steps = _decoding_model(variant), 3, 5
    src = torch.randint(4, 40, (2, 6))
    src[1, 4:] = 0
    tgt = torch.randint(4, 40, (2 * k, steps))  # every beam its own prefix
    full = model(src.repeat_interleave(k, 0), tgt)
    enc, caches = model.encode(src), model.new_caches(positions=steps)
    for layer, cache in zip(model.decoder, caches):
        layer.cross_attn.cache_memory(cache["cross"], enc.memory)
    out, buffers = [], set()
    for t in range(steps):
        out.append(model.logits(model.decode(tgt[:, t : t + 1], enc, caches=caches, offset=t)))
        buffers.add(caches[0]["self"]["buffer_k"].data_ptr())
    torch.testing.assert_close(torch.cat(out, 1), full)
    assert [c["cross"]["k"].shape[0] for c in caches] == [2, 2]  # per sentence, not per beam
    assert len(buffers) == 1 and caches[0]["self"]["buffer_k"].shape[2] == steps


def test_talking_heads_sites_are_switchable():
    cfg = ModelConfig(d_model=32, heads=4, attention=AttentionKind.talking_heads,
                      talking_heads_in=["enc-self", "dec-enc"])
    model = Transformer(cfg, 30)
    assert isinstance(model.encoder[0].self_attn, TalkingHeadsAttention)
    assert isinstance(model.decoder[0].cross_attn, TalkingHeadsAttention)
    assert not isinstance(model.decoder[0].self_attn, TalkingHeadsAttention)


def test_mixes_start_as_identity_when_head_counts_match_and_fan_in_normal_when_not():
    torch.manual_seed(0)
    square = TalkingHeadsAttention(D, 4, 6)
    assert torch.equal(square.logits_mix, torch.eye(4)) and torch.equal(square.weights_mix, torch.eye(4))
    rect = TalkingHeadsAttention(D, 6, 4, heads_k=2, heads_v=3)
    assert rect.logits_mix.shape == (2, 6) and rect.weights_mix.shape == (6, 3)
    assert not torch.allclose(rect.logits_mix, torch.eye(2, 6), atol=0.3)
    # N(0, 1/fan-in) (fan-in = the heads mixed from): std measured on large mixes, to ±10 %
    wide = TalkingHeadsAttention(D, 256, 1, heads_k=64, heads_v=128)
    assert abs(wide.logits_mix.std().item() * 64**0.5 - 1) < 0.1  # P_l [64, 256]
    assert abs(wide.weights_mix.std().item() * 256**0.5 - 1) < 0.1  # P_w [256, 128]
    assert abs(wide.logits_mix.mean().item()) < 0.01
    # forced: identity (eye + N(0, 0.01²) where rectangular) or normal even when square
    old = TalkingHeadsAttention(D, 6, 4, heads_k=2, heads_v=3, mix_init="identity")
    assert torch.allclose(old.logits_mix, torch.eye(2, 6), atol=0.05)
    assert torch.allclose(old.weights_mix, torch.eye(6, 3), atol=0.05)
    normal = TalkingHeadsAttention(D, 64, 1, mix_init="normal")
    assert abs(normal.logits_mix.std().item() * 64**0.5 - 1) < 0.1
    with pytest.raises(ConfigError, match="model.mix_init=eye is unknown"):
        TalkingHeadsAttention(D, 4, 6, mix_init="eye")


@pytest.mark.parametrize("heads,heads_k,heads_v", [(4, 8, 8), (16, 8, 8), (8, 2, 4)])
def test_every_head_is_in_use_at_the_start_unless_identity_is_forced(heads, heads_k, heads_v):
    """The surplus heads of a rectangular mix: with the identity start they get noise-sized
    weights (value heads ≥ h) or logits (softmax heads ≥ h_K); with the default start their share
    is of the same order as the other heads'. Measured on the module's own outputs: per value head
    its total |weight| in U = W · P_w, per softmax head the spread of its logits L = J · P_l; the
    mean over the surplus heads against the mean over the others."""
    x = torch.randn(2, 9, D, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def surplus_shares(mix_init):
        torch.manual_seed(3)
        att = TalkingHeadsAttention(D, heads, 8, heads_k=heads_k, heads_v=heads_v,
                                    mix_init=mix_init).double().eval()
        _, w = att(x, need_weights=True)  # W [b, h, n, m]
        u = torch.einsum("bhnm,hv->bvnm", w, att.weights_mix).abs().sum(-1).mean((0, 2))
        q, k, _ = att.in_proj(x).split(att.sizes, dim=-1)
        q = q.view(2, 9, heads_k, 8).transpose(1, 2)
        k = k.view(2, 9, heads_k, 8).transpose(1, 2)
        j = q @ k.transpose(-2, -1) / 8**0.5  # J [b, h_K, n, m]
        spread = torch.einsum("bknm,kh->bhnm", j, att.logits_mix).std(-1).mean((0, 2))
        return (u[heads:].mean() / u[:heads].mean() if heads_v > heads else None,
                spread[heads_k:].mean() / spread[:heads_k].mean() if heads > heads_k else None)

    default, identity = surplus_shares(None), surplus_shares("identity")
    for d, i in zip(default, identity):
        if d is not None:
            assert i < 0.05 and d > 0.3
    assert default != (None, None)


def test_each_mix_is_started_by_its_own_shape_and_the_config_reaches_every_layer():
    """h_K = h ≠ h_V: P_l square (identity), P_w rectangular (normal). Forcing identity through
    ModelConfig changes only the mixes: every other parameter is drawn the same."""
    from heads_lab.config.choices import MixInit

    half = TalkingHeadsAttention(D, 4, 6, heads_k=4, heads_v=8)
    assert torch.equal(half.logits_mix, torch.eye(4))
    assert not torch.allclose(half.weights_mix, torch.eye(4, 8), atol=0.1)

    def build(mix_init):
        torch.manual_seed(0)
        cfg = ModelConfig(d_model=32, heads=4, heads_k=8, heads_v=8, mix_init=mix_init,
                          attention=AttentionKind.talking_heads)
        return dict(Transformer(cfg, 30).named_parameters())

    default, identity = build(None), build(MixInit.identity)
    mixes = [k for k in default if k.endswith(("logits_mix", "weights_mix"))]
    assert len(mixes) == 2 * (3 + 3 + 3)  # P_l, P_w at every site (3 + 3 layers, 3 sites)
    for name, p in default.items():
        if name in mixes:
            eye = torch.eye(*p.shape)
            assert torch.allclose(identity[name], eye, atol=0.05)
            assert not torch.allclose(p, eye, atol=0.3)
        else:
            assert torch.equal(p, identity[name]), name


def _random_position_bias(model) -> None:
    with torch.no_grad():
        for module in model.modules():
            if getattr(module, "position_bias", None) is not None:
                module.position_bias.normal_()


@pytest.mark.parametrize("kv_heads", [None, 2])
@pytest.mark.parametrize("case", ["padded", "causal"])
def test_relative_position_bias_equals_float64_einsum(case, kv_heads):
    """logits = q·k/√d_k + bias[head, clip(j − i, −K, K)], on every path: weights, the CPU bmm
    kernel and PyTorch's fused kernel."""
    import heads_lab.model.attention as attention

    torch.manual_seed(3)
    heads, dk, K, n = 4, 6, 2, 7
    attn = MultiHeadAttention(D, heads, dk, kv_heads=kv_heads, relative=K).double().eval()
    _random_position_bias(attn)
    x = torch.randn(2, n, D, dtype=torch.float64)
    mask = _padding_mask([n, 4], n) if case == "padded" else None
    causal = case == "causal"
    kv = kv_heads or heads
    wq, wk, wv = attn.in_proj.weight.split([heads * dk, kv * dk, kv * dk])
    bq, bk, bv = attn.in_proj.bias.split([heads * dk, kv * dk, kv * dk])
    q = (x @ wq.T + bq).view(2, n, heads, dk)
    k = (x @ wk.T + bk).view(2, n, kv, dk).repeat_interleave(heads // kv, 2)
    v = (x @ wv.T + bv).view(2, n, kv, dk).repeat_interleave(heads // kv, 2)
    offset = (torch.arange(n)[None, :] - torch.arange(n)[:, None]).clamp(-K, K) + K
    logits = torch.einsum("bnhd,bmhd->bhnm", q, k) / dk**0.5 + attn.position_bias[:, offset]
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    if causal:
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    weights = logits.softmax(-1)
    o = torch.einsum("bhnm,bmhd->bnhd", weights, v).reshape(2, n, heads * dk)
    expected = attn.out_proj(o)
    y, w = attn(x, mask=mask, causal=causal, need_weights=True)
    torch.testing.assert_close(w, weights)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(attn(x, mask=mask, causal=causal)[0], expected)  # bmm kernel
    fast = attention.bmm_is_faster
    try:
        attention.bmm_is_faster = lambda q, k: False
        torch.testing.assert_close(attn(x, mask=mask, causal=causal)[0], expected)  # fused
    finally:
        attention.bmm_is_faster = fast


def test_relative_positions_bias_self_attention_only_and_start_at_zero():
    cfg = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=1, decoder_layers=1,
                      relative_positions=3)
    model = Transformer(cfg, 40)
    assert model.encoder[0].self_attn.position_bias.shape == (4, 7)
    assert model.decoder[0].self_attn.position_bias.abs().sum() == 0
    assert model.decoder[0].cross_attn.position_bias is None
    plain = Transformer(ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=1,
                                    decoder_layers=1), 40)
    assert {k for k in model.state_dict()} - {k for k in plain.state_dict()} == {
        "encoder.0.self_attn.position_bias", "decoder.0.self_attn.position_bias"}


@pytest.mark.parametrize("variant", [VARIANTS[0], VARIANTS[2], {}])
def test_cross_attention_of_beams_equals_attention_over_the_repeated_memory(variant):
    """Beams folded onto their sentence's cached memory: the same outputs and (unfolded back to
    one row per beam) the same per-head maps as attending to the memory repeated per beam; a
    cache of the wrong batch is refused."""
    model, k = _decoding_model(variant), 3
    attn = model.decoder[0].cross_attn
    memory = torch.randn(2, 6, 32, dtype=torch.float64)
    mask = _padding_mask([6, 4], 6)
    x = torch.randn(2 * k, 1, 32, dtype=torch.float64)
    cache: dict = {}
    attn.cache_memory(cache, memory)
    y, w = attn(x, memory, mask, need_weights=True, cache=cache)
    y_ref, w_ref = attn(x, memory.repeat_interleave(k, 0), mask.repeat_interleave(k, 0),
                        need_weights=True)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(w, w_ref)
    with pytest.raises(ValueError, match="whole multiples"):
        attn(x[:5], memory, mask, cache=cache)


def test_head_labels_count_their_heads():
    from heads_lab.config.variants import variant

    def label(**model):
        return variant(ModelConfig(**model), "enc-self").label(ModelConfig(**model))

    assert label(heads=1, head_dim=32) == "1 head"
    assert label(heads=8, kv_heads=1) == "8 heads, 1 key/value head"
    assert label(heads=8, kv_heads=2) == "8 heads, 2 key/value heads"
    assert label(heads=8) == "8 heads"


def test_the_variant_registries_agree():
    """One name per attention variant in every registry: the config's Enum, the variants table
    (costs, kinds, checks), the model's modules (and each module's own `variant`), and the bench
    rows each variant declares."""
    from heads_lab.config.schemas import AttentionKind
    from heads_lab.config.variants import VARIANTS
    from heads_lab.model.attention import MODULES

    names = {k.value for k in AttentionKind}
    assert names == set(VARIANTS) == set(MODULES)
    for name, module in MODULES.items():
        assert module.variant == name and VARIANTS[name].name == name
        assert VARIANTS[name].bench(quick=True), f"{name} declares no bench rows"


@pytest.mark.parametrize("case", ["padded-self", "causal-self", "cross"])
@pytest.mark.parametrize("counts,mixes", [((2, 6, 3), "both"), ((4, 4, 4), "both"),
                                          ((2, 6, 6), "logits"), ((6, 6, 3), "weights")],
                         ids=["2-6-3", "4-4-4", "logits only", "weights only"])
def test_folded_talking_heads_equal_the_explicit_path_with_their_gradients(case, counts, mixes,
                                                                          monkeypatch):
    """The fused path (kernels.folded_talking_heads: the logits mix folded into the queries, one
    multi-query attention over all value heads, the weights mix after) against the explicit
    matmul-mix-softmax-mix path, in float64: outputs and every gradient (inputs, projections,
    mixes, relative-position biases)."""
    from heads_lab.model import attention, kernels

    calls = []
    monkeypatch.setattr(attention, "folded_talking_heads",
                        lambda *a, **k: calls.append(1) or kernels.folded_talking_heads(*a, **k))
    hk, h, hv = counts
    x, memory, kwargs = _inputs(case)
    x.requires_grad_(True)
    results = {}
    for path in ("explicit", "folded"):
        monkeypatch.setattr(kernels, "TALKING_HEADS_PATH", path)
        torch.manual_seed(2)
        att = TalkingHeadsAttention(D, h, 5, heads_k=hk, heads_v=hv, mixes=mixes,
                                    relative=0 if case == "cross" else 3).double().train()
        with torch.no_grad():
            for p in att.mix_parameters():
                p.normal_()
            if att.position_bias is not None:
                att.position_bias.normal_()
        y, _ = att(x, **kwargs)
        grads = torch.autograd.grad(y.square().sum(), [x, *att.parameters()])
        results[path] = (y, grads)
    assert calls == [1]  # the folded run, and only it, went through the fused kernel
    torch.testing.assert_close(results["folded"][0], results["explicit"][0])
    for folded, explicit in zip(results["folded"][1], results["explicit"][1]):
        torch.testing.assert_close(folded, explicit)


@pytest.mark.parametrize("path", ["explicit", "folded"])
def test_talking_heads_cached_and_beam_decoding_equal_the_full_forward_on_either_path(path,
                                                                                     monkeypatch):
    from heads_lab.model import kernels

    monkeypatch.setattr(kernels, "TALKING_HEADS_PATH", path)
    for variant in [v for v in VARIANTS if v.get("attention") == AttentionKind.talking_heads]:
        test_cached_decoding_equals_full_forward_for_every_variant(variant)
        test_beams_decode_over_their_sentences_memory_kept_once(variant)
