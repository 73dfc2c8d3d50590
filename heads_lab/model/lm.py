"""A decoder-only Transformer language model (task=lm), built from the translator's parts: the
same attention modules (every head setting: model.heads, kv_heads, talking heads with heads_k /
heads_v, head_dim, relative positions), feed-forward, residual blocks (pre- or post-norm),
sinusoidal positions and tied input/output embeddings. Each layer is causal self-attention at the
site `lm-self` and a feed-forward block, none with model.d_ff=0 (attention-only layers); there is
no encoder and no cross-attention. It reads the target side of a batch (BOS + text) and predicts
the next token, so the trainer, perplexity, checkpoints and the heads' hooks treat it as they
treat the translator: `encode` returns nothing to attend to and `decode` runs the stack.
"""

from __future__ import annotations

from torch import Tensor, nn

from heads_lab.config.schemas import ModelConfig, Norm
from heads_lab.config.variants import variant
from heads_lab.model.attention import MODULES
from heads_lab.model.transformer import Encoded, FeedForward, Residual, Transformer, sinusoids

SITE = "lm-self"


def depth(cfg: ModelConfig) -> int:
    """The decoder-only model's layers: model.layers, else model.decoder_layers."""
    return cfg.layers if cfg.layers is not None else cfg.decoder_layers


class LMLayer(nn.Module):
    """Causal self-attention, then feed-forward (none with model.d_ff=0)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MODULES[variant(cfg, SITE).name].from_config(cfg, SITE)
        self.res_self = Residual(cfg)
        self.ffn = FeedForward(cfg) if cfg.d_ff > 0 else None
        self.res_ffn = Residual(cfg) if cfg.d_ff > 0 else None

    def forward(self, y: Tensor, need_weights: bool = False, cache: dict | None = None) -> Tensor:
        def self_attn(h):
            return self.self_attn(h, causal=True, need_weights=need_weights,
                                  cache=cache and cache["self"])[0]

        y = self.res_self(y, self_attn)
        return self.res_ffn(y, self.ffn) if self.ffn is not None else y


class LanguageModel(Transformer):
    """Decoder-only: `layers` of LMLayer over the target side's tokens (see the module doc).
    Everything else — embeddings scaled by √d_model plus sinusoids, the tied output layer, its
    fused loss, initialisation — is the translator's."""

    task = "lm"

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int = 0):
        nn.Module.__init__(self)
        self.cfg, self.vocab_size, self.pad_id = cfg, vocab_size, pad_id
        self.embed = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        self.register_buffer("positions", sinusoids(cfg.max_positions, cfg.d_model),
                             persistent=False)
        self.layers = nn.ModuleList(LMLayer(cfg) for _ in range(depth(cfg)))
        self.encoder = nn.ModuleList()  # none: what a translator's code reads finds no layers
        self.decoder = nn.ModuleList()
        self.norm = nn.LayerNorm(cfg.d_model) if cfg.norm == Norm.pre else nn.Identity()
        self.reset_parameters()

    def encode(self, src: Tensor, need_weights: bool = False) -> Encoded:
        """Nothing to attend to: a language model reads its text in `decode`."""
        empty = src.new_zeros((src.shape[0], 0, self.cfg.d_model), dtype=self.embed.weight.dtype)
        return Encoded(empty, src.new_zeros((src.shape[0], 1, 1, 0), dtype=bool))

    def decode(self, tgt_in: Tensor, enc: Encoded | None = None, need_weights=False, caches=None,
               offset=0):
        """tgt_in [batch, len] (BOS + text) → hidden states [batch, len, d_model]; with caches
        (one per layer, `new_caches`) only the new positions from `offset`."""
        y = self.embed_tokens(tgt_in, offset)
        for i, layer in enumerate(self.layers):
            y = layer(y, need_weights, caches[i] if caches else None)
        return self.norm(y)

    def new_caches(self, positions: int = 0) -> list[dict]:
        return [{"self": {"positions": positions}} for _ in self.layers]
