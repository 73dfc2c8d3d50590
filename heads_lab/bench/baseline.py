"""The peers `heads-lab bench` measures heads-lab against, at the same dims, shaped like
heads_lab's model (encode / decode / logits / loss / forward), so the same training step (eager
or through torch.compile) runs them: torch.nn.Transformer (TorchTransformer: the same sinusoidal
positions, tied embeddings and loss; the uncached decoder runs it, as it has no key/value
cache), and Hugging Face's Marian (MarianPeer: MarianMTModel's own layers, post-norm, with SDPA
attention, decoding by its own `generate` with its cache; the hf extra). The language models'
peers (`heads-lab bench --lm`, LM_PEERS): a nanoGPT-style model in plain PyTorch (PlainGPT) and
Hugging Face's GPT-2 and Llama built from their configs (HFCausalPeer; the hf extra)."""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heads_lab.config.cost import lm_layers
from heads_lab.config.schemas import ModelConfig, Norm
from heads_lab.data.tokenizer import BOS
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


class _GPTBlock(nn.Module):
    """nanoGPT's Block: one fused c_attn Linear(d, 3d), SDPA with is_causal, c_proj; an MLP."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.heads, self.pre, self.dropout = cfg.heads, cfg.norm == Norm.pre, cfg.dropout
        self.act = F.relu if cfg.activation.value == "relu" else F.gelu
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, cfg.d_ff), nn.Linear(cfg.d_ff, d)

    def attn(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = (part.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for part in self.c_attn(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def mlp(self, x: Tensor) -> Tensor:
        return self.mlp_proj(F.dropout(self.act(self.c_fc(x)), self.dropout, self.training))

    def forward(self, x: Tensor) -> Tensor:
        drop = lambda y: F.dropout(y, self.dropout, self.training)  # noqa: E731
        if self.pre:
            x = x + drop(self.attn(self.ln_1(x)))
            return x + drop(self.mlp(self.ln_2(x)))
        x = self.ln_1(x + drop(self.attn(x)))
        return self.ln_2(x + drop(self.mlp(x)))


class PlainGPT(nn.Module):
    """A decoder-only language model written as nanoGPT writes one (Karpathy's model.py): blocks
    of LayerNorm, a fused c_attn, F.scaled_dot_product_attention(is_causal=True), c_proj,
    LayerNorm and an MLP; a final LayerNorm; the output layer tied to the embedding. Plain
    PyTorch, no heads-lab module. Where it departs from nanoGPT it does so to compute heads-lab's
    language model's function at the same dims (a test copies heads-lab's weights in and
    compares logits): sinusoidal positions and embeddings scaled by √d_model (nanoGPT learns its
    position table), the config's norm placement and activation (nanoGPT: pre-norm, GELU).
    Multi-head attention with d_k = d_model / h only. It generates as nanoGPT's `generate` does:
    the whole prefix through the model again at every step (no key/value cache)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int = 0):
        super().__init__()
        if cfg.d_model % cfg.heads or cfg.d_head != cfg.d_model // cfg.heads or cfg.kv_heads \
                or cfg.attention.value != "mha" or cfg.d_ff < 1:
            raise ValueError("the nanoGPT-style peer is multi-head attention with d_k = "
                             "d_model / h and a feed-forward block")
        self.cfg, self.vocab_size, self.pad_id = cfg, vocab_size, pad_id
        self.embed = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        self.register_buffer("positions", sinusoids(cfg.max_positions, cfg.d_model), persistent=False)
        self.blocks = nn.ModuleList(_GPTBlock(cfg) for _ in range(lm_layers(cfg)))
        self.ln_f = nn.LayerNorm(cfg.d_model) if cfg.norm == Norm.pre else nn.Identity()

    def decode(self, tokens: Tensor, enc: Encoded | None = None) -> Tensor:
        """tokens [batch, len] (BOS + text) → hidden states [batch, len, d_model]."""
        x = self.embed(tokens) * math.sqrt(self.cfg.d_model) + self.positions[: tokens.shape[1]]
        x = F.dropout(x, self.cfg.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def logits(self, hidden: Tensor) -> Tensor:
        return F.linear(hidden, self.embed.weight)

    def loss(self, hidden: Tensor, target: Tensor, eps: float = 0.0) -> tuple[Tensor, None]:
        return F.cross_entropy(self.logits(hidden).float(), target, label_smoothing=eps,
                               reduction="sum"), None

    @torch.no_grad()
    def generate(self, tokens: Tensor, new: int) -> list[list[int]]:
        """`new` greedy tokens after each row of `tokens`, nanoGPT's way: the (cropped) prefix
        through the whole model every step."""
        for _ in range(new):
            window = tokens[:, -self.cfg.max_positions:]
            nxt = self.logits(self.decode(window)[:, -1]).argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], dim=1)
        return tokens[:, -new:].tolist()


class HFCausalPeer(nn.Module):
    """A Hugging Face causal LM built from its config at heads-lab's dims (no download), with
    SDPA attention, trained by the bench's step and generating by transformers' own `generate`
    with its key/value cache: GPT-2 (GPT2LMHeadModel: learned positions, pre-norm, the config's
    activation; dropout on the embeddings and the residual branches, none on the feed-forward's
    inner activation) or Llama (LlamaForCausalLM: RoPE, RMSNorm, a SwiGLU feed-forward of
    intermediate size d_ff — three matrices where heads-lab has two, so more parameters at the
    same d_ff —, model.kv_heads key/value heads, no dropout but on the attention weights).
    Output layers tied, as heads-lab's."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int = 0, family: str = "gpt2"):
        super().__init__()
        import transformers  # lazy: an optional dependency (hf)

        self.cfg, self.vocab_size, self.pad_id, self.family = cfg, vocab_size, pad_id, family
        common = dict(vocab_size=vocab_size, bos_token_id=BOS, eos_token_id=None,
                      pad_token_id=pad_id, tie_word_embeddings=True)
        if family == "gpt2":
            config = transformers.GPT2Config(
                n_positions=cfg.max_positions, n_embd=cfg.d_model, n_layer=lm_layers(cfg),
                n_head=cfg.heads, n_inner=cfg.d_ff, activation_function=cfg.activation.value,
                resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout,
                attn_pdrop=cfg.attention_dropout, **common)
            model_class = transformers.GPT2LMHeadModel
        elif family == "llama":
            config = transformers.LlamaConfig(
                hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
                num_hidden_layers=lm_layers(cfg), num_attention_heads=cfg.heads,
                num_key_value_heads=cfg.kv_heads or cfg.heads, head_dim=cfg.d_head,
                max_position_embeddings=cfg.max_positions,
                attention_dropout=cfg.attention_dropout, **common)
            model_class = transformers.LlamaForCausalLM
        else:
            raise ValueError(f"no causal-LM peer {family!r}: gpt2 or llama")
        self.hf = model_class._from_config(config, attn_implementation="sdpa")

    def decode(self, tokens: Tensor, enc: Encoded | None = None) -> Tensor:
        return self.hf.base_model(input_ids=tokens, use_cache=False).last_hidden_state

    def logits(self, hidden: Tensor) -> Tensor:
        return self.hf.lm_head(hidden)

    def loss(self, hidden: Tensor, target: Tensor, eps: float = 0.0) -> tuple[Tensor, None]:
        return F.cross_entropy(self.logits(hidden).float(), target, label_smoothing=eps,
                               reduction="sum"), None

    @torch.no_grad()
    def generate(self, tokens: Tensor, new: int) -> list[list[int]]:
        """Exactly `new` greedy tokens after each row, by transformers' `generate` (cached)."""
        out = self.hf.generate(input_ids=tokens, attention_mask=torch.ones_like(tokens),
                               do_sample=False, min_new_tokens=new, max_new_tokens=new,
                               use_cache=True)
        return out[:, -new:].tolist()


# a causal-LM peer's name (`heads-lab bench --lm` rows' `peer`) → how to build it
LM_PEERS = {"plain": PlainGPT,
            "gpt2": lambda cfg, vocab: HFCausalPeer(cfg, vocab, family="gpt2"),
            "llama": lambda cfg, vocab: HFCausalPeer(cfg, vocab, family="llama")}
