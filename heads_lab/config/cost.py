"""What a head configuration costs, from the config alone: parameters, FLOPs per target token
(training step and decoding), and the attention activations that grow with n·m.

FLOPs count 2 per multiply-add of every matmul (projections, QKᵀ, the talking-heads mixes, AV,
FFN, output layer); element-wise work (softmax, norms, dropout) is left out, as in the usual
"6·N" accounting. Attention matrices are counted in full even where causal masking lets a kernel
skip half. A training step is forward + backward = 3× the forward matmuls (each backward matmul
produces two gradients). Decoding uses the key/value cache: a step attends over the prefix, the
source keys/values are projected once per sentence, and the encoder runs once per sentence.
"""

from __future__ import annotations

from dataclasses import dataclass

from heads_lab.config.schemas import ModelConfig, Norm
from heads_lab.config.sites import SITE, SITES, layers
from heads_lab.config.variants import variant


@dataclass
class Lengths:
    """Source and target lengths (subword tokens, EOS included) the account is computed at."""

    src: float = 20.0
    tgt: float = 20.0


def parameter_count(cfg: ModelConfig, vocab: int) -> dict[str, int]:
    """Parameters by part, by formula; equals `count_parameters` of the built model."""
    d, dk = cfg.d_model, cfg.d_head
    per_site, extra = {}, {}
    for site in SITES:
        v = variant(cfg, site)
        c = v.counts(cfg)
        projected = (c.q + c.k + c.v) * dk
        relative = c.h * (2 * cfg.relative_positions + 1) if cfg.relative_positions and \
            SITE[site].self_attention else 0  # a bias per softmax head and offset
        extra[site] = v.mix_params(cfg)
        per_site[site] = d * projected + projected + c.out * dk * d + d + extra[site] + relative
    attention = sum(per_site[s] * layers(cfg, s) for s in SITES)
    ffn = (cfg.encoder_layers + cfg.decoder_layers) * (2 * d * cfg.d_ff + cfg.d_ff + d)
    n_norms = 2 * cfg.encoder_layers + 3 * cfg.decoder_layers + (2 if cfg.norm == Norm.pre else 0)
    counts = {
        "embeddings": vocab * d,  # shared by source, target and the output layer
        "attention": attention,
        "talking_heads": sum(extra[s] * layers(cfg, s) for s in SITES),
        "ffn": ffn,
        "norm": n_norms * 2 * d,
    }
    admin = (2 * cfg.encoder_layers + 3 * cfg.decoder_layers) * d if cfg.init == "admin" else 0
    counts["total"] = counts["embeddings"] + attention + ffn + counts["norm"] + admin  # + Admin ω
    return {"total": counts["total"], **{k: v for k, v in counts.items() if k != "total"}}


def gate_parameters(cfg: ModelConfig, sites) -> int:
    """Hard Concrete gates' parameters (one log α per gated head, heads_lab.model.heads) on the
    attention layers of `sites`: the heads whose outputs enter out_proj."""
    return sum(variant(cfg, s).counts(cfg).out * layers(cfg, s) for s in SITES if s in sites)


def _attention_flops(cfg: ModelConfig, site: str, n: float, m: float, kv_tokens: float) -> float:
    """Forward matmul FLOPs of one attention layer: n queries over m keys, with `kv_tokens`
    key/value positions projected (m in training; 0 for a cached decoding step)."""
    v = variant(cfg, site)
    c, d, dk = v.counts(cfg), cfg.d_model, cfg.d_head
    flops = 2 * n * d * c.q * dk  # query projection
    flops += 2 * kv_tokens * d * (c.k + c.v) * dk  # key and value projections
    flops += v.score_flops(cfg, n, m)  # QKᵀ (grouped heads share keys, not work), mixes, ·V
    flops += 2 * n * c.out * dk * d  # output projection
    return flops


def forward_flops(cfg: ModelConfig, vocab: int, src: float, tgt: float) -> dict[str, float]:
    """Forward FLOPs of one sentence pair (teacher forcing), by part."""
    ffn = 4 * cfg.d_model * cfg.d_ff
    enc = cfg.encoder_layers * (_attention_flops(cfg, "enc-self", src, src, src) + src * ffn)
    dec = cfg.decoder_layers * (_attention_flops(cfg, "dec-self", tgt, tgt, tgt)
                                + _attention_flops(cfg, "dec-enc", tgt, src, src) + tgt * ffn)
    out = 2 * tgt * cfg.d_model * vocab
    return {"encoder": enc, "decoder": dec, "output": out, "total": enc + dec + out}


def decode_flops(cfg: ModelConfig, vocab: int, src: float, tgt: float) -> float:
    """Forward FLOPs to decode one sentence greedily with the cache (×beam for beam search)."""
    ffn = 4 * cfg.d_model * cfg.d_ff
    total = cfg.encoder_layers * (_attention_flops(cfg, "enc-self", src, src, src) + src * ffn)
    steps = int(round(tgt))
    for t in range(1, steps + 1):  # step t: one query over t cached positions
        for _ in range(cfg.decoder_layers):
            total += _attention_flops(cfg, "dec-self", 1, t, 1)
            total += _attention_flops(cfg, "dec-enc", 1, src, 0) + ffn
        total += 2 * cfg.d_model * vocab
    c = variant(cfg, "dec-enc").counts(cfg)  # source keys/values projected once per layer
    total += cfg.decoder_layers * 2 * src * cfg.d_model * (c.k + c.v) * cfg.d_head
    return total


def attention_activation_bytes(cfg: ModelConfig, site: str, n: float, m: float) -> float:
    """Bytes of [heads, n, m] attention tensors one layer keeps for backward, per sentence pair
    (fp32), as the site's variant declares them."""
    return variant(cfg, site).activation_bytes(cfg, n, m)


def lm_layers(cfg: ModelConfig) -> int:
    """A decoder-only model's layers (task=lm): model.layers, else model.decoder_layers."""
    return cfg.layers if cfg.layers is not None else cfg.decoder_layers


def lm_parameter_count(cfg: ModelConfig, vocab: int) -> dict[str, int]:
    """A language model's parameters (task=lm: heads_lab.model.lm), by part: its layers'
    causal self-attention (lm-self) and feed-forward (none at d_ff=0), their norms."""
    d, dk, n = cfg.d_model, cfg.d_head, lm_layers(cfg)
    v = variant(cfg, "lm-self")
    c = v.counts(cfg)
    projected = (c.q + c.k + c.v) * dk
    relative = c.h * (2 * cfg.relative_positions + 1) if cfg.relative_positions else 0
    per_layer = d * projected + projected + c.out * dk * d + d + v.mix_params(cfg) + relative
    ffn = n * (2 * d * cfg.d_ff + cfg.d_ff + d) if cfg.d_ff > 0 else 0
    norms = n * (2 if cfg.d_ff > 0 else 1) + (1 if cfg.norm == Norm.pre else 0)
    counts = {"embeddings": vocab * d, "attention": n * per_layer,
              "talking_heads": n * v.mix_params(cfg), "ffn": ffn, "norm": norms * 2 * d}
    total = counts["embeddings"] + counts["attention"] + ffn + counts["norm"]
    return {"total": total, **counts}


def kv_cache_bytes(cfg: ModelConfig, task: str = "translate", dtype_bytes: int = 4) -> int:
    """Key/value cache per token of context in `dtype_bytes` (fp32: 4): layers · (key heads +
    value heads) · d_k · bytes, i.e. 2 · layers · kv heads · d_k · bytes for multi-head and
    grouped-query attention (talking heads keep h_K keys and h_V values), the decoder's
    self-attention (a language model's lm-self)."""
    site = "lm-self" if task == "lm" else "dec-self"
    n = lm_layers(cfg) if task == "lm" else cfg.decoder_layers
    c = variant(cfg, site).counts(cfg)
    return n * (c.k + c.v) * cfg.d_head * dtype_bytes


def lm_account(cfg: ModelConfig, vocab: int, t: float) -> dict[str, object]:
    """A language model's account at texts of `t` tokens (BOS included): forward FLOPs per token
    over its layers, training 3×, decoding with the cache (a step attends over the prefix)."""
    ffn = 4 * cfg.d_model * cfg.d_ff
    n = lm_layers(cfg)
    fwd = n * (_attention_flops(cfg, "lm-self", t, t, t) + t * ffn) + 2 * t * cfg.d_model * vocab
    steps = int(round(t))
    decode = sum(n * (_attention_flops(cfg, "lm-self", 1, k, 1) + ffn) + 2 * cfg.d_model * vocab
                 for k in range(1, steps + 1))
    return {"params": lm_parameter_count(cfg, vocab), "lengths": {"src": 0.0, "tgt": t},
            "flops_per_token": {"train": 3 * fwd / t, "forward": fwd / t, "decode": decode / t},
            "attention_activation_bytes": {"lm-self": attention_activation_bytes(
                cfg, "lm-self", t, t)},
            "kv_cache_bytes_per_token": kv_cache_bytes(cfg, "lm")}


def account(cfg: ModelConfig, vocab: int, lengths: Lengths | None = None,
            task: str = "translate") -> dict[str, object]:
    """The whole cost account of a config at the given lengths (task=lm: at the target
    length: heads_lab.config.cost.lm_account)."""
    lengths = lengths or Lengths()
    if task == "lm":
        return lm_account(cfg, vocab, lengths.tgt)
    s, t = lengths.src, lengths.tgt
    fwd = forward_flops(cfg, vocab, s, t)
    size = {"src": s, "tgt": t}
    return {
        "params": parameter_count(cfg, vocab),
        "lengths": {"src": s, "tgt": t},
        "flops_per_token": {
            "train": 3 * fwd["total"] / t,
            "forward": fwd["total"] / t,
            "decode": decode_flops(cfg, vocab, s, t) / t,
        },
        "attention_activation_bytes": {
            site: attention_activation_bytes(cfg, site, size[SITE[site].query],
                                             size[SITE[site].key]) for site in SITES
        },
    }
