"""Talking heads and grouped/multi-query heads against independent references."""

from __future__ import annotations

import pytest
import torch

from heads_lab.config import AttentionKind, ModelConfig
from heads_lab.model import MultiHeadAttention, TalkingHeadsAttention, Transformer

D = 24


def _padding_mask(lengths: list[int], m: int) -> torch.Tensor:
    return (torch.arange(m)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]  # True=keep


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
    x = torch.randn(2, 5, D, dtype=torch.float64)
    memory = torch.randn(2, 7, D, dtype=torch.float64)
    kwargs = {"padded-self": dict(mask=_padding_mask([5, 2], 5)), "causal-self": dict(causal=True),
              "cross": dict(memory=memory, mask=_padding_mask([7, 3], 7))}[case]
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
    torch.testing.assert_close(att.mixed_weights, u_ref)  # U: the mixed weights actually used
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    assert not torch.allclose(att.mixed_weights.sum(-1), torch.ones(2, hv, 5, dtype=torch.float64))
    masked = ~keep[:, None].expand_as(att.mixed_weights)
    assert torch.all(att.mixed_weights[masked] == 0)  # masked keys: zero weight after mixing too
    y_fast, _ = att(x, None if case != "cross" else memory, mask=None if case == "causal-self"
                    else mask, causal=case == "causal-self")
    torch.testing.assert_close(y_fast, y_ref)


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


@pytest.mark.parametrize("variant", [
    dict(attention=AttentionKind.talking_heads, heads=6, heads_k=2, heads_v=3, head_dim=8),
    dict(attention=AttentionKind.talking_heads, heads=4, talking_heads_in=["dec-enc"]),
    dict(kv_heads=1),
    dict(kv_heads=2),
])
def test_cached_decoding_equals_full_forward_for_every_variant(variant):
    torch.manual_seed(0)
    cfg = ModelConfig(**{"d_model": 32, "heads": 4, "d_ff": 64, "encoder_layers": 1,
                         "decoder_layers": 2, "dropout": 0.0, **variant})
    model = Transformer(cfg, 40).double().eval()
    src = torch.randint(4, 40, (2, 6))
    src[1, 4:] = 0
    tgt = torch.randint(4, 40, (2, 5))
    full = model(src, tgt)
    enc, caches = model.encode(src), model.new_caches()
    steps = [model.logits(model.decode(tgt[:, t : t + 1], enc, caches=caches, offset=t))
             for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, 1), full)


def test_talking_heads_sites_are_switchable():
    cfg = ModelConfig(d_model=32, heads=4, attention=AttentionKind.talking_heads,
                      talking_heads_in=["enc-self", "dec-enc"])
    model = Transformer(cfg, 30)
    assert isinstance(model.encoder[0].self_attn, TalkingHeadsAttention)
    assert isinstance(model.decoder[0].cross_attn, TalkingHeadsAttention)
    assert not isinstance(model.decoder[0].self_attn, TalkingHeadsAttention)


def test_mixes_start_as_identity_when_head_counts_match():
    square = TalkingHeadsAttention(D, 4, 6)
    assert torch.equal(square.logits_mix, torch.eye(4)) and torch.equal(square.weights_mix, torch.eye(4))
    rect = TalkingHeadsAttention(D, 6, 4, heads_k=2, heads_v=3)
    assert rect.logits_mix.shape == (2, 6) and rect.weights_mix.shape == (6, 3)
    assert torch.allclose(rect.logits_mix, torch.eye(2, 6), atol=0.1)
