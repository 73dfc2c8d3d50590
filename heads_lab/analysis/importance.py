"""Head importance (Michel et al. 2019): |∂L/∂ξ| for a multiplier ξ at 1 on every head, per
kind of head (heads_lab.heads.head_kinds)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from heads_lab.data import Split, bucket, collate
from heads_lab.heads import SITES, HeadSet, attention_modules, head_kinds, mask_heads, out_kind
from heads_lab.heads import set_kind_gate as _set

Scores = dict[tuple[str, int, str], np.ndarray]  # (site, layer, kind) → [heads of that kind]


def importance_by_kind(model, split: Split, count: int | None, max_tokens: int, device,
                       masked: HeadSet | None = None, sites=SITES, all_kinds: bool = True) -> Scores:
    """Mean over batches (the first `count` sentences of `split`, None: all) of |∂L/∂ξ_h|, L the
    mean NLL per target token and ξ a multiplier at 1 on each head of each kind of the modules
    in `sites` (all_kinds=False: only the kind masks and removal act on); each (module, kind)
    normalised by its ℓ2 norm. The partial derivatives are taken at the same point (every ξ at
    1), so one backward pass scores every kind. `masked` heads (of the removal kind; with a
    gated model also its closed heads) are held at 0 and score 0."""
    was_training = model.training
    model.eval()
    gates, model.gates = model.gates, None  # a gated model: its closed heads count as masked
    if gates is not None:
        masked = {k: sorted(set(v) | set((masked or {}).get(k, [])))
                  for k, v in {**(masked or {}), **gates.closed()}.items()}
    modules = attention_modules(model)
    xi: dict[tuple[str, int, str], torch.Tensor] = {}
    for (site, layer), module in modules.items():
        for kind, n in head_kinds(module).items():
            removal = kind == out_kind(module)
            if not (removal or all_kinds):
                continue
            gate = torch.ones(n, device=device)
            if removal and masked and (site, layer) in masked:
                gate[masked[(site, layer)]] = 0.0
            xi[site, layer, kind] = gate.requires_grad_(site in sites)
            _set(module, kind, xi[site, layer, kind])
    scored = [key for key in xi if key[0] in sites]
    sums = {key: np.zeros(len(xi[key])) for key in scored}
    n = len(split) if count is None else min(count, len(split))
    batches = 0
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        for ids in bucket(split.src_lens[:n], split.tgt_lens[:n], max_tokens):
            batch = collate(split, ids).to(device)
            keep = batch.tgt_out != model.pad_id
            hidden = model.decode(batch.tgt_in, model.encode(batch.src))[keep]
            logits = model.logits(hidden)
            if logits.dtype in (torch.float16, torch.bfloat16):
                logits = logits.float()
            loss = F.cross_entropy(logits, batch.tgt_out[keep])
            for key, g in zip(scored, torch.autograd.grad(loss, [xi[k] for k in scored])):
                sums[key] += g.abs().double().cpu().numpy()
            batches += 1
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
        for (site, layer, kind) in xi:
            _set(modules[site, layer], kind, None)
        if masked and gates is None:
            mask_heads(model, masked)
        model.gates = gates
        model.train(was_training)
    out = {}
    for key, s in sums.items():
        s = s / max(batches, 1)
        norm = np.linalg.norm(s)
        out[key] = s / norm if norm > 0 else s
    return out


def head_importance(model, split: Split, count: int | None, max_tokens: int, device,
                    masked: HeadSet | None = None, sites=SITES) -> dict[tuple[str, int], np.ndarray]:
    """Importance of the heads masks and removal act on (MHA heads, talking heads' value heads),
    by (site, layer): what iterative pruning ranks."""
    scores = importance_by_kind(model, split, count, max_tokens, device, masked, sites,
                                all_kinds=False)
    return {(site, layer): v for (site, layer, _), v in scores.items()}


def head_importance_flat(importance: dict[tuple[str, int], np.ndarray]) -> list[tuple[float, str,
                                                                                       int, int]]:
    """(importance, site, layer, head) for every scored head, least important first."""
    return sorted((float(v), site, layer, h) for (site, layer), vals in importance.items()
                  for h, v in enumerate(vals))
