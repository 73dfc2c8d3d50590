"""The attention sites and the head specs users type (`enc:0:3,dec-enc:2:*`). Torch-free: the
config validates head specs without building a model.

A site is where attention happens: an encoder-decoder's enc-self (source → source), dec-self
(target → target) and dec-enc (target → source), Voita et al.'s e, d and d-e; a decoder-only
language model's lm-self (text → earlier text: causal self-attention over the text it reads,
which starts with a BOS token). Heads are addressed (site, layer, head), layers and heads counted
from 0. A site's properties (which side its queries and keys read, whether it is causal, where
its special token sits) decide which measures of the maps apply to it
(heads_lab/analysis/measures.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from heads_lab.errors import ConfigError


@dataclass(frozen=True)
class Site:
    name: str  # enc-self
    spec: str  # its name in head specs: enc
    short: str  # Voita's letter, in tables: e
    query: str  # the side its queries come from: src or tgt
    key: str  # the side its keys come from
    stack: str  # the layers it lives in: encoder or decoder
    causal: bool = False  # a query sees only keys at or before its own position
    # where its sequences' special token is, left out of the argmax measures as "not a real
    # token" (Voita et al.'s EOS): "eos" the source's last token (its keys, and an encoder's
    # query), "bos" a language model's first token (its query and key), None: none left out
    special: str | None = None

    @property
    def label(self) -> str:
        words = {"src": "source", "tgt": "target"}
        if self.causal and self.self_attention and self.query == "src":
            return f"{self.name}: text → earlier text (causal)"
        return f"{self.name}: {words[self.query]} → {words[self.key]}"

    @property
    def self_attention(self) -> bool:
        return self.query == self.key

    @property
    def text_keys(self) -> bool:
        """Its keys are the analysed text's tokens (the source side): rare words and syntax can
        be read off them."""
        return self.key == "src"


SITE = {s.name: s for s in (Site("enc-self", "enc", "e", "src", "src", "encoder", special="eos"),
                            Site("dec-self", "dec", "d", "tgt", "tgt", "decoder", causal=True),
                            Site("dec-enc", "dec-enc", "d-e", "tgt", "src", "decoder",
                                 special="eos"),
                            Site("lm-self", "lm", "l", "src", "src", "decoder", causal=True,
                                 special="bos"))}
SITES = ("enc-self", "dec-self", "dec-enc")  # an encoder-decoder's, the fixed order of its tables
ALL_SITES = tuple(SITE)  # every site, the fixed order of analysis records and figures
ALIASES = {alias: s.name for s in SITE.values() for alias in (s.name, s.spec, s.short)} | {
    "cross": "dec-enc"}
HeadSet = dict[tuple[str, int], list[int]]  # (site, layer) → head indices
KEPT_COLUMNS = tuple(f"kept {SITE[s].short}" for s in SITES)  # heads kept per site, in tables


def present(data) -> list[str]:
    """The sites `data` (a mapping by site name) has, non-empty, in the fixed order; unknown
    names refused (ValueError)."""
    unknown = [s for s in data if s not in SITE]
    if unknown:
        raise ValueError(f"unknown attention sites {unknown}: choose from {list(ALL_SITES)}")
    return [s for s in ALL_SITES if s in data and len(data[s]) > 0]


def layers(model_cfg, site: str) -> int:
    """How many layers of a ModelConfig have attention at `site`."""
    stack = SITE[site].stack
    return model_cfg.encoder_layers if stack == "encoder" else model_cfg.decoder_layers


def parse_head_mask(spec: str, counts: dict[tuple[str, int], int]) -> HeadSet:
    """`enc:0:3,dec-enc:2:*` → {("enc-self", 0): [3], ("dec-enc", 2): [0, …, h-1]}. Sites:
    enc (enc-self), dec (dec-self), dec-enc (cross), lm (lm-self); layer and head are 0-based
    ints or *; items separated by commas (quote them on a Hydra command line) or +. `counts`: heads per
    (site, layer). A bad item is a ConfigError naming it and the choices."""
    out: HeadSet = {}
    for item in filter(None, (s.strip() for s in re.split(r"[,+\s]", spec))):
        parts = item.split(":")
        if len(parts) != 3 or parts[0] not in ALIASES:
            raise ConfigError(f"bad head spec {item!r} in {spec!r}: write site:layer:head, site "
                              "one of enc, dec, dec-enc, lm, layer and head a number or *, "
                              "e.g. enc:0:3,dec-enc:2:*")
        site = ALIASES[parts[0]]
        site_layers = sorted(layer for s, layer in counts if s == site)
        for layer in _pick(parts[1], site_layers, f"{site} layer", item):
            heads = list(range(counts[(site, layer)]))
            for head in _pick(parts[2], heads, f"{site} layer {layer} head", item):
                chosen = out.setdefault((site, layer), [])
                if head not in chosen:
                    chosen.append(head)
    return {key: sorted(v) for key, v in out.items()}


def _pick(text: str, choices: list[int], what: str, item: str) -> list[int]:
    if text == "*":
        return choices
    if not re.fullmatch(r"\d+", text) or int(text) not in choices:
        raise ConfigError(f"head spec {item!r}: no {what} {text!r}; choose from "
                          f"{choices[0]}-{choices[-1]} or *" if choices else f"no {what}s")
    return [int(text)]


def format_heads(heads: HeadSet) -> str:
    """The inverse of parse_head_mask (one item per head)."""
    return ",".join(f"{SITE[site].spec}:{layer}:{h}" for (site, layer), hs in sorted(heads.items())
                    for h in hs)
