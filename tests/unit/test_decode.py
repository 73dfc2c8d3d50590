"""Greedy and beam search: cache equals no cache, beam equals exhaustive search when wide."""

from __future__ import annotations

import itertools

import pytest
import torch

from heads_lab.config.schemas import ModelConfig
from heads_lab.data.tokenizer import BOS, EOS
from heads_lab.model import Transformer
from heads_lab.model.decode import beam_search, greedy, top_k


def _model(vocab: int = 30, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0)
    model = Transformer(cfg, vocab).eval()
    with torch.no_grad():  # make EOS neither certain nor impossible
        model.embed.weight.mul_(3.0)
    return model


def _src(vocab: int = 30) -> torch.Tensor:
    torch.manual_seed(1)
    src = torch.randint(4, vocab, (5, 7))
    src[:, -1] = EOS
    src[2, 4:] = 0
    src[2, 3] = EOS
    return src


def test_greedy_cached_equals_uncached():
    model, src = _model(), _src()
    assert greedy(model, src, 12, use_cache=True) == greedy(model, src, 12, use_cache=False)


@pytest.mark.parametrize("beam,lenpen", [(2, 0.6), (4, 1.0), (5, 0.0)])
def test_beam_cached_equals_uncached(beam, lenpen):
    model, src = _model(), _src()
    assert beam_search(model, src, beam, lenpen, 12, use_cache=True) == \
        beam_search(model, src, beam, lenpen, 12, use_cache=False)


def test_beam_of_one_without_length_penalty_is_greedy():
    model, src = _model(), _src()
    assert beam_search(model, src, 1, 0.0, 12) == greedy(model, src, 12)


def test_outputs_stop_at_the_length_limit():
    """This model ends no row on its own within 12 tokens, so the limit alone sets the length:
    max_len − 1 tokens, the last place kept for EOS (a limit off by one either way fails)."""
    model, src = _model(), _src()
    for limit in (4, 12):
        lengths = [len(out) for out in beam_search(model, src, 3, 0.6, limit) +
                   greedy(model, src, limit)]
        assert lengths == [limit - 1] * 2 * len(src), limit


@torch.no_grad()
def _sequence_logprob(model, src_row, tokens):
    tgt_in = torch.tensor([[BOS, *tokens]])
    lprobs = model(src_row[None], tgt_in).log_softmax(-1)[0]
    lprobs[:, 0] = lprobs[:, BOS] = float("-inf")  # decoding never emits pad or bos
    target = [*tokens, EOS]
    return sum(lprobs[i, t].item() for i, t in enumerate(target))


@pytest.mark.parametrize("lenpen", [0.0, 0.6, 2.0])
def test_wide_beam_finds_the_exhaustive_best(lenpen):
    """With a beam wider than the whole search space, beam search is exact: it must return the
    sequence with the best length-normalised score among all sequences up to the limit."""
    vocab, max_len = 6, 4  # tokens 1 (unk), 4, 5 and EOS
    model = _model(vocab, seed=3)
    src = torch.tensor([[4, 5, 4, EOS], [5, 5, 1, EOS]])
    best = beam_search(model, src, beam=64, lenpen=lenpen, max_len=max_len)
    for row, found in zip(src, best):
        scored = []
        for n in range(max_len):
            for tokens in itertools.product([1, 4, 5], repeat=n):
                lp = _sequence_logprob(model, row, list(tokens))
                scored.append((lp / ((5 + n + 1) / 6) ** lenpen, list(tokens)))
        top_score, top = max(scored)
        assert found == top, (found, top, top_score)


def test_min_len_holds_back_eos():
    model, src = _model(), _src()
    for out in greedy(model, src, 12, min_len=6) + beam_search(model, src, 3, 0.6, 12, min_len=6):
        assert len(out) >= 6
    fixed = greedy(model, src, 9, min_len=8)
    assert all(len(o) == 8 for o in fixed)  # min_len = max_len - 1: every output exactly that long


@pytest.mark.parametrize("rows,width,k", [(256, 8000, 8), (64, 8000, 1), (7, 8003, 8),
                                          (3, 30011, 16), (4, 8000, 100)])
def test_top_k_equals_torch_topk(rows, width, k):
    """The blocked top-k (a beam's candidates, greedy's argmax) against torch.topk: the same
    values and columns, with the best entries at a block's edge, in the columns past the last
    full block, and rows with fewer finite entries than k."""
    torch.manual_seed(0)
    x = torch.randn(rows, width)
    x[0, : width - 3] = float("-inf")  # three finite entries only
    x[1, -1] = 50.0  # the best entry is the last column (past the blocks when width % 16)
    x[-1, 16 * (width // 16) - 1] = 40.0  # ... the last column of the last block
    values, cols = top_k(x, k)
    ref_values, ref_cols = x.topk(k, dim=-1)
    assert torch.equal(values, ref_values)
    finite = ref_values.isfinite()
    assert torch.equal(cols[finite], ref_cols[finite])  # which -inf columns fill up is arbitrary
    assert torch.equal(x.gather(1, cols), values)
    assert all(len(set(row)) == k for row in cols.tolist())  # distinct columns
    assert torch.equal(top_k(x[1:], 1)[1][:, 0], x[1:].argmax(dim=-1))


def test_top_k_with_ties_strided_input_and_rows_without_a_finite_entry():
    torch.manual_seed(0)
    x = torch.randint(0, 5, (6, 4000)).float()  # many equal entries
    x[2] = float("-inf")  # nothing finite: any k distinct columns
    for view in (x, x.t().contiguous().t(), torch.cat([x, x], 1)[:, 3:4003]):
        values, cols = top_k(view, 8)
        assert torch.equal(values, view.topk(8, dim=-1).values)
        assert torch.equal(view.gather(1, cols), values)
        assert all(len(set(row)) == 8 for row in cols.tolist())


def test_the_length_limit_comes_before_min_len():
    """min_len ≥ max_len: EOS is let through at the limit (no step is left without a choice)."""
    model, src = _model(), _src()
    for out in greedy(model, src, 5, min_len=9) + beam_search(model, src, 3, 0.6, 5, min_len=9):
        assert len(out) == 4 and 0 not in out and BOS not in out


def test_an_empty_batch_decodes_to_nothing():
    model = _model()
    empty = torch.zeros(0, 7, dtype=torch.long)
    assert greedy(model, empty, 5) == [] and beam_search(model, empty, 3, 0.6, 5) == []


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_bf16_logits_ranked_as_they_come_decode_as_their_fp32_copy_did(kind, monkeypatch):
    """Under bf16 autocast greedy ranks each step's bf16 logits and beam search takes their
    log-softmax in fp32, without an fp32 copy of [rows, vocab] first: bf16 → fp32 is exact, so
    the tokens are those of ranking the fp32 copy (the earlier code, patched back in)."""
    from heads_lab.model import decode

    model, src = _model(vocab=300, seed=3), _src(vocab=300)

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return (greedy(model, src, 12) if kind == "greedy"
                    else beam_search(model, src, 4, 0.6, 12))

    now = run()
    original = decode._Stepper.__call__
    monkeypatch.setattr(decode._Stepper, "__call__", lambda self, p: original(self, p).float())
    assert run() == now
