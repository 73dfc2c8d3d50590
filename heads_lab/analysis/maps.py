"""Teacher-forced attention maps of a split, one Sentence per source sentence."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from heads_lab.config.sites import SITE, SITES
from heads_lab.data import Split, collate
from heads_lab.model import evaluating
from heads_lab.model.heads import recording
from heads_lab.output.progress import Steps

log = logging.getLogger(__name__)

# arcs over a sentence's words (Sentence.units): (head word, dependent word, relation)
Arc = tuple[int, int, str]


@dataclass
class Sentence:
    """One sentence's teacher-forced attention: src ids (+ EOS), tgt_in ids (BOS + tokens) and
    maps[site] [layers, heads, query, key] (float32; the heads are the maps' own kind: softmax
    heads for talking heads). Without a target only enc-self is there. With a tree
    (syntax.attach_arcs): `units`, each word's source subword positions, and `arcs` over them."""

    src: list[int]
    tgt_in: list[int]
    maps: dict[str, np.ndarray]
    arcs: list[Arc] = field(default_factory=list)
    units: list[list[int]] = field(default_factory=list)


@torch.no_grad()
def collect_maps(model, split: Split, count: int | None, device, batch_size: int = 32,
                 decoder: bool = True) -> list[Sentence]:
    """Attention maps of the first `count` (None: all) sentences of `split`, teacher-forced on
    its targets; `decoder=False` runs the encoder alone (no target: enc-self maps only)."""
    out: list[Sentence] = []
    if torch.device(device).type == "cuda":
        log.info("maps recorded through the explicit attention path: the fused SDPA kernel "
                 "returns no weights")
    ids_all = np.arange(len(split) if count is None else min(count, len(split)))
    progress = Steps("attention maps", len(ids_all), log, unit="sentences")
    for start in range(0, len(ids_all), batch_size):
        batch = collate(split, ids_all[start:start + batch_size]).to(device)
        with evaluating(model), recording(model) as recorded:
            memory = model.encode(batch.src, need_weights=True)
            if decoder:
                model.decode(batch.tgt_in, memory, need_weights=True)
        weights: dict[str, list] = {}
        for (site, _), w in recorded.items():  # in layer order
            weights.setdefault(site, []).append(w)
        sites = SITES if decoder else ("enc-self",)
        for row in range(batch.src.shape[0]):
            n_src = int((batch.src[row] != model.pad_id).sum())
            n_tgt = int((batch.tgt_in[row] != model.pad_id).sum())
            n = {"src": n_src, "tgt": n_tgt}
            size = {name: (n[s.query], n[s.key]) for name, s in SITE.items()}
            maps = {site: np.stack([w[row, :, :size[site][0], :size[site][1]].float().cpu().numpy()
                                    for w in weights[site]]) for site in sites if weights.get(site)}
            out.append(Sentence(batch.src[row, :n_src].tolist(),
                                batch.tgt_in[row, :n_tgt].tolist() if decoder else [], maps))
        progress.step(batch.src.shape[0])
    progress.finish()
    return out


@torch.no_grad()
def collect_lm_maps(model, rows: list[list[int]], device, batch_size: int = 32) -> list[Sentence]:
    """A language model's (heads_lab.model.lm) attention maps of token sequences `rows` (BOS
    first, read as they are): each a Sentence with src = the row, maps["lm-self"] [layers,
    heads, n, n]."""
    out: list[Sentence] = []
    pad = model.pad_id
    progress = Steps("attention maps", len(rows), log, unit="sentences")
    for start in range(0, len(rows), batch_size):
        part = rows[start:start + batch_size]
        width = max(len(r) for r in part)
        x = torch.full((len(part), width), pad, dtype=torch.long)
        for i, r in enumerate(part):
            x[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        with evaluating(model), recording(model) as recorded:
            model.decode(x.to(device), None, need_weights=True)
        weights = [w for (site, _), w in recorded.items() if site == "lm-self"]  # layer order
        for i, r in enumerate(part):
            n = len(r)
            maps = {"lm-self": np.stack([w[i, :, :n, :n].float().cpu().numpy() for w in weights])}
            out.append(Sentence(list(r), [], maps))
        progress.step(len(part))
    progress.finish()
    return out
