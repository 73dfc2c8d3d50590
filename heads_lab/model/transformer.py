"""Encoder-decoder Transformer (Vaswani et al. 2017): sinusoidal positions, one shared
source/target vocabulary whose embedding is also the output projection, pre- or post-norm."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heads_lab.config.schemas import ModelConfig, Norm
from heads_lab.config.variants import variant
from heads_lab.model.attention import MODULES, Attention
from heads_lab.model.dropout import dropout
from heads_lab.model.kernels import KVCache
from heads_lab.model.loss import label_smoothed_loss, output_loss


def sinusoids(length: int, dim: int) -> Tensor:
    """Positional encodings [length, dim]: sin on even, cos on odd channels (Vaswani §3.5)."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return table


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.act = F.relu if cfg.activation.value == "relu" else F.gelu
        self.dropout = cfg.dropout

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(dropout(self.act(self.fc1(x)), self.dropout, self.training))


class Residual(nn.Module):
    """x + dropout(f(x)) with LayerNorm before f (pre) or after the sum (post). With Admin
    (model.init=admin, post-norm only) the skip is scaled: LN(ω ⊙ x + dropout(f(x))), ω a
    learned [d_model] vector set by `admin_init`."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model)
        self.pre = cfg.norm == Norm.pre
        self.dropout = cfg.dropout
        self.omega = nn.Parameter(torch.ones(cfg.d_model)) if cfg.init == "admin" else None

    def forward(self, x: Tensor, f) -> Tensor:
        if self.pre:
            return x + dropout(f(self.norm(x)), self.dropout, self.training)
        out = f(x)
        skip = x * self.omega if self.omega is not None else x
        return self.norm(skip + dropout(out, self.dropout, self.training))


def _attention(cfg: ModelConfig, site: str) -> Attention:
    """The attention module for `site` (enc-self, dec-self or dec-enc): its variant's module."""
    return MODULES[variant(cfg, site).name].from_config(cfg, site)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn, self.ffn = _attention(cfg, "enc-self"), FeedForward(cfg)
        self.res_self, self.res_ffn = Residual(cfg), Residual(cfg)

    def forward(self, x: Tensor, mask: Tensor, need_weights: bool = False) -> Tensor:
        # with need_weights each attention module returns its maps (heads.recording keeps them)
        def attn(h):
            return self.self_attn(h, mask=mask, need_weights=need_weights)[0]

        return self.res_ffn(self.res_self(x, attn), self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn, self.cross_attn = _attention(cfg, "dec-self"), _attention(cfg, "dec-enc")
        self.ffn = FeedForward(cfg)
        self.res_self, self.res_cross, self.res_ffn = Residual(cfg), Residual(cfg), Residual(cfg)

    def forward(self, y, memory, memory_mask, need_weights=False, cache: dict | None = None):
        def self_attn(h):
            return self.self_attn(h, causal=True, need_weights=need_weights,
                                  cache=cache and cache["self"])[0]

        def cross_attn(h):
            return self.cross_attn(h, memory, memory_mask, need_weights=need_weights,
                                   cache=cache and cache["cross"])[0]

        return self.res_ffn(self.res_cross(self.res_self(y, self_attn), cross_attn), self.ffn)


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """The model in eval mode within the block, in the mode it was in after it."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@dataclass
class Encoded:
    """The encoder's output: memory [batch, src, d_model] and its key mask [batch, 1, 1, src]."""

    memory: Tensor
    mask: Tensor

    def repeat(self, k: int) -> Encoded:
        """Each sentence k times in a row (for beam search)."""
        return Encoded(self.memory.repeat_interleave(k, 0), self.mask.repeat_interleave(k, 0))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int = 0):
        super().__init__()
        self.cfg, self.vocab_size, self.pad_id = cfg, vocab_size, pad_id
        self.embed = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        self.register_buffer("positions", sinusoids(cfg.max_positions, cfg.d_model), persistent=False)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        pre = cfg.norm == Norm.pre  # pre-norm needs a final LayerNorm on each stack
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Xavier for projections (Vaswani / fairseq); N(0, d^-1/2) embeddings, scaled by √d on input
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.embed.weight, std=self.cfg.d_model**-0.5)
        with torch.no_grad():
            self.embed.weight[self.pad_id].zero_()

    def embed_tokens(self, tokens: Tensor, offset: int = 0) -> Tensor:
        # tokens [batch, len] → [batch, len, d_model]
        x = self.embed(tokens) * math.sqrt(self.cfg.d_model)
        if getattr(self.cfg, "positions", "sinusoidal") != "none":
            x = x + self.positions[offset : offset + tokens.shape[1]]
        return dropout(x, self.cfg.dropout, self.training)

    def encode(self, src: Tensor, need_weights: bool = False) -> Encoded:
        mask = (src != self.pad_id)[:, None, None, :]  # [batch, 1, 1, src], built once per batch
        x = self.embed_tokens(src)
        for layer in self.encoder:
            x = layer(x, mask, need_weights)
        return Encoded(self.encoder_norm(x), mask)

    def decode(self, tgt_in: Tensor, enc: Encoded, need_weights=False, caches=None, offset=0):
        """tgt_in [batch, tgt] (BOS-shifted) → hidden states [batch, tgt, d_model]. With caches
        (one per layer, see `new_caches`), tgt_in holds only the new positions from `offset`."""
        y = self.embed_tokens(tgt_in, offset)
        for i, layer in enumerate(self.decoder):
            y = layer(y, enc.memory, enc.mask, need_weights, caches[i] if caches else None)
        return self.decoder_norm(y)

    def new_caches(self, positions: int = 0) -> list[dict[str, KVCache]]:
        """Empty decoding caches, one per decoder layer; `positions`: the most the decoder will
        run (its length limit), so self-attention's keys and values are never moved to grow."""
        return [{"self": {"positions": positions}, "cross": {}} for _ in self.decoder]

    def logits(self, hidden: Tensor) -> Tensor:
        return F.linear(hidden, self.embed.weight)  # tied output projection: [..., vocab]

    def decoding_logits(self) -> Callable[[Tensor], Tensor]:
        """`logits` for many calls on few rows with the weights fixed (a decoder's steps). On
        CPU in fp32 the tied [vocab, d_model] weight is laid out once for oneDNN's matmul, which
        at decoding's 64–256 rows ran 1.1–1.4× faster than `F.linear` (MKL) on the same weight
        here; its sums round differently in the last bits. Elsewhere (GPU, under autocast, a
        torch without the op) it is `logits`."""
        weight = self.embed.weight
        packable = (weight.device.type == "cpu" and weight.dtype == torch.float32
                    and not torch.is_autocast_enabled("cpu") and torch.backends.mkldnn.is_available()
                    and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))
        if not packable:
            return self.logits
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 64)

        def logits(hidden: Tensor) -> Tensor:
            if hidden.dtype != torch.float32:
                return self.logits(hidden)
            return torch.ops.mkldnn._linear_pointwise(hidden, packed, None, "none", [], "")

        return logits

    def loss(self, hidden: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        """Summed label-smoothed loss and summed NLL of the output layer on hidden [tokens,
        d_model]. Training takes the fused, chunked path (`output_loss`): no [tokens, vocab]
        tensor is kept, and the NLL is for logging only (no gradient)."""
        if torch.is_grad_enabled() and (hidden.requires_grad or self.embed.weight.requires_grad):
            return output_loss(hidden, self.embed.weight, target, eps)
        return label_smoothed_loss(self.logits(hidden), target, eps)

    def forward(self, src: Tensor, tgt_in: Tensor, hidden_only: bool = False) -> Tensor:
        """Logits [batch, tgt, vocab], or with hidden_only the decoder output [batch, tgt,
        d_model] (training applies the output layer inside its fused loss)."""
        hidden = self.decode(tgt_in, self.encode(src))
        return hidden if hidden_only else self.logits(hidden)


def count_parameters(model: Transformer) -> dict[str, int]:
    """Parameters by part: total, embeddings (shared with the output layer), attention (including
    the talking-heads mixes), talking_heads (the mixes alone), ffn, norm."""
    parts = {"embeddings": nn.Embedding, "attention": Attention, "ffn": FeedForward,
             "norm": nn.LayerNorm}
    counts = {"total": sum(p.numel() for p in model.parameters())}
    for part, kind in parts.items():
        counts[part] = sum(p.numel() for m in model.modules() if isinstance(m, kind)
                           for p in m.parameters())
    counts["talking_heads"] = sum(p.numel() for m in model.modules() if isinstance(m, Attention)
                                  for p in m.mix_parameters())
    return counts


@torch.no_grad()
def admin_init(model: Transformer, src: Tensor, tgt_in: Tensor) -> list[float]:
    """Admin (Liu et al. 2020, "Understanding the Difficulty of Training Transformers"):
    one profiling forward pass (eval mode, so no dropout) records v_i = Var[f_i(x_{i-1})] for
    every residual sublayer i in order, per stack (encoder: self-attention, FFN; decoder:
    self-attention, cross-attention, FFN); then ω_i = sqrt(v_0 + Σ_{j<i} v_j), where v_0 is the
    variance of the stack's input (scaled embeddings + positions). The profile does not depend on
    ω, since each f_i reads a LayerNorm output. Returns the ω values set, in order."""
    stacks = [[r for layer in model.encoder for r in (layer.res_self, layer.res_ffn)],
              [r for layer in model.decoder for r in (layer.res_self, layer.res_cross,
                                                       layer.res_ffn)]]
    if any(r.omega is None for stack in stacks for r in stack):
        raise ValueError("admin_init needs a model built with model.init=admin")
    branches = [[f for layer in model.encoder for f in (layer.self_attn, layer.ffn)],
                [f for layer in model.decoder for f in (layer.self_attn, layer.cross_attn,
                                                        layer.ffn)]]
    variances: dict[int, float] = {}  # Var[f_i(x)] of each residual branch, by module

    def record(module, _, output):
        out = output[0] if isinstance(output, tuple) else output  # attention: (y, maps)
        variances[id(module)] = out.float().var().item()

    handles = [f.register_forward_hook(record) for stack in branches for f in stack]
    try:
        with evaluating(model):
            inputs = [model.embed_tokens(src).float().var().item(),
                      model.embed_tokens(tgt_in).float().var().item()]
            model.decode(tgt_in, model.encode(src))
    finally:
        for handle in handles:
            handle.remove()
    omegas = []
    for stack, fs, total in zip(stacks, branches, inputs):
        for r, f in zip(stack, fs):
            r.omega.fill_(math.sqrt(total))
            omegas.append(math.sqrt(total))
            total += variances[id(f)]
    return omegas
