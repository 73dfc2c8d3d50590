"""Loading `hf:` models and where their heads are.

A family says which transformers class to load, its task kind (heads_lab/hf/tasks.py:
translate, mlm or lm), and for each (site, layer) the module whose input is the heads' outputs
side by side (the output projection: Marian's `out_proj`, BERT's `attention.output.dense`,
DistilBERT's `out_lin`, GPT-2's `attn.c_proj`, GPT-NeoX's `attention.dense`, Llama's, Mistral's
and Qwen2's `self_attn.o_proj`), where heads-lab's hooks gate heads: a query head's slice of that
input is its output alone, under grouped-query attention too. Heads per site, key/value heads
and d_k are read from the config (`head_dim` where it sets one). Other model types are refused
in one line: their layers are not mapped onto heads-lab's sites (nothing is assumed about names
that merely look alike).
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
from heads_lab.hf.tasks import TASKS, Task

log = logging.getLogger(__name__)
INSTALL = "pip install 'heads-lab[hf]' (transformers; `make test` installs it)"


@dataclass(frozen=True)
class Family:
    name: str
    model_class: str  # the transformers class loaded (its task head gives the loss)
    task: Task  # what it reads and is scored on (heads_lab.hf.tasks)
    outs: Callable[[Any], dict[tuple[str, int], Any]]  # model → (site, layer) → output projection
    attentions: Callable[[Any], list]  # model → its attention projections (their parameters
    # counted: queries, keys, values and the output, not a LayerNorm a family keeps beside them)
    heads: Callable[[Any], dict[str, int]] | None = None  # config → query heads per site
    # (None: its task's sites × config.num_attention_heads)


def _marian_outs(model) -> dict[tuple[str, int], Any]:
    inner = model.model
    out = {("enc-self", i): layer.self_attn.out_proj for i, layer in enumerate(inner.encoder.layers)}
    out |= {("dec-self", i): layer.self_attn.out_proj for i, layer in enumerate(inner.decoder.layers)}
    out |= {("dec-enc", i): layer.encoder_attn.out_proj
            for i, layer in enumerate(inner.decoder.layers)}
    return out


def _llama_like(name: str, model_class: str) -> Family:
    """A Llama-style causal LM (Llama, Mistral, Qwen2): `model.layers[i].self_attn` with q/k/v
    projections and `o_proj`, grouped-query attention by config.num_key_value_heads."""
    return Family(name, model_class, TASKS["lm"],
                  lambda m: {("lm-self", i): layer.self_attn.o_proj
                             for i, layer in enumerate(m.model.layers)},
                  lambda m: [layer.self_attn for layer in m.model.layers])


FAMILIES = {
    "marian": Family("marian", "MarianMTModel", TASKS["translate"], _marian_outs,
                     lambda m: [layer.self_attn for layer in m.model.encoder.layers]
                     + [a for layer in m.model.decoder.layers
                        for a in (layer.self_attn, layer.encoder_attn)],
                     lambda c: {"enc-self": c.encoder_attention_heads,
                                "dec-self": c.decoder_attention_heads,
                                "dec-enc": c.decoder_attention_heads}),
    "bert": Family("bert", "BertForMaskedLM", TASKS["mlm"],
                   lambda m: {("enc-self", i): layer.attention.output.dense
                              for i, layer in enumerate(m.bert.encoder.layer)},
                   lambda m: [part for layer in m.bert.encoder.layer  # (not its LayerNorm)
                              for part in (layer.attention.self, layer.attention.output.dense)]),
    "distilbert": Family("distilbert", "DistilBertForMaskedLM", TASKS["mlm"],
                         lambda m: {("enc-self", i): layer.attention.out_lin
                                    for i, layer in enumerate(m.distilbert.transformer.layer)},
                         lambda m: [layer.attention for layer in m.distilbert.transformer.layer]),
    "gpt2": Family("gpt2", "GPT2LMHeadModel", TASKS["lm"],
                   lambda m: {("lm-self", i): block.attn.c_proj
                              for i, block in enumerate(m.transformer.h)},
                   lambda m: [block.attn for block in m.transformer.h]),
    "gpt_neox": Family("gpt_neox", "GPTNeoXForCausalLM", TASKS["lm"],
                       lambda m: {("lm-self", i): layer.attention.dense
                                  for i, layer in enumerate(m.gpt_neox.layers)},
                       lambda m: [layer.attention for layer in m.gpt_neox.layers]),
    "llama": _llama_like("llama", "LlamaForCausalLM"),
    "mistral": _llama_like("mistral", "MistralForCausalLM"),
    "qwen2": _llama_like("qwen2", "Qwen2ForCausalLM"),
}


def query_heads(family: Family, config) -> dict[str, int]:
    """Query heads per site of a model of `family`."""
    if family.heads is not None:
        return family.heads(config)
    return dict.fromkeys(family.task.sites, int(config.num_attention_heads))


def kv_heads(config, heads: int) -> int:
    """Key/value heads: config.num_key_value_heads where the config sets it (grouped- or
    multi-query attention), else one per query head."""
    kv = getattr(config, "num_key_value_heads", None)
    return int(kv) if kv else heads


def head_dim(config, heads: int) -> int:
    """d_k: config.head_dim where the config sets it (Llama, Mistral, Qwen2 may make it other
    than d_model / h), else d_model / h."""
    width = getattr(config, "head_dim", None)
    return int(width) if width else d_model(config) // heads


def d_model(config) -> int:
    for name in ("d_model", "hidden_size", "dim", "n_embd"):
        width = getattr(config, name, None)
        if width:
            return int(width)
    raise DataError(f"a {config.model_type!r} config with no model width (hidden_size)")


class Tokens:
    """The model's own tokenizer in the terms heads-lab's analysis uses: `encode` gives the ids
    the model reads, with its special tokens as its task says (Marian's pieces + </s>, BERT's
    [CLS] pieces [SEP], a causal LM's BOS + pieces), `encode_spans` the ids up to the special
    tokens after the text (a source's </s> or [SEP]; a language model has none: no text token is
    dropped) and each one's character span in the text (a special token: an empty span, part of
    no word), `pieces` the tokens of ids."""

    pretrained = True  # its pieces label maps as they are, special tokens included

    def __init__(self, tokenizer, task: Task, config=None):
        self.tok, self.task, self.config = tokenizer, task, config
        self.start = task.start(tokenizer, config)
        self.text_end = task.text_end
        # a byte-level BPE (GPT-2's kind: a space is "Ġ", a newline "Ċ"): pieces are shown as the
        # text they stand for, a space as "▁" (SentencePiece's mark), a newline as "↵"
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.byte_level = "ByteLevel" in repr(getattr(backend, "decoder", None))

    def __len__(self) -> int:
        return len(self.tok)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.task.encode(self.tok, self.start, texts)

    def encode_target(self, texts: list[str]) -> list[list[int]]:
        """A translator's reference ids (pieces + </s>), as its labels."""
        return [list(ids) for ids in self.tok(text_target=list(texts))["input_ids"]]

    def pieces(self, ids: list[int]) -> list[str]:
        tokens = self.tok.convert_ids_to_tokens(list(ids))
        if not self.byte_level:
            return tokens
        return [self.tok.convert_tokens_to_string([t]).replace(" ", "▁").replace("\n", "↵")
                for t in tokens]

    def encode_spans(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        found = self.task.spans(self.tok, self.start, text)
        ids = found[0] if found else self.encode([text])[0]
        keep = len(ids) - self.text_end
        if found:
            return ids[:keep], found[1][:keep]
        lead = self.lead(ids)
        return ids[:keep], [(0, 0)] * lead + piece_spans(self.pieces(ids[lead:keep]))

    def lead(self, ids: list[int]) -> int:
        """How many of `ids` come before the text: a language model's BOS (0 for a source,
        whose special token is after it)."""
        return int(self.text_end == 0 and bool(ids) and ids[0] == self.bos_id)

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.tok.batch_decode(ids, skip_special_tokens=True)

    @property
    def bos_id(self) -> int | None:
        """The token a text starts from: the one `encode` puts first, else the tokenizer's
        BOS (which it adds itself), if any."""
        return self.start[0] if self.start else self.tok.bos_token_id

    def ordinary_ids(self) -> list[int]:
        """Every token id but the special ones (what random probe tokens are drawn from)."""
        special = set(self.tok.all_special_ids)
        return [i for i in range(len(self.tok)) if i not in special]


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
    def task(self) -> Task:
        return self.family.task

    @property
    def site_heads(self) -> dict[str, int]:
        """Query heads per site."""
        return query_heads(self.family, self.config)

    @property
    def heads(self) -> dict[tuple[str, int], int]:
        per_site = self.site_heads
        return {key: per_site[key[0]] for key in self.outs}

    @property
    def kv_heads(self) -> dict[str, int]:
        """Key/value heads per site (as many as the query heads but for grouped-query
        attention)."""
        return {site: kv_heads(self.config, n) for site, n in self.site_heads.items()}

    @property
    def groups(self) -> dict[tuple[str, int], int]:
        """Key/value groups per (site, layer) where several query heads share a key/value head
        (query head i in group i // (heads / groups)); {} without grouped-query attention."""
        kv = self.kv_heads
        return {key: kv[key[0]] for key, n in self.heads.items() if kv[key[0]] < n}

    @property
    def d_k(self) -> dict[str, int]:
        return {site: head_dim(self.config, n) for site, n in self.site_heads.items()}

    @property
    def d_model(self) -> int:
        return d_model(self.config)

    @property
    def positions(self) -> int | None:
        """The longest sequence the model reads (its position embeddings, or as configured)."""
        n = getattr(self.config, "max_position_embeddings", None)
        return int(n) if n else None

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
                              "dec-self, dec-enc and lm-self); other families are not supported")
        _check_groups(name, family, config)
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
    family.task.check(name, tokenizer, config)
    model = model.to(device).eval()
    return Pretrained(name, family, model, Tokens(tokenizer, family.task, config), config,
                      family.outs(model))


def _check_groups(name: str, family: Family, config) -> None:
    """Grouped-query heads that do not divide evenly into their key/value heads: one line (the
    library would fail deep inside a forward pass)."""
    for n in query_heads(family, config).values():
        kv = kv_heads(config, n)
        if kv < 1 or n % kv:
            raise DataError(f"hf:{name}: {n} query heads do not divide into {kv} key/value "
                            "heads (num_attention_heads must be a multiple of "
                            "num_key_value_heads); the config is damaged or not this family's")


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


def account(pre: Pretrained, length: int | None = None) -> dict[str, Any]:
    """What `heads-lab info hf:...` prints: layers, per site the query heads, key/value heads and
    d_k, widths, parameters (all, attention; attention weights per query head and per
    key/value group), FLOPs per token of a forward pass (torch.utils.flop_counter on one
    sequence of its task's `flops_length`: 20 tokens for a translator, per target token with
    20 of them, or an encoder; 128 tokens of context for a causal LM, or its positions where
    fewer), and the key/value cache per
    token in the model's dtype (2 · layers · kv heads · d_k · bytes)."""
    import torch  # lazy: start-up time (torch)
    from torch.utils.flop_counter import FlopCounterMode  # lazy: as above

    task = pre.task
    if length is None:
        length = min(task.flops_length, pre.positions or task.flops_length)
    kwargs, per, lengths = task.flops_inputs(pre, length)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        pre.model(**kwargs)
    dtype = next(pre.model.parameters()).dtype
    size = torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 4
    cache, cache_of = task.kv_cache(pre, size)
    d = pre.d_model
    return {"name": f"hf:{pre.name}", "family": pre.family.name, "task": task.name,
            "layers": task.layers(pre), "heads": pre.site_heads, "kv_heads": pre.kv_heads,
            "d_model": d, "d_k": pre.d_k,
            "params": sum(p.numel() for p in pre.model.parameters()),
            "params_attention": sum(p.numel() for m in pre.family.attentions(pre.model)
                                    for p in m.parameters()),
            # W_Q's rows and W_O's columns of one query head; W_K's and W_V's of one group
            "weights_per_query_head": {site: 2 * d * k for site, k in pre.d_k.items()},
            "weights_per_kv_group": {site: 2 * d * k for site, k in pre.d_k.items()},
            "flops_per_token": counter.get_total_flops() / per, "flops_tokens": lengths,
            "dtype": str(dtype).replace("torch.", ""), "kv_cache_bytes_per_token": cache,
            "kv_cache": cache_of}


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
