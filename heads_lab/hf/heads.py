"""The heads of an `hf:` model: attention maps per sentence (the model's own, `output_attentions`
with eager attention), head gates through forward pre-hooks on the output projections (a gate
multiplies its head's slice of the projection's input: 0 masks the head, a gradient through it
is Michel et al.'s importance), and the task loss the gradient is taken of.

The hooks never need the model's `head_mask` argument (newer transformers versions drop it).
Inputs follow heads-lab's conventions: a source ends with its end token (Marian's </s>, BERT's
[SEP]: the analysis's EOS); a translator's decoder reads the start token and the reference
(teacher forcing); an encoder's loss is the masked-LM loss with a fixed 15 % of the tokens
masked (seeded: the same positions every time).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from heads_lab.analysis.maps import Sentence
from heads_lab.hf.models import Pretrained

MASK_SHARE, MASK_SEED = 0.15, 20261127


@dataclass
class Batch:
    """Padded model inputs for sentences (src ids with the model's special tokens; tgt: a
    translator's reference ids, pieces + </s>)."""

    kwargs: dict[str, torch.Tensor]
    src_len: list[int]
    tgt_len: list[int]


def batch(pre: Pretrained, src: list[list[int]], tgt: list[list[int]] | None,
          device="cpu", mlm: bool = False) -> Batch:
    """Model inputs: input_ids and attention_mask; a translator's decoder_input_ids (its start
    token + the reference without </s>) and labels; with `mlm`, an encoder's masked input and
    labels."""
    pad = pre.config.pad_token_id if pre.config.pad_token_id is not None else 0
    width = max(len(s) for s in src)
    ids = torch.full((len(src), width), pad, dtype=torch.long)
    mask = torch.zeros((len(src), width), dtype=torch.long)
    for i, s in enumerate(src):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    kwargs = {"input_ids": ids, "attention_mask": mask}
    tgt_len = [0] * len(src)
    if pre.family.seq2seq and tgt is not None:
        start = pre.config.decoder_start_token_id
        dec = [[start] + t[:-1] for t in tgt]
        tgt_len = [len(d) for d in dec]
        width = max(tgt_len)
        dec_ids = torch.full((len(src), width), pad, dtype=torch.long)
        labels = torch.full((len(src), width), -100, dtype=torch.long)
        for i, (d, t) in enumerate(zip(dec, tgt)):
            dec_ids[i, :len(d)] = torch.tensor(d)
            labels[i, :len(t)] = torch.tensor(t)
        kwargs |= {"decoder_input_ids": dec_ids, "labels": labels}
    elif mlm:
        kwargs |= masked_lm(pre, ids, mask)
    return Batch({k: v.to(device) for k, v in kwargs.items()}, [len(s) for s in src], tgt_len)


def masked_lm(pre: Pretrained, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """A fixed MASK_SHARE of the non-special tokens of each sentence replaced by [MASK] (at
    least one), their ids the labels: the masked-LM loss importance and pruning read."""
    tok = pre.tokens.tok
    special = set(tok.all_special_ids)
    rng = np.random.default_rng(MASK_SEED)
    masked, labels = ids.clone(), torch.full_like(ids, -100)
    for i in range(ids.shape[0]):
        where = [j for j in range(int(mask[i].sum())) if int(ids[i, j]) not in special]
        if not where:
            continue
        chosen = rng.choice(where, size=max(1, round(MASK_SHARE * len(where))), replace=False)
        labels[i, chosen] = ids[i, chosen]
        masked[i, chosen] = tok.mask_token_id
    return {"input_ids": masked, "labels": labels}


@contextlib.contextmanager
def gated(pre: Pretrained, gates: dict[tuple[str, int], torch.Tensor]) -> Iterator[None]:
    """Each (site, layer)'s heads multiplied by its gates ([heads]) where they enter the output
    projection, inside the block."""
    handles = []
    for key, gate in gates.items():
        module, heads = pre.outs[key], pre.heads[key]

        def hook(_, inputs, gate=gate, heads=heads):
            x = inputs[0]
            shape = x.shape
            x = x.reshape(*shape[:-1], heads, shape[-1] // heads) * gate.to(x.dtype)[:, None]
            return (x.reshape(shape), *inputs[1:])

        handles.append(module.register_forward_pre_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def masked(pre: Pretrained, heads: dict[tuple[str, int], list[int]]):
    """The heads listed per (site, layer) zeroed (a context manager)."""
    gates = {}
    for key, chosen in heads.items():
        gate = torch.ones(pre.heads[key])
        gate[list(chosen)] = 0.0
        gates[key] = gate
    return gated(pre, gates)


def loss(pre: Pretrained, b: Batch) -> torch.Tensor:
    """The mean per-token loss of the batch: a translator's reference cross-entropy (teacher
    forcing), an encoder's masked-LM loss."""
    return pre.model(**b.kwargs).loss


@torch.no_grad()
def maps(pre: Pretrained, src: list[list[int]], tgt: list[list[int]] | None,
         device="cpu", batch_size: int = 16) -> list[Sentence]:
    """Each sentence's maps[site] [layers, heads, query, key] (padding cut off), from the model's
    own attention weights; a translator's decoder teacher-forced on `tgt` (None: enc-self only)."""
    out = []
    for start in range(0, len(src), batch_size):
        part_tgt = tgt[start:start + batch_size] if tgt is not None else None
        b = batch(pre, src[start:start + batch_size], part_tgt, device)
        inputs = {k: v for k, v in b.kwargs.items() if k != "labels"}
        if pre.family.seq2seq and part_tgt is None:
            found = {"enc-self": pre.model.get_encoder()(
                **inputs, output_attentions=True).attentions}
        else:
            res = pre.model(**inputs, output_attentions=True)
            found = ({"enc-self": res.encoder_attentions, "dec-self": res.decoder_attentions,
                      "dec-enc": res.cross_attentions} if pre.family.seq2seq
                     else {"enc-self": res.attentions})
        for i, (n_src, n_tgt) in enumerate(zip(b.src_len, b.tgt_len)):
            size = {"enc-self": (n_src, n_src), "dec-self": (n_tgt, n_tgt),
                    "dec-enc": (n_tgt, n_src)}
            site_maps = {site: np.stack([w[i, :, :size[site][0], :size[site][1]].float().cpu()
                                         .numpy() for w in weights])
                         for site, weights in found.items() if weights}
            tgt_in = ([pre.config.decoder_start_token_id] + part_tgt[i][:-1]
                      if part_tgt is not None and pre.family.seq2seq else [])
            out.append(Sentence(list(src[start + i]), tgt_in, site_maps))
    return out


def importance(pre: Pretrained, src: list[list[int]], tgt: list[list[int]] | None,
               device="cpu", batch_size: int = 16) -> dict[tuple[str, int, str], np.ndarray]:
    """Michel et al. 2019: I_h = mean over batches of |∂L/∂ξ_h|, ξ a gate at 1 on each head,
    L the batch's mean per-token loss (loss()); normalised by the ℓ2 norm of its layer (as
    heads-lab's own importance). Returns {(site, layer, "head"): [heads]}."""
    gates = {key: torch.ones(n, device=device, requires_grad=True)
             for key, n in pre.heads.items()}
    sums = {key: np.zeros(n) for key, n in pre.heads.items()}
    batches = 0
    for start in range(0, len(src), batch_size):
        part_tgt = tgt[start:start + batch_size] if tgt is not None else None
        b = batch(pre, src[start:start + batch_size], part_tgt, device,
                  mlm=not pre.family.seq2seq)
        with torch.enable_grad(), gated(pre, gates):
            grads = torch.autograd.grad(loss(pre, b), list(gates.values()))
        for key, g in zip(gates, grads):
            sums[key] += g.abs().detach().cpu().double().numpy()
        batches += 1
    out = {}
    for (site, layer), total in sums.items():
        mean = total / max(batches, 1)
        norm = np.linalg.norm(mean)
        out[(site, layer, "head")] = mean / norm if norm > 0 else mean
    return out
