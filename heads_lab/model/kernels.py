"""The attention's numerics below the modules: softmax(q·kᵀ/√d + bias)·v as two batched matmuls
where that beats PyTorch's fused kernel (CPU, translation lengths), masked softmax, and the
key/value cache (append, reorder for beam search)."""

from __future__ import annotations

import torch
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
