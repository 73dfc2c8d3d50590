"""The heads of an `hf:` model: attention maps per sentence (the model's own, `output_attentions`
with eager attention), head gates through forward pre-hooks on the output projections (a gate
multiplies its head's slice of the projection's input: 0 masks the head, a gradient through it
is Michel et al.'s importance), and the task loss the gradient is taken of.

The hooks never need the model's `head_mask` argument (transformers 5 dropped it; Llama,
Mistral and Qwen2 never had one). The output projection's input is the query heads' outputs
side by side, d_k each, so a gate acts on one query head under grouped-query attention too; a
key/value group's gate is one value over all its query heads (query head i in group
i // (heads / groups)). What the model reads and its loss are its task's
(heads_lab/hf/tasks.py): a translator's source and teacher-forced reference, an encoder's
masked-LM input, a language model's BOS + text.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from heads_lab.analysis.maps import Sentence
from heads_lab.config.sites import SITE
from heads_lab.hf.models import Pretrained
from heads_lab.hf.tasks import Batch


def batch(pre: Pretrained, src: list[list[int]], tgt: list[list[int]] | None,
          device="cpu", loss: bool = False) -> Batch:
    """The model's inputs for sentences (its task's: heads_lab.hf.tasks), with `loss` the labels
    its loss reads."""
    return pre.task.batch(pre, src, tgt, device, loss)


@contextlib.contextmanager
def gated(pre: Pretrained, gates: dict[tuple[str, int], torch.Tensor]) -> Iterator[None]:
    """Each (site, layer)'s query heads multiplied by its gates ([heads], or [groups]: one gate
    per key/value group, spread over its query heads) where they enter the output projection,
    inside the block."""
    handles = []
    for key, gate in gates.items():
        module, heads = pre.outs[key], pre.heads[key]

        def hook(_, inputs, gate=gate, heads=heads):
            x = inputs[0]
            shape = x.shape
            per_head = gate if gate.shape[0] == heads else gate.repeat_interleave(
                heads // gate.shape[0])
            x = x.reshape(*shape[:-1], heads, shape[-1] // heads) * per_head.to(x.dtype)[:, None]
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
    forcing), an encoder's masked-LM loss, a language model's next-token loss."""
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
        found = pre.task.attentions(pre, b, part_tgt is not None)
        for i, (n_src, n_tgt) in enumerate(zip(b.src_len, b.tgt_len)):
            n = {"src": n_src, "tgt": n_tgt}
            site_maps = {site: np.stack([w[i, :, :n[SITE[site].query], :n[SITE[site].key]]
                                         .float().cpu().numpy() for w in weights])
                         for site, weights in found.items() if weights}
            tgt_in = pre.task.tgt_in(pre, part_tgt[i] if part_tgt is not None else None)
            out.append(Sentence(list(src[start + i]), tgt_in, site_maps))
    return out


def importance(pre: Pretrained, src: list[list[int]], tgt: list[list[int]] | None,
               device="cpu", batch_size: int = 16, groups: bool = False
               ) -> dict[tuple[str, int, str], np.ndarray]:
    """Michel et al. 2019: I_h = mean over batches of |∂L/∂ξ_h|, ξ a gate at 1 on each head,
    L the batch's mean per-token loss (loss()); normalised by the ℓ2 norm of its layer (as
    heads-lab's own importance). With `groups`, ξ_g is one gate over all the query heads of a
    key/value group g, so ∂L/∂ξ_g is the sum of its query heads' gradients in each batch before
    |·|. Returns {(site, layer, "head" or "group"): [heads or groups]}."""
    sizes = pre.groups if groups else pre.heads
    gates = {key: torch.ones(n, device=device, requires_grad=True) for key, n in sizes.items()}
    sums = {key: np.zeros(n) for key, n in sizes.items()}
    batches = 0
    for start in range(0, len(src), batch_size):
        part_tgt = tgt[start:start + batch_size] if tgt is not None else None
        b = batch(pre, src[start:start + batch_size], part_tgt, device, loss=True)
        with torch.enable_grad(), gated(pre, gates):
            grads = torch.autograd.grad(loss(pre, b), list(gates.values()))
        for key, g in zip(gates, grads):
            sums[key] += g.abs().detach().cpu().double().numpy()
        batches += 1
    out = {}
    kind = "group" if groups else "head"
    for (site, layer), total in sums.items():
        mean = total / max(batches, 1)
        norm = np.linalg.norm(mean)
        out[(site, layer, kind)] = mean / norm if norm > 0 else mean
    return out
