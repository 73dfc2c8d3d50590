"""The peers `heads-lab bench` measures heads-lab against, at the same dims, shaped like
heads_lab's model (encode / decode / logits / loss / forward), so the same training step (eager
or through torch.compile) runs them: torch.nn.Transformer (TorchTransformer: the same sinusoidal
positions, tied embeddings and loss; the uncached decoder runs it, as it has no key/value
cache), and Hugging Face's Marian (MarianPeer: MarianMTModel's own layers, post-norm, with SDPA
attention, decoding by its own `generate` with its cache; the hf extra)."""

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

    def forward(self, src: Tensor, tgt_in: Tensor, hidden_only: bool = True) -> Tensor:
        """The decoder's hidden states of a teacher-forced batch (as heads_lab's model with
        hidden_only=True: what trainer.compile compiles)."""
        return self.decode(tgt_in, self.encode(src))

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


class MarianPeer(nn.Module):
    """Hugging Face's MarianMTModel at heads-lab's dims (d_model, heads, d_ff, layers, dropout,
    activation, vocab; tied embeddings scaled by √d_model and sinusoidal positions, as Marian's
    checkpoints have them), built from its config (no download), with SDPA attention: a user's
    Transformer translator from the library, trained by the same step. Its layers are Marian's
    own (post-norm, whatever model.norm says); the loss is its logits' label-smoothed cross
    entropy, as TorchTransformer's."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int = 0):
        super().__init__()
        from transformers import MarianConfig, MarianMTModel  # lazy: an optional dependency (hf)

        self.cfg, self.vocab_size, self.pad_id = cfg, vocab_size, pad_id
        config = MarianConfig(
            vocab_size=vocab_size, d_model=cfg.d_model, encoder_layers=cfg.encoder_layers,
            decoder_layers=cfg.decoder_layers, encoder_attention_heads=cfg.heads,
            decoder_attention_heads=cfg.heads, encoder_ffn_dim=cfg.d_ff,
            decoder_ffn_dim=cfg.d_ff, dropout=cfg.dropout, attention_dropout=0.0,
            activation_dropout=0.0, activation_function=cfg.activation.value,
            max_position_embeddings=cfg.max_positions, scale_embedding=True,
            pad_token_id=pad_id, decoder_start_token_id=pad_id, eos_token_id=2,
            forced_eos_token_id=None)  # EOS held back, as the bench's decoders hold it
        self.hf = MarianMTModel._from_config(config, attn_implementation="sdpa")

    def encode(self, src: Tensor, need_weights: bool = False) -> Encoded:
        keep = src != self.pad_id
        memory = self.hf.model.encoder(input_ids=src, attention_mask=keep.long()).last_hidden_state
        return Encoded(memory, keep[:, None, None, :])

    def decode(self, tgt_in: Tensor, enc: Encoded, need_weights: bool = False, caches=None,
               offset: int = 0) -> Tensor:
        if caches is not None:
            raise NotImplementedError("the Marian peer is measured in training only")
        return self.hf.model.decoder(input_ids=tgt_in, encoder_hidden_states=enc.memory,
                                     encoder_attention_mask=enc.mask[:, 0, 0, :].long()
                                     ).last_hidden_state

    def forward(self, src: Tensor, tgt_in: Tensor, hidden_only: bool = True) -> Tensor:
        return self.decode(tgt_in, self.encode(src))

    def generate(self, src: Tensor, beam: int, length: int) -> list[list[int]]:
        """Exactly `length` tokens per source (as the bench's decoders, EOS held back), greedy
        (beam 1) or beam search, by transformers' own `generate` with its key/value cache."""
        out = self.hf.generate(input_ids=src, attention_mask=(src != self.pad_id).long(),
                               num_beams=beam, do_sample=False, min_new_tokens=length,
                               max_new_tokens=length, use_cache=True,
                               **({"length_penalty": 0.6} if beam > 1 else {}))
        return [row[1:].tolist() for row in out]  # without the decoder's start token

    def logits(self, hidden: Tensor) -> Tensor:
        return self.hf.lm_head(hidden) + self.hf.final_logits_bias

    def loss(self, hidden: Tensor, target: Tensor, eps: float) -> tuple[Tensor, None]:
        return F.cross_entropy(self.logits(hidden).float(), target, label_smoothing=eps,
                               reduction="sum"), None


# a peer's name (bench rows' `peer`) → its class
PEERS = {"torch.nn": TorchTransformer, "marian": MarianPeer}
