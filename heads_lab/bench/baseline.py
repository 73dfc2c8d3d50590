"""The in-framework baseline: torch.nn.Transformer at the same dims, with the same sinusoidal
positions, tied embeddings and loss, shaped like heads_lab's model (encode / decode / logits), so
the same training step and the uncached decoder run it. It has no key/value cache."""

from __future__ import annotations

import math
import warnings

import torch.nn.functional as F
from torch import Tensor, nn

from heads_lab.config.schemas import ModelConfig, Norm
from heads_lab.model import Encoded
from heads_lab.model.transformer import sinusoids


class TorchTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int = 0):
        super().__init__()
        self.cfg, self.vocab_size, self.pad_id = cfg, vocab_size, pad_id
        self.embed = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        self.register_buffer("positions", sinusoids(cfg.max_positions, cfg.d_model), persistent=False)
        with warnings.catch_warnings():  # "enable_nested_tensor is True, but ..." under pre-LN
            warnings.filterwarnings("ignore", message="enable_nested_tensor")
            self.core = nn.Transformer(
                cfg.d_model, cfg.heads, cfg.encoder_layers, cfg.decoder_layers, cfg.d_ff,
                cfg.dropout, activation=cfg.activation.value, batch_first=True,
                norm_first=cfg.norm == Norm.pre,
            )
        # The nested-tensor fast path only exists in eval; keep both modes on the padded path.
        self.core.encoder.enable_nested_tensor = False

    def _embed(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens) * math.sqrt(self.cfg.d_model) + self.positions[: tokens.shape[1]]
        return F.dropout(x, self.cfg.dropout, self.training)

    def encode(self, src: Tensor, need_weights: bool = False) -> Encoded:
        pad = src == self.pad_id
        memory = self.core.encoder(self._embed(src), src_key_padding_mask=pad)
        return Encoded(memory, ~pad[:, None, None, :])

    def decode(self, tgt_in: Tensor, enc: Encoded, need_weights: bool = False, caches=None,
               offset: int = 0) -> Tensor:
        if caches is not None:
            raise NotImplementedError("torch.nn.Transformer has no key/value cache")
        n = tgt_in.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(n, device=tgt_in.device)
        memory_pad = ~enc.mask[:, 0, 0, :]
        return self.core.decoder(self._embed(tgt_in), enc.memory, tgt_mask=causal,
                                 tgt_is_causal=True, memory_key_padding_mask=memory_pad)

    def logits(self, hidden: Tensor) -> Tensor:
        return F.linear(hidden, self.embed.weight)

    def decoding_logits(self):
        """The decoder's output layer: plain `logits`, as a usual PyTorch translator has it."""
        return self.logits

    def loss(self, hidden: Tensor, target: Tensor, eps: float) -> tuple[Tensor, None]:
        """What a usual PyTorch translator does: logits, then torch's label-smoothed cross
        entropy (summed). The bench needs no separate NLL, so none is computed."""
        return F.cross_entropy(self.logits(hidden).float(), target, label_smoothing=eps,
                               reduction="sum"), None
