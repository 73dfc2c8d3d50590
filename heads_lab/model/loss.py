"""The training loss: label-smoothed cross entropy over the shared vocabulary.

`label_smoothed_loss(logits, target, eps)` works on given logits, with its backward written out.
`output_loss(hidden, weight, target, eps)` fuses the tied output projection with the loss and
works through the tokens in chunks, computing each chunk's gradients on the way (as Liger
Kernel's fused linear cross entropy does): no [tokens, vocab] tensor lives beyond one chunk.
On CPU that matters twice: a 1280 × 8000 fp32 tensor is 41 MB, above glibc's largest mmap
threshold (32 MB), so each one was a fresh mapping whose first touch page-faulted every step
(~15 ms each, three per step: logits, log-probabilities, their gradient); chunks of ≤ 16 MB are
reused from the heap. Memory falls by the same tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_BYTES = 16 << 20  # fp32 [chunk, vocab] tensors of at most this size (< 32 MB)
GPU_CHUNK_BYTES = 256 << 20


def label_smoothed_loss(logits: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed cross entropy and summed NLL over the rows of logits [tokens, vocab]
    (padding already removed), from one log-softmax in at least fp32; equals
    F.cross_entropy(label_smoothing=eps). The backward pass is written out (see
    `_LabelSmoothedCE`), so no one-hot, mean or gather gradient is built."""
    return _LabelSmoothedCE.apply(logits, target, eps)


def _smoothed_terms(lprobs: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    nll = -lprobs.gather(-1, target[:, None]).squeeze(-1)
    smooth = -lprobs.mean(dim=-1)
    return ((1.0 - eps) * nll + eps * smooth).sum(), nll.sum()


def _grad_from_lprobs(lprobs: Tensor, target: Tensor, eps: float, a: Tensor | float,
                      b: Tensor | float) -> Tensor:
    """d/dlogits of a·loss + b·nll, in place over `lprobs`:
    (a + b)·softmax - (a·(1 - ε) + b)·onehot(target) - a·ε/V."""
    vocab = lprobs.shape[-1]
    grad = lprobs.exp_().mul_(a + b).sub_(a * eps / vocab)
    onehot = torch.as_tensor(a * (1.0 - eps) + b, dtype=grad.dtype, device=grad.device)
    onehot = onehot.expand(target.shape[0], 1)
    return grad.scatter_add_(-1, target[:, None], -onehot)


class _LabelSmoothedCE(torch.autograd.Function):
    """loss = Σ_t (1 - ε)·(-log p_t[y_t]) + ε·mean_v(-log p_t[v]),  nll = Σ_t -log p_t[y_t].
    The backward is one exp over the saved log-probabilities, in place, and a scatter, instead
    of autograd's log-softmax, mean and gather backwards."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, eps: float):
        lprobs = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(dim=-1)
        ctx.save_for_backward(lprobs, target)
        ctx.eps, ctx.dtype, ctx.used = eps, logits.dtype, False
        return _smoothed_terms(lprobs, target, eps)

    @staticmethod
    def backward(ctx, grad_loss: Tensor | None, grad_nll: Tensor | None):
        if ctx.used:
            raise RuntimeError("label_smoothed_loss supports one backward pass per forward")
        ctx.used = True  # the saved log-probabilities are overwritten below
        lprobs, target = ctx.saved_tensors
        a = grad_loss if grad_loss is not None else 0.0
        b = grad_nll if grad_nll is not None else 0.0
        return _grad_from_lprobs(lprobs, target, ctx.eps, a, b).to(ctx.dtype), None, None


def output_loss(hidden: Tensor, weight: Tensor, target: Tensor, eps: float,
                chunk: int | None = None) -> tuple[Tensor, Tensor]:
    """label_smoothed_loss(hidden @ weight.T, target, eps), fused and chunked over tokens.
    hidden [tokens, d_model], weight [vocab, d_model]. Under autocast the matmuls run in the
    autocast dtype and the softmax in fp32, as in the unfused path. The NLL carries no gradient."""
    if chunk is None:  # on a GPU no page faults to avoid: larger chunks, fewer launches
        budget = CHUNK_BYTES if weight.device.type == "cpu" else GPU_CHUNK_BYTES
        chunk = max(16, budget // (4 * weight.shape[0]))
    return _OutputLoss.apply(hidden, weight, target, eps, chunk)


class _OutputLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, eps: float, chunk: int):
        device = hidden.device.type
        dtype = (torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device)
                 else torch.promote_types(hidden.dtype, weight.dtype))
        h, w = hidden.to(dtype), weight.to(dtype)
        grad_h = torch.empty_like(h)
        wide = torch.promote_types(dtype, torch.float32)  # the softmax's and grad_w's dtype
        grad_w = torch.zeros(weight.shape, dtype=wide, device=weight.device)
        loss = hidden.new_zeros((), dtype=wide)
        nll = hidden.new_zeros((), dtype=wide)
        with torch.autocast(device, enabled=False):
            for start in range(0, h.shape[0], chunk):
                h_c, t_c = h[start : start + chunk], target[start : start + chunk]
                lprobs = torch.mm(h_c, w.t()).to(wide).log_softmax(dim=-1)
                loss_c, nll_c = _smoothed_terms(lprobs, t_c, eps)
                loss += loss_c
                nll += nll_c
                g = _grad_from_lprobs(lprobs, t_c, eps, 1.0, 0.0).to(dtype)
                torch.mm(g, w, out=grad_h[start : start + chunk])
                grad_w.add_(torch.mm(g.t(), h_c))
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = hidden.dtype, weight.dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor | None):
        grad_h, grad_w = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        return ((grad_h * grad_loss).to(h_dtype), (grad_w * grad_loss).to(w_dtype),
                None, None, None)
