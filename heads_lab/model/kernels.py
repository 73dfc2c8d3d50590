"""The attention's numerics below the modules: softmax(q·kᵀ/√d + bias)·v as two batched matmuls
where that beats PyTorch's fused kernel (CPU, translation lengths), masked softmax, and the
key/value cache (append, reorder for beam search)."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor

from heads_lab.model.dropout import dropout

# One layer's incremental-decoding state: {"k": Tensor, "v": Tensor} [batch, heads, key, head_dim]
# (self-attention: views of "buffer_k" / "buffer_v", which have room to grow; an int "positions",
# if set, is the length to make room for at once).
KVCache = dict[str, "Tensor | int"]


CPU_BMM_MAX_KEYS = 512


def bmm_is_faster(q: Tensor, k: Tensor) -> bool:
    """On CPU, at translation lengths, two batched matmuls beat PyTorch's fused attention kernel:
    fwd+bwd at 64×8×20×32, 4.0 vs 9.5 ms in fp32, and under bf16 its backward is ~7× slower
    still. Past CPU_BMM_MAX_KEYS keys the fused kernel's memory saving wins."""
    return q.device.type == "cpu" and k.shape[2] <= CPU_BMM_MAX_KEYS


def bmm_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
                   p: float, rel: Tensor | None = None) -> Tensor:
    """softmax(q·kᵀ/√d + bias)·v with heads folded into the batch: one baddbmm adds the mask as
    a -inf bias and applies the scale, the softmax runs in at least fp32, one bmm applies it.
    Query heads sharing a key/value head (grouped / multi-query) are stacked along the query
    axis, so shared keys and values are never repeated. q [batch, heads, n, d], k and v
    [batch, kv_heads, m, d], mask [batch, 1, 1, m], rel (relative-position bias) [heads, n, m]
    → o [batch, heads, n, d]."""
    b, h, n, d = q.shape
    kv, m = k.shape[1], k.shape[2]
    g = h // kv
    bias = q.new_zeros(())  # 0 and -inf are exact in any float dtype
    if mask is not None:  # key padding, [batch, 1, 1, m] → [batch · kv, 1, m]
        pad = q.new_zeros(mask.shape)
        bias = pad.masked_fill_(~mask, float("-inf")).expand(b, kv, 1, m).reshape(b * kv, 1, m)
    if causal:  # query i (in each stacked group) sees keys ≤ i + m - n
        future = q.new_full((n, m), float("-inf")).triu(m - n + 1)
        bias = bias + (future.repeat(g, 1) if g > 1 else future)
    if rel is not None:  # [heads, n, m] → [kv, g · n, m], the same for every sentence
        bias = bias + rel.to(q.dtype).reshape(kv, g * n, m).repeat(b, 1, 1)
    keys = k.reshape(b * kv, m, d).transpose(1, 2)
    scores = torch.baddbmm(bias, q.reshape(b * kv, g * n, d), keys, alpha=d**-0.5)
    weights = scores.softmax(dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    weights = dropout(weights, p, True).to(v.dtype) if p else weights.to(v.dtype)
    return torch.bmm(weights, v.reshape(b * kv, m, d)).view(b, h, n, d)


# Talking heads through one fused attention kernel (folded_talking_heads) or the explicit
# matmul-mix-softmax-mix path: "auto" picks, per device, what measured faster (bench: talking
# heads rows); "explicit" / "folded" force one (HEADS_LAB_TALKING_HEADS_PATH, tests, the bench).
TALKING_HEADS_PATH = os.environ.get("HEADS_LAB_TALKING_HEADS_PATH", "auto")


def folded_is_faster(q: Tensor) -> bool:
    """Whether talking heads run folded (folded_talking_heads). On CPU the explicit path is
    faster: the folded scores cost h·h_K·d_k per query-key pair instead of h_K·d_k + h_K·h, and
    fwd+bwd of one layer at 64 × 20 tokens took 2.2-2.8× (fp32) and 4.7-6.8× (bf16) as long
    folded at h = 8, d_model 256-512 (15× at h = 32). On a GPU the fused kernel may win (no
    [batch, heads, n, m] tensors); until the GPU check has measured it, "auto" keeps the explicit
    path there too and HEADS_LAB_TALKING_HEADS_PATH=folded opts in."""
    if TALKING_HEADS_PATH in ("explicit", "folded"):
        return TALKING_HEADS_PATH == "folded"
    return False


def folded_talking_heads(q: Tensor, k: Tensor, v: Tensor, logits_mix: Tensor | None,
                         weights_mix: Tensor | None, mask: Tensor | None, causal: bool,
                         rel: Tensor | None, scale: float) -> Tensor:
    """Talking heads as one multi-query attention: softmax head h's logits are
    L_h = Σ_k P_l[k, h] Q_k K_kᵀ·s = Q̃_h K̃ᵀ·s, with Q̃_h = concat_k P_l[k, h] Q_k and K̃ = concat_k
    K_k (h_K · d_k wide, one key head shared by every softmax head), and value head v's output
    is O_v = Σ_h P_w[h, v] W_h V_v: every softmax head attends over all value heads concatenated
    (h_V · d_v wide) and P_w mixes the results. A mix left out (None) is the identity. Exact to the
    explicit path; no [batch, heads, n, m] tensor is kept (the kernel's own). No attention dropout
    (it would fall on W, not on the mixed U). q, k [batch, h_K, n|m, d], v [batch, h_V, m, d],
    mask [batch, 1, 1, m], rel [h, n, m] → o [batch, h_V, n, d]."""
    b, h_k, n, d = q.shape
    m, h_v = k.shape[2], v.shape[1]
    if logits_mix is None:  # L = J: softmax head h reads query/key head h alone
        logits_mix = torch.eye(h_k, dtype=q.dtype, device=q.device)
    h = logits_mix.shape[1]
    qt = torch.einsum("bknd,kh->bhnkd", q, logits_mix.to(q.dtype)).reshape(b, h, n, h_k * d)
    kt = k.transpose(1, 2).reshape(b, 1, m, h_k * d)
    vt = v.transpose(1, 2).reshape(b, 1, m, h_v * d)
    bias = None
    if rel is not None or (causal and n != m):  # one additive mask: bias, -inf where masked
        base = rel[None].to(q.dtype) if rel is not None else q.new_zeros(1, 1, n, m)
        bias, causal = fill_masked(base, mask, causal), False
    a = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias if bias is not None else mask,
                                       is_causal=causal, scale=scale, enable_gqa=True)
    a = a.view(b, h, n, h_v, d)  # softmax head h's weights over value head v's values
    if weights_mix is None:  # U = W (h_V = h): value head v is softmax head v's
        idx = torch.arange(h, device=q.device)
        return a[:, idx, :, idx].permute(1, 0, 2, 3)
    return torch.einsum("bhnvd,hv->bvnd", a, weights_mix.to(a.dtype))


def fill_masked(x: Tensor, mask: Tensor | None, causal: bool, inplace: bool = False) -> Tensor:
    """`x` [.., query, key] with masked keys (mask False) and, if causal, future keys at -inf;
    `inplace` fills `x` itself (safe when nothing else needs it for backward)."""
    fill = torch.Tensor.masked_fill_ if inplace else torch.Tensor.masked_fill
    if mask is not None:
        x = fill(x, ~mask, float("-inf"))
    if causal:
        n, m = x.shape[-2:]
        future = torch.ones(n, m, dtype=torch.bool, device=x.device).triu(m - n + 1)
        x = fill(x, future, float("-inf"))
    return x


def masked_softmax(logits: Tensor, mask: Tensor | None, causal: bool, inplace: bool = False):
    """Softmax over keys, in at least fp32, of `fill_masked(logits, ...)`."""
    logits = fill_masked(logits, mask, causal, inplace)
    return logits.softmax(dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))


def append_cache(cache: KVCache, key: str, new: Tensor) -> Tensor:
    """Self-attention cache: append `new` [batch, heads, n, head_dim] along the key axis and
    return the whole [batch, heads, t + n, head_dim]. Positions go into a buffer with spare
    capacity (doubled when full), so a step writes only its own keys instead of copying all
    earlier ones (torch.cat); the cache entry is a view of the buffer's first t + n positions.
    The first buffer has room for the cache's "positions" when set (a decoder's length limit)."""
    old = cache.get(key)
    t = 0 if old is None else old.shape[2]
    end = t + new.shape[2]
    buf = cache.get(f"buffer_{key}")
    if buf is None or buf.shape[2] < end:
        b, h, _, d = new.shape
        room = cache.get("positions", 0)
        grown = new.new_empty(b, h, room if room >= end else max(16, 2 * end), d)
        if old is not None:
            grown[:, :, :t] = old
        buf = cache[f"buffer_{key}"] = grown
    buf[:, :, t:end] = new
    cache[key] = buf[:, :, :end]
    return cache[key]


def reorder_cache(caches: list[KVCache], order: Tensor) -> None:
    """Beam search: row i of every self-attention cache becomes row order[i]. The rows are
    gathered straight into a second buffer of the same capacity (kept from the previous step, so
    nothing is allocated), which becomes the cache: one pass over the cached positions, and the
    next append writes in place instead of copying them into a new buffer."""
    for cache in caches:
        for key in ("k", "v"):
            if key not in cache:
                continue
            old, buf = cache[key], cache.get(f"buffer_{key}")
            if buf is None:
                cache[key] = old.index_select(0, order)
                continue
            spare = cache.get(f"spare_{key}")
            if spare is None or spare.shape != buf.shape:
                spare = torch.empty_like(buf)
            t = old.shape[2]
            torch.index_select(old, 0, order, out=spare[:, :, :t])
            cache[f"buffer_{key}"], cache[f"spare_{key}"] = spare, buf
            cache[key] = spare[:, :, :t]
