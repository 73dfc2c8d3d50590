"""Multi-head attention (Vaswani et al. 2017), the one place where heads live.

Shapes use named axes: batch, heads, query (n positions), key (m positions), head_dim (d_k = d_v).
The three steps are separate methods so head variants change one step, not the module:
  project  x → q [batch, heads, query, head_dim], k, v [batch, heads, key, head_dim]
  attend   q, k, v → o [batch, heads, query, head_dim] (+ weights [batch, heads, query, key])
  merge    o → y [batch, query, d_model]
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# One layer's incremental-decoding state: {"k": Tensor, "v": Tensor} [batch, heads, key, head_dim].
KVCache = dict[str, Tensor]


class MultiHeadAttention(nn.Module):
    """`heads` heads of size `head_dim`. q, k, v projections are fused in `in_proj`
    [3 · heads · head_dim, d_model] (q, k, v stacked, torch.nn.MultiheadAttention's layout), so
    self-attention costs one GEMM; cross-attention projects the query and the memory apart."""

    def __init__(self, d_model: int, heads: int, head_dim: int, dropout: float = 0.0):
        super().__init__()
        self.heads, self.head_dim, self.dropout = heads, head_dim, dropout
        self.inner = heads * head_dim
        self.in_proj = nn.Linear(d_model, 3 * self.inner)
        self.out_proj = nn.Linear(self.inner, d_model)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x [batch, query, d_model]; memory [batch, key, d_model] for cross-attention (None:
        self-attention); mask [batch, 1, 1 or query, key], True where a key may be attended;
        causal: query i sees keys ≤ i. With a cache, self-attention appends this step's keys and
        values to it, and cross-attention projects the memory once and reuses it.
        Returns y [batch, query, d_model] and, if need_weights, the per-head attention weights
        [batch, heads, query, key] (after dropout, as used)."""
        q, k, v = self.project(x, memory, cache)
        o, weights = self.attend(q, k, v, mask, causal and cache is None, need_weights)
        return self.merge(o), weights

    def project(self, x: Tensor, memory: Tensor | None, cache: KVCache | None):
        if memory is None:  # self-attention: one GEMM for q, k, v
            q, k, v = self._split(F.linear(x, self.in_proj.weight, self.in_proj.bias), 3)
            if cache is not None:
                if "k" in cache:
                    k = torch.cat([cache["k"], k], dim=2)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
            return q, k, v
        w, b = self.in_proj.weight, self.in_proj.bias
        (q,) = self._split(F.linear(x, w[: self.inner], b[: self.inner]), 1)
        if cache is not None and "k" in cache:  # cross-attention memory projected once
            return q, cache["k"], cache["v"]
        k, v = self._split(F.linear(memory, w[self.inner :], b[self.inner :]), 2)
        if cache is not None:
            cache["k"], cache["v"] = k, v
        return q, k, v

    def _split(self, packed: Tensor, parts: int) -> tuple[Tensor, ...]:
        # packed [batch, len, parts · heads · head_dim] → parts × [batch, heads, len, head_dim]
        b, n, _ = packed.shape
        return packed.view(b, n, parts, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def attend(self, q, k, v, mask, causal: bool, need_weights: bool):
        p = self.dropout if self.training else 0.0
        if not need_weights:  # fused kernel; never materialises [batch, heads, query, key]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)
            return o, None
        logits = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        # logits [batch, heads, query, key]
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        if causal:
            n, m = logits.shape[-2:]
            future = torch.ones(n, m, dtype=torch.bool, device=q.device).triu(m - n + 1)
            logits = logits.masked_fill(future, float("-inf"))
        weights = F.dropout(logits.softmax(dim=-1), p=p)
        return torch.matmul(weights, v), weights

    def merge(self, o: Tensor) -> Tensor:
        # o [batch, heads, query, head_dim] → [batch, query, heads · head_dim] → [batch, query, d_model]
        b, _, n, _ = o.shape
        return self.out_proj(o.transpose(1, 2).reshape(b, n, self.inner))


def reorder_cache(caches: list[KVCache], order: Tensor) -> None:
    """Beam search: row i of every self-attention cache becomes row order[i]."""
    for cache in caches:
        for key in ("k", "v"):
            if key in cache:
                cache[key] = cache[key].index_select(0, order)
