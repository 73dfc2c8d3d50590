"""Attention against torch.nn.MultiheadAttention and a float64 einsum, with copied weights."""

from __future__ import annotations

import pytest
import torch

from heads_lab.config.schemas import ModelConfig
from heads_lab.model import MultiHeadAttention, Transformer, count_parameters

D, H = 32, 4


def _pair(heads: int = H):
    torch.manual_seed(0)
    ours = MultiHeadAttention(D, heads, D // heads).double().eval()
    ref = torch.nn.MultiheadAttention(D, heads, batch_first=True).double().eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(ours.in_proj.weight)
        ref.in_proj_bias.copy_(ours.in_proj.bias)
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ours, ref


def _padding(lengths: list[int], m: int) -> torch.Tensor:
    return torch.arange(m)[None, :] >= torch.tensor(lengths)[:, None]  # True = padding


@pytest.mark.parametrize("need_weights", [False, True])
def test_self_attention_with_padding_matches_torch(need_weights):
    ours, ref = _pair()
    x = torch.randn(3, 7, D, dtype=torch.float64)
    pad = _padding([7, 4, 1], 7)
    y, w = ours(x, mask=~pad[:, None, None, :], need_weights=need_weights)
    y_ref, w_ref = ref(x, x, x, key_padding_mask=pad, average_attn_weights=False)
    torch.testing.assert_close(y, y_ref)
    if need_weights:
        assert w.shape == (3, H, 7, 7)
        torch.testing.assert_close(w, w_ref)
        assert torch.all(w[pad[:, None, None, :].expand_as(w)] == 0)  # no weight on padding


@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_self_attention_matches_torch(need_weights):
    ours, ref = _pair()
    x = torch.randn(2, 6, D, dtype=torch.float64)
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    y, w = ours(x, causal=True, need_weights=need_weights)
    y_ref, w_ref = ref(x, x, x, attn_mask=future, average_attn_weights=False)
    torch.testing.assert_close(y, y_ref)
    if need_weights:
        torch.testing.assert_close(w, w_ref)


@pytest.mark.parametrize("need_weights", [False, True])
def test_cross_attention_matches_torch(need_weights):
    ours, ref = _pair()
    q = torch.randn(2, 5, D, dtype=torch.float64)
    memory = torch.randn(2, 9, D, dtype=torch.float64)
    pad = _padding([9, 3], 9)
    y, w = ours(q, memory, mask=~pad[:, None, None, :], need_weights=need_weights)
    y_ref, w_ref = ref(q, memory, memory, key_padding_mask=pad, average_attn_weights=False)
    torch.testing.assert_close(y, y_ref)
    if need_weights:
        torch.testing.assert_close(w, w_ref)


def test_matches_float64_einsum_with_custom_head_dim():
    """head_dim apart from d_model / heads (so torch's module cannot be the reference)."""
    torch.manual_seed(1)
    heads, dk = 3, 5
    attn = MultiHeadAttention(D, heads, dk).double().eval()
    x = torch.randn(2, 4, D, dtype=torch.float64)
    y, w = attn(x, need_weights=True)
    wq, wk, wv = attn.in_proj.weight.view(3, heads, dk, D)
    bq, bk, bv = attn.in_proj.bias.view(3, heads, dk)
    q = torch.einsum("bnd,hkd->bhnk", x, wq) + bq[None, :, None]
    k = torch.einsum("bmd,hkd->bhmk", x, wk) + bk[None, :, None]
    v = torch.einsum("bmd,hkd->bhmk", x, wv) + bv[None, :, None]
    weights = (torch.einsum("bhnk,bhmk->bhnm", q, k) / dk**0.5).softmax(-1)
    o = torch.einsum("bhnm,bhmk->bnhk", weights, v).reshape(2, 4, heads * dk)
    expected = o @ attn.out_proj.weight.T + attn.out_proj.bias
    torch.testing.assert_close(w, weights)
    torch.testing.assert_close(y, expected)
    y_fused, _ = attn(x)  # the SDPA path agrees too
    torch.testing.assert_close(y_fused, expected)


def test_parameter_count_independent_of_heads_when_head_dim_is_d_model_over_h():
    vocab, d, ff, layers = 100, 64, 128, 2
    totals = set()
    for heads in (1, 2, 4, 8, 16, 32):
        cfg = ModelConfig(d_model=d, heads=heads, d_ff=ff, encoder_layers=layers,
                          decoder_layers=layers)
        counts = count_parameters(Transformer(cfg, vocab))
        totals.add(counts["total"])
        attn_modules = layers + 2 * layers  # encoder self, decoder self + cross
        assert counts["attention"] == attn_modules * (4 * d * d + 4 * d)
        assert counts["embeddings"] == vocab * d  # shared with the output layer
        ffn = (2 * layers) * (2 * d * ff + ff + d)
        norms = (2 * layers + 3 * layers + 2) * 2 * d  # + final norms (pre-norm)
        assert counts["total"] == vocab * d + counts["attention"] + ffn + norms
    assert len(totals) == 1


def test_head_dim_sets_attention_parameters():
    """With head_dim fixed, attention parameters grow with heads: 4·h·d_k·d + 3·h·d_k + d each."""
    d = 64
    for heads, dk in ((4, 8), (4, 16), (3, 7)):
        counts = count_parameters(Transformer(ModelConfig(d_model=d, heads=heads, head_dim=dk), 50))
        inner = heads * dk
        assert counts["attention"] == 9 * (4 * inner * d + 3 * inner + d)  # 3 + 2·3 modules


@pytest.mark.parametrize("kv_heads", [1, 2, 8])
@pytest.mark.parametrize("case", ["padded", "causal", "padded-causal", "cross"])
def test_cpu_bmm_attention_equals_torch_sdpa_in_float64(case, kv_heads):
    """The CPU path (heads folded into the batch, mask as a baddbmm bias, grouped query heads
    stacked on the query axis) against PyTorch's own scaled_dot_product_attention."""
    import torch.nn.functional as F

    from heads_lab.model.kernels import bmm_attention

    torch.manual_seed(4)
    b, h, n, d = 3, 8, 5, 4
    m = 7 if case == "cross" else n
    q = torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, kv_heads, m, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, kv_heads, m, d, dtype=torch.float64, requires_grad=True)
    mask = None if case == "causal" else ~_padding([m, 2, m - 3], m)[:, None, None, :]
    causal = "causal" in case
    ours = bmm_attention(q, k, v, mask, causal, 0.0)
    bias = None
    if mask is not None or causal:
        bias = torch.ones(b, 1, n, m, dtype=torch.bool)
        if mask is not None:
            bias = bias & mask
        if causal:
            bias = bias & torch.ones(n, m, dtype=torch.bool).tril()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=kv_heads != h)
    torch.testing.assert_close(ours, ref)
    g = torch.randn_like(ours)
    grads = torch.autograd.grad(ours, (q, k, v), g)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    for a, r in zip(grads, ref_grads):
        torch.testing.assert_close(a, r)


def test_long_key_sequences_use_the_fused_kernel_on_cpu():
    from heads_lab.model.kernels import CPU_BMM_MAX_KEYS, bmm_is_faster

    q = torch.zeros(1, 1, 1, 4)
    assert bmm_is_faster(q, torch.zeros(1, 1, CPU_BMM_MAX_KEYS, 4))
    assert not bmm_is_faster(q, torch.zeros(1, 1, CPU_BMM_MAX_KEYS + 1, 4))
