"""Layer-wise relevance propagation per head (Voita et al. 2019, Fig. 1a and App. A; Ding et al.
2017): how much of the model's top-1 prediction reaches each head.

Voita et al.: relevance is seeded with the top-1 logit at each target position and propagated
back through the decoder and the encoder; "the relevance of a head is the relevance of its
output" — here what reaches the input of the layer's output projection, summed over positions
and dimensions — normalised over the heads of its layer and averaged over target tokens.
Seeding: the decoder is teacher-forced on the *reference* translation, and at each position the
seed is the model's top-1 logit given that reference prefix (not a decoded hypothesis), one
relevance pass per target token. Normalisation: per target token, a head's share is its |R|
over Σ |R| of its layer's heads (|·| because LRP relevance can be negative), then averaged.

What heads-lab follows: the rule of the paper's Appendix A (the LRP of Ding et al. 2017, a z
rule on the forward values), with the attention weights held constant (CP-LRP) and LayerNorm's
σ held constant (AttnLRP's treatment). It does not follow Voita et al.'s 2019 code
(the-story-of-heads lib/layers/lrp.py), whose default is an α = β = 0.5 (z⁺) rule with |·|
cropping and a rescaling of the relevance per layer. In detail:
- Every linear map y = W·x + b (the attention projections, the feed-forward layers, the tied
  output layer): the z rule, z_{j←i} = W_ji·x_i + b_j / d_in: the bias's share spread evenly
  over the inputs (a zero reference input), so R_i = Σ_j R_j·z_{j←i} / (y_j + ε·sign(y_j)) and
  nothing is absorbed by biases: relevance is conserved (up to ε). The α-β rule would need every
  layer's full Jacobian; the z rule needs one product with Wᵀ. One exception, the attention's
  output projection, where the heads' relevance is read: its bias's share is split over its
  inputs in proportion to their contributions W_ji·x_i (still conserved), so a masked head (an
  input of 0) gets exactly 0 and a head the output depends on alone gets all of it; spread
  evenly, the bias gave a masked head 0.1–0.5 % of its layer.
- LayerNorm: its statistic σ is held constant (as a number, not a function of the input), so
  y = γ·(x − mean x)/σ + β is linear and takes the z rule (β spread like a bias). Elementwise
  activations (ReLU, GELU) and Admin's skip scale pass relevance through unchanged (any
  conserving rule on a one-input function does).
- Attention: the weights (softmax, and talking heads' mixes of them) are held constant, so a
  head's output is linear in the values and its relevance goes to the values by the z rule
  (through autograd on the module's own `attend`, so every head variant is covered); queries and
  keys get none. This is "attention as constant" (Voita's code's consider_attn_constant=True;
  Ali et al. 2022's CP-LRP); Voita's default also propagates through the softmax's Jacobian.
- Residual sums x + f: each summand gets its share of the sum (the z rule on an addition).
- A head's relevance is taken at the heads whose outputs enter the output projection: the heads
  for multi-head attention, the value heads (h_V) for talking heads. LRP relevance can be
  negative (a head working against the prediction); a head's share of its layer is its
  |relevance| over the sum of |relevance| over the layer's heads, per target token, then
  averaged over the target tokens of every sentence (so a layer's shares sum to 1: how much of
  the layer's relevance passes through each head, whatever its sign).

With ε = 0, zero biases, ReLU, and the softmax and LayerNorm statistics held constant, the whole
network is linear and homogeneous in its inputs, so this LRP-0 equals gradient × input (a test
checks it), and relevance is conserved layer by layer (another test checks it).

Why by hand: lxt 2.1 ("LRP eXplains Transformers") patches Hugging Face model classes and
requires transformers, accelerate, bitsandbytes and open_clip_torch (which pulls torchvision,
which does not load beside the CPU torch wheel used here); zennit's rules attach to nn.Linear
modules through hooks, but heads-lab's attention applies its input projection with F.linear
(one GEMM for q, k, v) and its weights × values product is no module; captum's LRP covers a
fixed list of layer types, attention not among them. The rules above are each a few lines on
the forward values, with the module's own `attend` for the attention step, and run on every
head variant without changing the model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heads_lab.data import Split, collate
from heads_lab.model import evaluating
from heads_lab.model.heads import attention_modules
from heads_lab.output.progress import steps

EPS = 1e-6

log = logging.getLogger(__name__)


def _stab(y: Tensor, eps: float) -> Tensor:
    """y + ε·sign(y), sign(0) = +1, so nothing is divided by zero."""
    return y + eps * torch.where(y >= 0, 1.0, -1.0).to(y.dtype) if eps else y


def linear_rel(x: Tensor, weight: Tensor, bias: Tensor | None, R: Tensor, eps: float,
               proportional: bool = False) -> Tensor:
    """Relevance of x [..., d_in] from R [seeds, ..., d_out] through y = x·Wᵀ + b (z rule, the
    bias's share spread evenly over the d_in inputs). `proportional`: the bias's share split
    over the inputs in proportion to their contributions W_ji·x_i instead (R_i = Σ_j R_j ·
    W_ji·x_i / Σ_k W_jk·x_k: still conserved, and an input that is 0 — a masked head — gets 0)."""
    if proportional:
        s = R / _stab(F.linear(x, weight), eps)
        return x * (s @ weight.to(s.dtype))
    s = R / _stab(F.linear(x, weight, bias), eps)
    out = x * (s @ weight.to(s.dtype))
    if bias is not None:
        out = out + (s * bias).sum(-1, keepdim=True) / x.shape[-1]
    return out


def norm_rel(norm: nn.Module, x: Tensor, R: Tensor, eps: float) -> Tensor:
    """Relevance of x through a LayerNorm with σ held constant (Identity: unchanged)."""
    if not isinstance(norm, nn.LayerNorm):
        return R
    sigma = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    s = R / _stab(norm(x), eps)
    gs = s * norm.weight
    out = x / sigma * (gs - gs.mean(-1, keepdim=True))
    return out + (s * norm.bias).sum(-1, keepdim=True) / x.shape[-1]


def sum_rel(parts: list[Tensor], R: Tensor, eps: float) -> list[Tensor]:
    """Relevance of each summand of y = Σ parts."""
    s = R / _stab(sum(parts), eps)
    return [p * s for p in parts]


@dataclass
class _Attn:
    """One attention call's forward values, for its relevance pass."""

    module: nn.Module
    x: Tensor  # queries' input [1, n, d]
    source: Tensor  # keys' and values' input (x for self-attention)
    q: Tensor
    k: Tensor
    v: Tensor
    merged: Tensor  # the heads' outputs, out_proj's input [1, n, heads · head_dim]
    mask: Tensor | None
    causal: bool


def _attention(module, x: Tensor, memory: Tensor | None, mask, causal: bool,
               frozen: bool = False) -> tuple[Tensor, _Attn]:
    q, k, v = module.project(x, memory, None)
    # the explicit path (no fused kernel); frozen: gradients reach the values only
    o, _ = module.attend(q.detach() if frozen else q, k.detach() if frozen else k, v, mask,
                         causal, True)
    b, _, n, _ = o.shape
    merged = o.transpose(1, 2).reshape(b, n, module.out_heads * module.head_dim)
    # what out_proj reads: with head gates or masks (heads_lab.model.heads' pre-hooks) each head's
    # output scaled by its gate; relevance passes such a scale unchanged
    seen: list[Tensor] = []
    handle = module.out_proj.register_forward_hook(lambda _, inputs, __: seen.append(inputs[0]))
    try:
        y = module.out_proj(merged)
    finally:
        handle.remove()
    return y, _Attn(module, x, x if memory is None else memory, q, k, v, seen[0], mask, causal)


def _attention_rel(a: _Attn, R: Tensor, eps: float, heads: list[Tensor]) -> tuple[Tensor, Tensor]:
    """(relevance of the queries' input, of the keys' and values' input) from R at the output;
    appends the heads' relevance [seeds, heads] to `heads`."""
    m = a.module
    # the output projection's bias is split over the heads by their contributions, not evenly:
    # a masked head (its input 0) gets none, a head the logit depends on alone gets all of it
    R_merged = linear_rel(a.merged, m.out_proj.weight, m.out_proj.bias, R, eps,
                          proportional=True)
    seeds, _, n, _ = R_merged.shape
    heads.append(R_merged.view(seeds, n, m.out_heads, m.head_dim).sum(dim=(1, 3)))
    R_o = R_merged.view(seeds, n, m.out_heads, m.head_dim).transpose(1, 2)  # [seeds, H, n, d]
    # the heads' outputs are linear in the values, the weights held constant: R_v by the z rule
    v = a.v.expand(seeds, *a.v.shape[1:]).detach().requires_grad_(True)
    q, k = (t.detach().expand(seeds, *t.shape[1:]) for t in (a.q, a.k))
    mask = None if a.mask is None else a.mask.expand(seeds, *a.mask.shape[1:])
    with torch.enable_grad():
        o, _ = m.attend(q, k, v, mask, a.causal, True)
        s = R_o / _stab(o.detach(), eps)
        (grad,) = torch.autograd.grad(o, v, s)
    R_v = (v.detach() * grad).transpose(1, 2).reshape(seeds, 1, v.shape[2], -1)  # [s, 1, m, hv·d]
    sizes = m.sizes
    w, bias = m.in_proj.weight, m.in_proj.bias
    kv = slice(sizes[0], None)
    R_kv = torch.cat([R_v.new_zeros(*R_v.shape[:3], sizes[1]), R_v], dim=-1)  # keys get none
    R_source = linear_rel(a.source, w[kv], bias[kv], R_kv, eps)
    return torch.zeros_like(R), R_source


def _norm(norm: nn.Module, x: Tensor, frozen: bool) -> Tensor:
    """norm(x); frozen: σ held constant for gradients (the LayerNorm LRP takes)."""
    if not frozen or not isinstance(norm, nn.LayerNorm):
        return norm(x)
    sigma = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt().detach()
    return (x - x.mean(-1, keepdim=True)) / sigma * norm.weight + norm.bias


def _residual(res, x: Tensor, f, frozen: bool) -> tuple[Tensor, tuple]:
    """res(x, f) step by step: (its output, what its relevance pass needs)."""
    if res.pre:
        inner = _norm(res.norm, x, frozen)
        out, saved = f(inner)
        return x + out, (x, inner, out, saved)
    out, saved = f(x)
    skip = x * res.omega if res.omega is not None else x
    return _norm(res.norm, skip + out, frozen), (x, skip, out, saved)


def _residual_rel(res, saved: tuple, R: Tensor, f_rel, eps: float) -> Tensor:
    """Relevance of the residual block's input; f_rel(R_out, saved) → relevance of f's input."""
    if res.pre:
        x, inner, out, inner_saved = saved
        R_x, R_f = sum_rel([x, out], R, eps)
        return R_x + norm_rel(res.norm, x, f_rel(R_f, inner_saved), eps)
    x, skip, out, inner_saved = saved
    R_sum = norm_rel(res.norm, skip + out, R, eps)
    R_skip, R_f = sum_rel([skip, out], R_sum, eps)
    return R_skip + f_rel(R_f, inner_saved)  # ω ⊙ x passes relevance through


def _ffn(ffn, x: Tensor) -> tuple[Tensor, tuple]:
    h = ffn.act(ffn.fc1(x))
    return ffn.fc2(h), (x, h)


def _ffn_rel(ffn, saved: tuple, R: Tensor, eps: float) -> Tensor:
    x, h = saved
    R_h = linear_rel(h, ffn.fc2.weight, ffn.fc2.bias, R, eps)  # the activation passes it on
    return linear_rel(x, ffn.fc1.weight, ffn.fc1.bias, R_h, eps)


@dataclass
class Relevance:
    """One sentence's LRP: heads[(site, layer)] [seeds, heads] (raw, unnormalised), the seeds
    (top-1 logits) [seeds], the relevance reaching the encoder's and decoder's inputs
    [seeds, positions, d_model], and the total relevance at each layer boundary [seeds] (the
    decoder's stream plus what went to the encoder memory; then the encoder's stream plus the
    decoder's input): what conservation checks."""

    heads: dict[tuple[str, int], Tensor]
    seeds: Tensor
    src_input: Tensor
    tgt_input: Tensor
    totals: list[Tensor] = field(default_factory=list)


def forward(model, src: Tensor, tgt_in: Tensor, frozen: bool = False):
    """The model's teacher-forced forward, step by step (one sentence, [1, n] ids), keeping what
    the relevance pass needs: (logits [1, tgt, vocab], the tape). The values are the model's;
    `frozen` holds the attention weights and LayerNorm's σ constant for autograd, the network
    LRP-0 sees (tests compare its gradient × input with LRP)."""
    x_src = model.embed_tokens(src)
    mask = (src != model.pad_id)[:, None, None, :]
    x, enc = x_src, []
    for layer in model.encoder:
        x, s_self = _residual(layer.res_self, x, lambda h, L=layer: _attention(
            L.self_attn, h, None, mask, False, frozen), frozen)
        x, s_ffn = _residual(layer.res_ffn, x, lambda h, L=layer: _ffn(L.ffn, h), frozen)
        enc.append((layer, s_self, s_ffn))
    enc_out = x
    memory = _norm(model.encoder_norm, x, frozen)
    y_tgt = model.embed_tokens(tgt_in)
    y, dec = y_tgt, []
    for layer in model.decoder:
        y, s_self = _residual(layer.res_self, y, lambda h, L=layer: _attention(
            L.self_attn, h, None, None, True, frozen), frozen)
        y, s_cross = _residual(layer.res_cross, y, lambda h, L=layer: _attention(
            L.cross_attn, h, memory, mask, False, frozen), frozen)
        y, s_ffn = _residual(layer.res_ffn, y, lambda h, L=layer: _ffn(L.ffn, h), frozen)
        dec.append((layer, s_self, s_cross, s_ffn))
    hidden = _norm(model.decoder_norm, y, frozen)
    tape = {"x_src": x_src, "enc": enc, "enc_out": enc_out, "memory": memory, "y_tgt": y_tgt,
            "dec": dec, "dec_out": y, "hidden": hidden}
    return model.logits(hidden), tape


@torch.no_grad()
def relevance(model, src: Tensor, tgt_in: Tensor, eps: float = EPS) -> Relevance:
    """LRP of one sentence (src, tgt_in [1, n] ids, no padding), one seed per target position:
    its top-1 logit."""
    with evaluating(model):
        logits, t = forward(model, src, tgt_in)
    top = logits[0].argmax(-1)  # [tgt]
    n_tgt, emb = tgt_in.shape[1], model.embed.weight
    seeds = logits[0, torch.arange(n_tgt, device=logits.device), top]
    # the tied output layer (no bias): R_hidden[seed t] = hidden[t] ⊙ E[top_t] at position t
    R = t["hidden"].new_zeros(n_tgt, n_tgt, t["hidden"].shape[-1])
    idx = torch.arange(n_tgt, device=R.device)
    R[idx, idx] = t["hidden"][0] * emb[top].to(R.dtype) * (seeds / _stab(seeds, eps))[:, None]
    R = R[:, None]  # [seeds, batch 1, tgt, d]
    heads: dict[tuple[str, int], list[Tensor]] = {}
    totals = [R.sum(dim=(1, 2, 3))]
    R = norm_rel(model.decoder_norm, t["dec_out"], R, eps)
    R_mem = R.new_zeros(n_tgt, *t["memory"].shape)
    totals.append(R.sum(dim=(1, 2, 3)))
    for i in reversed(range(len(t["dec"]))):
        layer, s_self, s_cross, s_ffn = t["dec"][i]
        R = _residual_rel(layer.res_ffn, s_ffn, R, lambda r, s, L=layer: _ffn_rel(L.ffn, s, r, eps),
                          eps)
        found: list[Tensor] = []

        def cross(r, s, found=found):
            nonlocal R_mem
            R_q, R_src = _attention_rel(s, r, eps, found)
            R_mem = R_mem + R_src
            return R_q

        R = _residual_rel(layer.res_cross, s_cross, R, cross, eps)
        heads[("dec-enc", i)] = found
        found = []
        R = _residual_rel(layer.res_self, s_self, R,
                          lambda r, s, f=found: _self_rel(s, r, eps, f), eps)
        heads[("dec-self", i)] = found
        totals.append(R.sum(dim=(1, 2, 3)) + R_mem.sum(dim=(1, 2, 3)))
    R_tgt = R
    R = norm_rel(model.encoder_norm, t["enc_out"], R_mem, eps)
    totals.append(R.sum(dim=(1, 2, 3)) + R_tgt.sum(dim=(1, 2, 3)))
    for i in reversed(range(len(t["enc"]))):
        layer, s_self, s_ffn = t["enc"][i]
        R = _residual_rel(layer.res_ffn, s_ffn, R, lambda r, s, L=layer: _ffn_rel(L.ffn, s, r, eps),
                          eps)
        found = []
        R = _residual_rel(layer.res_self, s_self, R,
                          lambda r, s, f=found: _self_rel(s, r, eps, f), eps)
        heads[("enc-self", i)] = found
        totals.append(R.sum(dim=(1, 2, 3)) + R_tgt.sum(dim=(1, 2, 3)))
    return Relevance({key: v[0] for key, v in heads.items()}, seeds, R[:, 0], R_tgt[:, 0], totals)


def _self_rel(a: _Attn, R: Tensor, eps: float, found: list[Tensor]) -> Tensor:
    """Self-attention: the values come from the same input as the queries."""
    _, R_source = _attention_rel(a, R, eps, found)
    return R_source


def head_relevance(model, split: Split, count: int | None, device, eps: float = EPS
                   ) -> dict[tuple[str, int], np.ndarray]:
    """Voita et al.'s head relevance on the first `count` sentences of `split` (None: all):
    per (site, layer), each head's |relevance| divided by the layer's total |relevance|,
    averaged over every target token of every sentence ([heads], in [0, 1], summing to 1 per
    layer; the heads the output projection reads: value heads for talking heads). Layers whose
    heads were all removed are left out."""
    n = len(split) if count is None else min(count, len(split))
    sums: dict[tuple[str, int], np.ndarray] = {}
    tokens = 0
    modules = attention_modules(model)
    with evaluating(model):
        for i in steps(range(n), "LRP relevance", n, log, unit="sentences"):
            batch = collate(split, np.array([i])).to(device)
            rel = relevance(model, batch.src, batch.tgt_in, eps)
            for key, r in rel.heads.items():
                if modules[key].out_heads == 0:
                    continue
                r = r.double().abs()
                share = r / r.sum(-1, keepdim=True).clamp_min(1e-30)
                sums[key] = sums.get(key, 0) + share.sum(0).cpu().numpy()
            tokens += int(batch.tgt_in.shape[1])
    return {key: sums[key] / max(tokens, 1) for key in modules if key in sums}
