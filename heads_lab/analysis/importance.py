"""Head importance (Michel et al. 2019): |∂L/∂ξ| for a multiplier ξ at 1 on every head, per
kind of head (heads_lab.model.heads.head_kinds).

The paper (§4.1): "I_h = E_{x∼X} |∂L(x)/∂ξ_h|", ξ_h the mask variable of head h, and (§4.2) the
scores of each layer normalised by their ℓ2 norm. heads-lab, like the transformers bertology
example built on the authors' code, takes |·| of each batch's gradient (of the mean loss per
target token), not of each sentence's, and averages over batches: signs can cancel within a
batch, so the scores depend somewhat on the batch size (trainer.max_tokens); one backward pass
a batch instead of one a sentence."""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import torch
import torch.nn.functional as F

from heads_lab.data import Split, bucket, collate
from heads_lab.model import evaluating
from heads_lab.model.heads import ALL_SITES, HeadSet, attention_modules, gates_of, multipliers, out_kind
from heads_lab.output.progress import steps

Scores = dict[tuple[str, int, str], np.ndarray]  # (site, layer, kind) → [heads of that kind]

log = logging.getLogger(__name__)


def importance_by_kind(model, split: Split, count: int | None, max_tokens: int, device,
                       masked: HeadSet | None = None, sites=ALL_SITES, all_kinds: bool = True,
                       group: int = 1) -> Scores:
    """Mean over batches (the first `count` sentences of `split`, None: all) of |∂L/∂ξ_h|, L the
    mean NLL per target token and ξ a multiplier at 1 on each head of each kind of the modules
    in `sites` (all_kinds=False: only the kind masks and removal act on); each (module, kind)
    normalised by its ℓ2 norm. The out kind's ξ multiplies the heads' outputs (heads.multipliers);
    talking heads' query/key and softmax heads scale the rows of P_l [h_K, h] and P_w [h, h_V]
    (a layer with one mix (model.mixes): the kind without its mix is the same heads as its
    neighbour, softmax = value heads without P_w, query/key = softmax heads without P_l),
    so at ξ = 1 their ∂L/∂ξ is Σ over the row of P · ∂L/∂P. All are partial derivatives at the
    same point, so one backward pass scores every kind. `masked` heads (of the out kind; with a
    gated model also its closed heads, the gates off) are held at 0."""
    gates = gates_of(model)
    if gates is not None:
        masked = {k: sorted(set(v) | set((masked or {}).get(k, [])))
                  for k, v in {**(masked or {}), **gates.closed()}.items()}
    modules = attention_modules(model)
    mixes = {}  # (site, layer, kind) → the mix whose rows are that kind's heads
    if all_kinds:
        for (site, layer), module in modules.items():
            if site in sites and module.mix_parameters():
                for kind, mix in module.mix_rows().items():
                    mixes[site, layer, kind] = mix
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    for mix in mixes.values():
        mix.requires_grad_(True)
    n = len(split) if count is None else min(count, len(split))
    sums: dict[tuple[str, int, str], np.ndarray] = {}
    batches = 0
    try:
        with evaluating(model), multipliers(model, masked, sites) as xi, \
                (gates.suspended() if gates is not None else contextlib.nullcontext()):
            scored = [key for key in xi if key[0] in sites]
            groups = bucket(split.src_lens[:n], split.tgt_lens[:n], max_tokens)
            for ids in steps(groups, "head importance", len(groups), log, unit="batches"):
                batch = collate(split, ids).to(device)
                keep = batch.tgt_out != model.pad_id
                hidden = model.decode(batch.tgt_in, model.encode(batch.src))[keep]
                logits = model.logits(hidden)
                if logits.dtype in (torch.float16, torch.bfloat16):
                    logits = logits.float()
                loss = F.cross_entropy(logits, batch.tgt_out[keep])
                grads = torch.autograd.grad(loss, [xi[k] for k in scored] + list(mixes.values()))
                for (site, layer), g in zip(scored, grads):
                    key = (site, layer, out_kind(modules[site, layer]))
                    if group > 1:  # one gate over a key/value group's query heads: Σ first
                        g = g.view(-1, group).sum(-1)
                    sums[key] = sums.get(key, 0) + g.abs().double().cpu().numpy()
                for key, g in zip(mixes, grads[len(scored):]):
                    row = (mixes[key].detach() * g).sum(dim=1)  # Σ over the row of P · ∂L/∂P
                    sums[key] = sums.get(key, 0) + row.abs().double().cpu().numpy()
                batches += 1
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
    out = {}
    for key in [k for (site, layer) in modules for k in sorted(sums) if k[:2] == (site, layer)]:
        s = sums[key] / max(batches, 1)
        norm = np.linalg.norm(s)
        out[key] = s / norm if norm > 0 else s
    if all_kinds:  # a talking-heads layer with one mix: two kinds are the same heads
        for (site, layer), module in modules.items():
            for kind, twin in getattr(module, "same_heads", dict)().items():
                if (site, layer, twin) in out:
                    out[site, layer, kind] = out[site, layer, twin]
    return out


def head_importance(model, split: Split, count: int | None, max_tokens: int, device,
                    masked: HeadSet | None = None, sites=ALL_SITES,
                    group: int = 1) -> dict[tuple[str, int], np.ndarray]:
    """Importance of the heads masks and removal act on (MHA heads, talking heads' value heads),
    by (site, layer): what iterative pruning ranks. With `group` > 1, of key/value groups of
    that many query heads each: one gate ξ_g over a group, ∂L/∂ξ_g the sum of its heads' ∂L/∂ξ
    in each batch before |·|."""
    scores = importance_by_kind(model, split, count, max_tokens, device, masked, sites,
                                all_kinds=False, group=group)
    return {(site, layer): v for (site, layer, _), v in scores.items()}


def least_important(importance: dict[tuple[str, int], np.ndarray], masked: HeadSet,
                    n: int) -> list[tuple[str, int, int]]:
    """The `n` least important heads not yet `masked`, least first, as (site, layer, head): one
    step of Michel et al. 2019's pruning by importance (heads removed in order of their
    importance score, lowest first; heads-lab rescores under the current mask before each step).
    Ties go by site, layer and head."""
    ranked = sorted((float(v), site, layer, h) for (site, layer), vals in importance.items()
                    for h, v in enumerate(vals) if h not in masked.get((site, layer), ()))
    return [(site, layer, h) for _, site, layer, h in ranked[:n]]
