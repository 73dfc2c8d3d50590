"""Loading `hf:` models and where their heads are.

A family says which transformers class to load, which attention sites the model has and, for
each (site, layer), the module whose input is the heads' outputs side by side (the output
projection: Marian's `out_proj`, BERT's `attention.output.dense`, DistilBERT's `out_lin`), where
heads-lab's hooks gate heads. Other model types are refused in one line: their layers are not
mapped onto heads-lab's sites (nothing is assumed about names that merely look alike).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heads_lab.analysis.syntax import piece_spans
from heads_lab.errors import ConfigError, DataError
from heads_lab.hf import HF_PREFIX

log = logging.getLogger(__name__)
INSTALL = "pip install 'heads-lab[hf]' (transformers; `make test` installs it)"


@dataclass(frozen=True)
class Family:
    name: str
    model_class: str  # the transformers class loaded (its task head gives the loss)
    seq2seq: bool  # a translator (BLEU, dec-self and dec-enc sites) or an encoder (masked LM)
    outs: Callable[[Any], dict[tuple[str, int], Any]]  # model → (site, layer) → output projection
    heads: Callable[[Any], dict[str, int]]  # config → heads per site
    d_model: Callable[[Any], int]
    attentions: Callable[[Any], list]  # model → its attention projections (their parameters
    # counted: queries, keys, values and the output, not a LayerNorm a family keeps beside them)


def _marian_outs(model) -> dict[tuple[str, int], Any]:
    inner = model.model
    out = {("enc-self", i): layer.self_attn.out_proj for i, layer in enumerate(inner.encoder.layers)}
    out |= {("dec-self", i): layer.self_attn.out_proj for i, layer in enumerate(inner.decoder.layers)}
    out |= {("dec-enc", i): layer.encoder_attn.out_proj
            for i, layer in enumerate(inner.decoder.layers)}
    return out


FAMILIES = {
    "marian": Family("marian", "MarianMTModel", True, _marian_outs,
                     lambda c: {"enc-self": c.encoder_attention_heads,
                                "dec-self": c.decoder_attention_heads,
                                "dec-enc": c.decoder_attention_heads}, lambda c: c.d_model,
                     lambda m: [layer.self_attn for layer in m.model.encoder.layers]
                     + [a for layer in m.model.decoder.layers
                        for a in (layer.self_attn, layer.encoder_attn)]),
    "bert": Family("bert", "BertForMaskedLM", False,
                   lambda m: {("enc-self", i): layer.attention.output.dense
                              for i, layer in enumerate(m.bert.encoder.layer)},
                   lambda c: {"enc-self": c.num_attention_heads}, lambda c: c.hidden_size,
                   lambda m: [part for layer in m.bert.encoder.layer  # (not its LayerNorm)
                              for part in (layer.attention.self, layer.attention.output.dense)]),
    "distilbert": Family("distilbert", "DistilBertForMaskedLM", False,
                         lambda m: {("enc-self", i): layer.attention.out_lin
                                    for i, layer in enumerate(m.distilbert.transformer.layer)},
                         lambda c: {"enc-self": c.n_heads}, lambda c: c.dim,
                         lambda m: [layer.attention for layer in m.distilbert.transformer.layer]),
}


class Tokens:
    """The model's own tokenizer in the terms heads-lab's analysis uses: `encode` gives the ids
    the model reads (with its special tokens: Marian's pieces + </s>, BERT's [CLS] pieces
    [SEP]), `encode_spans` the ids without the final special token and each one's character
    span in the text ([CLS]: an empty span, part of no word), `pieces` the tokens of ids."""

    def __init__(self, tokenizer, seq2seq: bool):
        self.tok, self.seq2seq = tokenizer, seq2seq

    def __len__(self) -> int:
        return len(self.tok)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [list(ids) for ids in self.tok(list(texts))["input_ids"]]

    def encode_target(self, texts: list[str]) -> list[list[int]]:
        """A translator's reference ids (pieces + </s>), as its labels."""
        return [list(ids) for ids in self.tok(text_target=list(texts))["input_ids"]]

    def pieces(self, ids: list[int]) -> list[str]:
        return self.tok.convert_ids_to_tokens(list(ids))

    def encode_spans(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids = self.encode([text])[0][:-1]
        try:
            spans = self.tok(text, return_offsets_mapping=True).get("offset_mapping")
        except NotImplementedError:  # a tokenizer without offsets (Marian's SentencePiece)
            spans = None
        if spans:
            return ids, [tuple(s) for s in spans][:-1]
        return ids, piece_spans(self.pieces(ids))

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.tok.batch_decode(ids, skip_special_tokens=True)


@dataclass
class Pretrained:
    """An `hf:` model read in: its family, the model (eval mode, eager attention, so its maps are
    returned), tokenizer, the output projection of every (site, layer) and its heads."""

    name: str
    family: Family
    model: Any
    tokens: Tokens
    config: Any
    outs: dict[tuple[str, int], Any] = field(default_factory=dict)

    @property
    def heads(self) -> dict[tuple[str, int], int]:
        per_site = self.family.heads(self.config)
        return {key: per_site[key[0]] for key in self.outs}

    @property
    def d_model(self) -> int:
        return self.family.d_model(self.config)

    def layers(self, site: str) -> int:
        return sum(1 for s, _ in self.outs if s == site)


def load(spec: str, device: str = "cpu") -> Pretrained:
    """`hf:<hub name or dir>` read in. A hub name needs a network (offline: one line saying so and
    how to use a local copy); a dir is anything `save_pretrained` wrote."""
    name = spec[len(HF_PREFIX):] if spec.startswith(HF_PREFIX) else spec
    if not name:
        raise ConfigError("hf: needs a Hugging Face hub name or a save_pretrained dir, e.g. "
                          "hf:Helsinki-NLP/opus-mt-de-en or hf:outputs/hf_tiny/bert")
    transformers = _transformers()
    where = _where(name)
    with warnings.catch_warnings():  # e.g. Marian's "Recommended: pip install sacremoses"
        warnings.simplefilter("ignore")
        try:
            config = transformers.AutoConfig.from_pretrained(where)
        except (OSError, ValueError) as err:
            raise DataError(f"hf:{name}: no Hugging Face model there ({_first(err)}); give a hub "
                            "name or a save_pretrained dir") from None
        family = FAMILIES.get(config.model_type)
        if family is None:
            raise ConfigError(f"hf:{name} is a {config.model_type!r} model; heads-lab reads "
                              f"{', '.join(FAMILIES)} models (their heads mapped onto enc-self, "
                              "dec-self and dec-enc); other families are not supported")
        try:
            model = getattr(transformers, family.model_class).from_pretrained(
                where, attn_implementation="eager")
        except Exception as err:  # noqa: BLE001 (a broken download: files missing or cut short)
            raise DataError(f"hf:{name}: its weights cannot be read ({_first(err)}): the files "
                            "are missing or damaged; download the model again, or save_pretrained "
                            "it again") from None
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(where)
        except Exception as err:  # noqa: BLE001 (as above, for its tokenizer files)
            raise DataError(f"hf:{name}: its tokenizer cannot be read ({_first(err)}): its "
                            "tokenizer files are missing or damaged; save the model's tokenizer "
                            "beside it (tokenizer.save_pretrained) or download it again") from None
    _check_tokenizer(name, len(tokenizer), config.vocab_size)
    model = model.to(device).eval()
    return Pretrained(name, family, model, Tokens(tokenizer, family.seq2seq), config,
                      family.outs(model))


def _check_tokenizer(name: str, pieces: int, vocab: int) -> None:
    """A tokenizer that is not the model's is refused: transformers builds a BERT tokenizer of 5
    special tokens where its files are missing, which reads every word as [UNK] (accuracy 0, a
    full analysis of nothing); one with more pieces than the model has embeddings would index
    past them. A vocabulary padded a little past the tokenizer's (to a multiple of 8) is fine."""
    if pieces > vocab or pieces < vocab // 2:
        raise DataError(f"hf:{name}: its tokenizer has {pieces:,} tokens but the model "
                        f"{vocab:,} embeddings: the tokenizer files are missing or another "
                        "model's; save the model's own tokenizer beside it "
                        "(tokenizer.save_pretrained)")


def account(pre: Pretrained, src_len: int = 20, tgt_len: int = 20) -> dict[str, Any]:
    """What `heads-lab info hf:...` prints: layers, heads, widths, parameters (all, attention) and
    FLOPs per token of a forward pass, counted by torch.utils.flop_counter on one sentence of
    `src_len` tokens (a translator: per target token, with `tgt_len` of them)."""
    import torch  # lazy: start-up time (torch)
    from torch.utils.flop_counter import FlopCounterMode  # lazy: as above

    heads = pre.family.heads(pre.config)
    ids = torch.full((1, src_len), 5, dtype=torch.long, device=pre.model.device)
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if pre.family.seq2seq:
        kwargs["decoder_input_ids"] = torch.full((1, tgt_len), 5, dtype=torch.long,
                                                 device=pre.model.device)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        pre.model(**kwargs)
    per = tgt_len if pre.family.seq2seq else src_len
    layers = {site: pre.layers(site) for site in heads}
    return {"name": f"hf:{pre.name}", "family": pre.family.name,
            "layers": f"{layers['enc-self']}+{layers.get('dec-self', 0)}",
            "heads": heads, "d_model": pre.d_model,
            "d_k": {site: pre.d_model // n for site, n in heads.items()},
            "params": sum(p.numel() for p in pre.model.parameters()),
            "params_attention": sum(p.numel() for m in pre.family.attentions(pre.model)
                                    for p in m.parameters()),
            "flops_per_token": counter.get_total_flops() / per,
            "flops_tokens": {"src": src_len, **({"tgt": tgt_len} if pre.family.seq2seq else {})}}


def _transformers():
    try:
        import transformers  # lazy: start-up time (transformers), and an optional extra
    except ImportError:
        raise ConfigError(f"hf: models need the transformers package, which is not installed: "
                          f"{INSTALL}") from None
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _where(name: str) -> str:
    """A local dir as it is; a hub name when the hub can be reached (or its cache, offline)."""
    local = Path(name).expanduser()
    if local.is_dir():
        return str(local)
    # a hub name is <model> or <owner>/<model>: a name with more parts, or whose first part is a
    # dir here, is a local path that is not there
    if (local.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1
            or ("/" in name and Path(name.split("/", 1)[0]).expanduser().is_dir())):
        raise DataError(f"hf:{name}: no such save_pretrained dir; give a dir that "
                        "`save_pretrained` wrote, or a hub name (e.g. hf:bert-base-uncased)")
    from heads_lab.data.sources import _hub_reachable  # lazy: the data package (start-up time)

    if os.environ.get("HF_HUB_OFFLINE") or not _hub_reachable():
        from huggingface_hub import snapshot_download  # lazy: only for hub names

        try:  # offline: a copy in the Hugging Face cache is fine
            return snapshot_download(name, local_files_only=True)
        except Exception:  # noqa: BLE001 (not cached: say what to do, in one line)
            raise DataError(f"hf:{name}: the Hugging Face hub is unreachable (offline) and the "
                            "model is not in its cache; download it where there is a network "
                            f"(`hf download {name} --local-dir DIR`, or save_pretrained) and give "
                            "hf:<that dir>") from None
    return name


def _first(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
