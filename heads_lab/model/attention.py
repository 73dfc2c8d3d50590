"""Attention, the one place where heads live: multi-head (Vaswani et al. 2017) with grouped or
multi-query key/value heads, and talking heads (Shazeer et al. 2020).

Shapes use named axes: batch, heads, query (n positions), key (m positions), head_dim (d_k = d_v).
The three steps are separate methods so a head variant changes one step, not the module:
  project  x → q [batch, q_heads, query, head_dim], k [batch, k_heads, key, head_dim],
               v [batch, v_heads, key, head_dim]
  attend   q, k, v → o [batch, out_heads, query, head_dim] (+ weights [batch, heads, query, key])
  merge    o → y [batch, query, d_model]
Self-attention can add a learned relative-position bias to the logits (model.relative_positions
= K): one scalar per softmax head and offset key − query, offsets clipped to [−K, K] (Shaw et
al. 2018's clipping, T5's per-head scalar; zeros at the start, so the layer starts as without).
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heads_lab.config.sites import SITE
from heads_lab.errors import ConfigError
from heads_lab.model.dropout import dropout
from heads_lab.model.kernels import (
    KVCache,
    append_cache,
    bmm_attention,
    bmm_is_faster,
    fill_masked,
    folded_is_faster,
    folded_talking_heads,
    masked_softmax,
)


class Attention(nn.Module):
    """Shared by the head variants: the fused input projection, the cache, the output projection.
    `q_heads`, `k_heads`, `v_heads` heads of size `head_dim` come out of `in_proj`
    [(q_heads + k_heads + v_heads)·head_dim, d_model] (q rows, then k, then v), so
    self-attention is one GEMM; `attend` returns `out_heads` heads for `out_proj`."""

    def __init__(self, d_model: int, heads: int, head_dim: int, dropout: float,
                 q_heads: int, k_heads: int, v_heads: int, out_heads: int, relative: int = 0):
        super().__init__()
        self.heads, self.head_dim, self.dropout = heads, head_dim, dropout
        self.q_heads, self.k_heads, self.v_heads, self.out_heads = q_heads, k_heads, v_heads, out_heads
        self.sizes = (q_heads * head_dim, k_heads * head_dim, v_heads * head_dim)
        self.in_proj = nn.Linear(d_model, sum(self.sizes))
        self.out_proj = nn.Linear(out_heads * head_dim, d_model)
        # [heads, 2K + 1] bias per softmax head and clipped offset −K..K (None: off)
        self.relative = relative
        self.position_bias = nn.Parameter(torch.zeros(heads, 2 * relative + 1)) if relative else None

    variant = ""  # its entry in heads_lab.config.variants (map and out kinds, cost)

    def mix_parameters(self) -> list[nn.Parameter]:
        """Parameters that mix heads (talking heads' P_l and P_w); none here."""
        return []

    def kinds(self) -> dict[str, int]:
        """{kind: count} of its heads now (heads_lab.model.heads.KIND_NAMES)."""
        return {"head": self.heads}

    def keep_heads(self, keep: list[int]) -> None:
        """Remove every head of the out kind but `keep` for real (smaller projections); the
        result computes what the module did with the other heads masked. A variant whose heads
        cannot go one by one refuses."""
        raise ConfigError("removing heads needs plain multi-head attention (model.attention="
                          "mha without kv_heads); mask them instead with eval.head_mask")

    def relative_bias(self, n: int, m: int) -> Tensor | None:
        """[heads, query, key] bias of the offsets key − query, for n queries that are the last
        n of m positions (cached decoding: n = 1); None without relative positions."""
        if self.position_bias is None:
            return None
        device = self.position_bias.device
        queries = torch.arange(m - n, m, device=device)[:, None]
        offsets = (torch.arange(m, device=device)[None, :] - queries).clamp(-self.relative,
                                                                           self.relative)
        return self.position_bias[:, offsets + self.relative]

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
        Returns y [batch, query, d_model] and, if need_weights, the softmax weights of each head
        [batch, heads, query, key] (before attention dropout)."""
        if causal and cache is not None and x.shape[1] != 1:
            raise ValueError("cached causal self-attention takes one new position per call")
        if self.out_heads == 0:  # every head pruned away: the sublayer adds out_proj's bias
            return self.out_proj.bias.expand(x.shape[0], x.shape[1], -1), None
        rows, n = x.shape[:2]
        per = 1
        if memory is not None and cache and "k" in cache and cache["k"].shape[0] != rows:
            per = rows // max(1, cache["k"].shape[0])
            if per * cache["k"].shape[0] != rows:
                raise ValueError(f"cross-attention cache of {cache['k'].shape[0]} sentences for "
                                 f"{rows} query rows: rows must be whole multiples per sentence")
        if per > 1:  # `per` rows (beams) per sentence of the cached memory: one block of queries
            x = x.reshape(rows // per, per * n, x.shape[2])
        q, k, v = self.project(x, memory, cache)
        o, weights = self.attend(q, k, v, mask, causal and cache is None, need_weights)
        y = self.merge(o)
        if per > 1:
            y = y.view(rows, n, y.shape[2])
            if weights is not None:  # [sentence, heads, per · n, key] → [rows, heads, n, key]
                s, h, _, m = weights.shape
                weights = weights.view(s, h, per, n, m).transpose(1, 2).reshape(rows, h, n, m)
        return y, weights

    def project(self, x: Tensor, memory: Tensor | None, cache: KVCache | None):
        q_size = self.sizes[0]
        if memory is None:  # self-attention: one GEMM for q, k, v
            q, k, v = F.linear(x, self.in_proj.weight, self.in_proj.bias).split(self.sizes, -1)
            q, k, v = self._heads(q, self.q_heads), self._heads(k, self.k_heads), self._heads(v, self.v_heads)
            if cache is not None:
                k, v = append_cache(cache, "k", k), append_cache(cache, "v", v)
            return q, k, v
        w, b = self.in_proj.weight, self.in_proj.bias
        q = self._heads(F.linear(x, w[:q_size], b[:q_size]), self.q_heads)
        if cache is None:
            return (q, *self.project_memory(memory))
        if "k" not in cache:  # cross-attention memory projected once, at the first step
            self.cache_memory(cache, memory)
        return q, cache["k"], cache["v"]

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of the encoder memory [batch, src, d_model]."""
        q_size, w, b = self.sizes[0], self.in_proj.weight, self.in_proj.bias
        k, v = F.linear(memory, w[q_size:], b[q_size:]).split(self.sizes[1:], -1)
        return self._heads(k, self.k_heads), self._heads(v, self.v_heads)

    def cache_memory(self, cache: KVCache, memory: Tensor) -> None:
        """Fill a cross-attention cache with the keys and values of memory [sentences, src,
        d_model], for queries from any number of rows per sentence in a row (beam search's
        hypotheses): a call with `rows · sentences` query rows attends with each sentence's
        rows as one block of queries (cross-attention has no causal mask and no positional
        bias), so the memory is projected once per sentence and never repeated per beam."""
        k, v = self.project_memory(memory)  # contiguous once, so no later step copies them
        cache["k"], cache["v"] = k.contiguous(), v.contiguous()

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        # [batch, len, heads · head_dim] → [batch, heads, len, head_dim] (a view, no copy)
        b, n, _ = x.shape
        return x.view(b, n, heads, self.head_dim).transpose(1, 2)

    def merge(self, o: Tensor) -> Tensor:
        # o [batch, out_heads, query, head_dim] → [batch, query, out_heads · head_dim] → d_model
        b, _, n, _ = o.shape  # (masks and gates scale the heads in a pre-hook: heads_lab.model.heads)
        return self.out_proj(o.transpose(1, 2).reshape(b, n, self.out_heads * self.head_dim))


class MultiHeadAttention(Attention):
    """`heads` query heads sharing `kv_heads` key/value heads: grouped-query attention, with
    kv_heads = heads standard multi-head attention (torch.nn.MultiheadAttention's in_proj layout)
    and kv_heads = 1 multi-query attention (Shazeer 2019). Keeps PyTorch's fused SDPA kernel."""

    variant = "mha"  # its entry in heads_lab.config.variants

    def __init__(self, d_model: int, heads: int, head_dim: int, dropout: float = 0.0,
                 kv_heads: int | None = None, relative: int = 0):
        kv_heads = kv_heads or heads
        super().__init__(d_model, heads, head_dim, dropout, q_heads=heads, k_heads=kv_heads,
                         v_heads=kv_heads, out_heads=heads, relative=relative)

    @classmethod
    def from_config(cls, cfg, site: str) -> MultiHeadAttention:
        return cls(cfg.d_model, cfg.heads, cfg.d_head, cfg.attention_dropout, cfg.kv_heads,
                   cfg.relative_positions if SITE[site].self_attention else 0)

    @torch.no_grad()
    def keep_heads(self, keep: list[int]) -> None:
        if self.k_heads != self.q_heads:  # a shared key/value head serves several query heads
            super().keep_heads(keep)
        d, h = self.head_dim, self.q_heads
        rows = torch.tensor([part * h * d + head * d + i for part in range(3) for head in keep
                             for i in range(d)], dtype=torch.long, device=self.in_proj.weight.device)
        cols = rows[: len(keep) * d]
        with warnings.catch_warnings():  # a module losing every head: zero-element weights
            warnings.simplefilter("ignore", UserWarning)
            in_proj = nn.Linear(self.in_proj.in_features, len(rows)).to(self.in_proj.weight)
            out_proj = nn.Linear(len(cols), self.out_proj.out_features).to(self.out_proj.weight)
        in_proj.weight.copy_(self.in_proj.weight[rows])
        in_proj.bias.copy_(self.in_proj.bias[rows])
        out_proj.weight.copy_(self.out_proj.weight[:, cols])
        out_proj.bias.copy_(self.out_proj.bias)
        self.in_proj, self.out_proj = in_proj, out_proj
        n = len(keep)
        self.heads = self.q_heads = self.k_heads = self.v_heads = self.out_heads = n
        self.sizes = (n * d, n * d, n * d)
        if self.position_bias is not None:
            self.position_bias = nn.Parameter(self.position_bias[keep].clone())

    def attend(self, q, k, v, mask, causal: bool, need_weights: bool):
        p = self.dropout if self.training else 0.0
        grouped = self.k_heads != self.q_heads
        rel = self.relative_bias(q.shape[2], k.shape[2])
        if not need_weights:
            if bmm_is_faster(q, k):
                return bmm_attention(q, k, v, mask, causal, p, rel), None
            if rel is not None:  # the fused kernel takes one additive mask: bias, -inf masked
                mask, causal = fill_masked(rel[None].to(q.dtype), mask, causal), False
            # fused kernel; never materialises [batch, heads, query, key]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                               is_causal=causal, enable_gqa=grouped)
            return o, None
        if grouped:  # query head i reads key/value head i // (heads / kv_heads)
            group = self.q_heads // self.k_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        logits = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        # logits [batch, heads, query, key]
        if rel is not None:
            logits = logits + rel
        weights = masked_softmax(logits, mask, causal)
        return torch.matmul(dropout(weights, p, True), v), weights


class TalkingHeadsAttention(Attention):
    """Talking-heads attention: h_K query/key heads, h softmax heads, h_V value heads, mixed by
    learned projections across the head axis right before and right after the softmax:

      J[n, m, h_K] = Q·K / √d_k     L[n, m, h] = J · P_l[h_K, h]     W = softmax_m(L)
      U[n, m, h_V] = W · P_w[h, h_V]     O[n, d_v, h_V] = U · V     Y = O · P_o

    Masked keys get -inf in L, so they carry zero weight in W and hence in U. How P_l and P_w
    start (`mix_init`): by default a square mix starts as the identity, so with h_K = h = h_V the
    layer starts as exactly the multi-head attention with the same projections and a talking-heads
    vs MHA comparison starts from the same function; a mix whose head counts differ starts as
    N(0, 1/fan-in) (the fan-in scaling of Shazeer et al.'s Mesh TensorFlow code, whose mixes
    start as a truncated normal of that std), since a rectangular identity would feed the surplus
    heads (h_V > h: value heads h.. get no weights; h > h_K: softmax heads h_K.. get no logits)
    nothing but noise, and they stay nearly unused (value heads 4-7 of a trained h = 4, h_V = 8
    model: ~0.05 importance vs ~0.5; results/README.md). `identity` (eye plus N(0, 0.01²) where
    not square, the earlier start) and `normal` force one start for both mixes. The [batch, heads,
    n, m] tensors are J, W and U (the n·m·(h_K + h + h_V) activation term); the mixes are single
    matmuls over the head axis on contiguous views, with no transposed copies.

    `mixes` keeps one mix only (Shazeer et al.'s ablation): "logits" drops P_w (U = W, so h_V =
    h), "weights" drops P_l (L = J, so h = h_K); the layer then computes exactly what the
    formulas above do with that mix the identity, without its parameters and matmul."""

    variant = "talking_heads"

    def __init__(self, d_model: int, heads: int, head_dim: int, dropout: float = 0.0,
                 heads_k: int | None = None, heads_v: int | None = None, relative: int = 0,
                 mix_init: str | None = None, mixes: str | None = None):
        heads_k, heads_v = heads_k or heads, heads_v or heads
        mixes = str(getattr(mixes, "value", mixes) or "both")
        if mixes not in ("both", "logits", "weights"):
            raise ConfigError(f"model.mixes={mixes} is unknown: choose both, logits or weights")
        if (mixes == "logits" and heads_v != heads) or (mixes == "weights" and heads_k != heads):
            raise ConfigError(f"model.mixes={mixes} needs model.heads_{'v' if mixes == 'logits' else 'k'}"
                              f" = model.heads ({heads}): without the other mix nothing maps one "
                              "count of heads to the other")
        super().__init__(d_model, heads, head_dim, dropout, q_heads=heads_k, k_heads=heads_k,
                         v_heads=heads_v, out_heads=heads_v, relative=relative)
        self.mixes = mixes
        # P_l [h_K, h] and P_w [h, h_V]; a mix left out is None (the identity, not stored)
        self.logits_mix = (nn.Parameter(_mix_init(heads_k, heads, mix_init))
                           if mixes != "weights" else None)
        self.weights_mix = (nn.Parameter(_mix_init(heads, heads_v, mix_init))
                            if mixes != "logits" else None)

    def mix_parameters(self) -> list[nn.Parameter]:
        return [p for p in (self.logits_mix, self.weights_mix) if p is not None]

    def mix_rows(self) -> dict[str, nn.Parameter]:
        """{kind: the mix whose rows are that kind's heads}: P_l's rows are the query/key heads,
        P_w's the softmax heads (what importance scales per head)."""
        return {kind: p for kind, p in (("qk", self.logits_mix), ("softmax", self.weights_mix))
                if p is not None}

    def same_heads(self) -> dict[str, str]:
        """{kind: the kind it is the same heads as} where a mix is left out: without P_w each
        softmax head is its value head, without P_l each query/key head its softmax head."""
        return {"both": {}, "logits": {"softmax": "value"},
                "weights": {"qk": "softmax"}}[self.mixes]

    def kinds(self) -> dict[str, int]:
        return {"qk": self.q_heads, "softmax": self.heads, "value": self.v_heads}

    @classmethod
    def from_config(cls, cfg, site: str) -> TalkingHeadsAttention:
        return cls(cfg.d_model, cfg.heads, cfg.d_head, cfg.attention_dropout, cfg.heads_k,
                   cfg.heads_v, cfg.relative_positions if SITE[site].self_attention else 0,
                   cfg.mix_init, cfg.mixes)

    def attend(self, q, k, v, mask, causal: bool, need_weights: bool):
        p = self.dropout if self.training else 0.0
        if not need_weights and not p and folded_is_faster(q):  # one fused kernel (GPU)
            rel = self.relative_bias(q.shape[2], k.shape[2])
            return folded_talking_heads(q, k, v, self.logits_mix, self.weights_mix, mask, causal,
                                        rel, self.head_dim**-0.5), None
        b, h_k, n, _ = q.shape
        m = k.shape[2]
        h, h_v = self.heads, self.v_heads
        j = torch.matmul(q * self.head_dim**-0.5, k.transpose(-2, -1))  # J [batch, h_K, n, m]
        logits = (torch.matmul(self.logits_mix.t(), j.view(b, h_k, n * m)).view(b, h, n, m)
                  if self.logits_mix is not None else j)  # L
        rel = self.relative_bias(n, m)
        if rel is not None:  # per softmax head, after the mix
            logits = logits + rel
        # in place: no backward needs L (nor J, when L is J: QKᵀ's backward keeps Q and K)
        weights = masked_softmax(logits, mask, causal, inplace=True)  # W [batch, h, n, m]
        mixed = (torch.matmul(self.weights_mix.t(), weights.view(b, h, n * m)).view(b, h_v, n, m)
                 if self.weights_mix is not None else weights)  # U [batch, h_V, n, m]
        o = torch.matmul(dropout(mixed, p, True), v)  # O [batch, h_V, n, head_dim]
        return o, weights if need_weights else None


# each variant of heads_lab.config.variants by name: its module
MODULES: dict[str, type[Attention]] = {"mha": MultiHeadAttention,
                                       "talking_heads": TalkingHeadsAttention}


def _mix_init(rows: int, cols: int, how: str | None = None) -> Tensor:
    """A talking-heads mix [rows (heads in), cols (heads out)]: None = identity if square, else
    normal; identity = eye (+ N(0, 0.01²) if not square); normal = N(0, 1/rows)."""
    how = str(how) if how is not None else ("identity" if rows == cols else "normal")
    if how == "normal":
        return torch.randn(rows, cols) / math.sqrt(rows)
    if how != "identity":
        raise ConfigError(f"model.mix_init={how} is unknown: choose identity, normal or null")
    mix = torch.eye(rows, cols)
    if rows != cols:
        mix += 0.01 * torch.randn(rows, cols)
    return mix


