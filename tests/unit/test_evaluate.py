"""BLEU/chrF are sacrebleu's own; perplexity equals an independent padded computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sacrebleu
import torch
import torch.nn.functional as F

from heads_lab.config.schemas import ModelConfig
from heads_lab.data.batching import Split, collate
from heads_lab.model import Transformer
from heads_lab.training.evaluate import perplexity, score

HYPS = ["The cat sat on the mat.", "A dog barked at the moon!", "Nothing here"]
REFS = ["The cat sat on the mat.", "The dog barked at the moon.", "Something else entirely"]


def test_scores_equal_sacrebleu_with_signatures():
    scores = score(HYPS, REFS)
    assert scores["bleu"] == sacrebleu.corpus_bleu(HYPS, [REFS]).score
    assert scores["chrf"] == sacrebleu.corpus_chrf(HYPS, [REFS]).score
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "chrF2" in scores["chrf_signature"] or "nc:6" in scores["chrf_signature"]
    intl = score(HYPS, REFS, tokenize="intl")
    assert "tok:intl" in intl["bleu_signature"]


def test_every_reference_scores_as_sacrebleus_reference_streams():
    """The multi-reference score: sacrebleu with one stream per reference rank, a segment with
    fewer references padded with None; a hypothesis that is another translation of its source
    scores higher than against its own reference alone."""
    hyps = ["Tom is listening.", "Wake up Tom.", "It is raining today."]
    refs = [["Tom listens.", "Tom's listening.", "Tom is listening."], ["Wake Tom up."],
            ["It rains today.", "It's raining today."]]
    got = score(hyps, [r[0] for r in refs], all_refs=refs)
    streams = [["Tom listens.", "Wake Tom up.", "It rains today."],
               ["Tom's listening.", None, "It's raining today."],
               ["Tom is listening.", None, None]]
    assert got["bleu_multiref"] == sacrebleu.corpus_bleu(hyps, streams).score
    assert got["chrf_multiref"] == sacrebleu.corpus_chrf(hyps, streams).score
    assert got["bleu"] == sacrebleu.corpus_bleu(hyps, [[r[0] for r in refs]]).score
    assert got["bleu_multiref"] > got["bleu"] and got["chrf_multiref"] > got["chrf"]
    assert "nrefs:var" in got["bleu_multiref_signature"]
    assert got["multiref"] == {"segments": 3, "with_several": 2, "references": 6}
    assert "bleu_multiref" not in score(hyps, [r[0] for r in refs])


def test_perfect_hypotheses_score_100():
    assert score(REFS, REFS)["bleu"] == pytest.approx(100.0)


def test_perplexity_equals_padded_cross_entropy():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=32, heads=4, d_ff=64, encoder_layers=1,
                                    decoder_layers=1), 50).eval()
    rng = np.random.default_rng(0)
    src = [rng.integers(4, 50, rng.integers(1, 12)).astype(np.int32) for _ in range(37)]
    tgt = [rng.integers(4, 50, rng.integers(1, 12)).astype(np.int32) for _ in range(37)]
    split = Split([""] * 37, [""] * 37, src, tgt)
    result = perplexity(model, split, max_tokens=64, device=torch.device("cpu"))
    batch = collate(split, np.arange(37))  # one padded batch, the other way round
    with torch.no_grad():
        logits = model(batch.src, batch.tgt_in)
    nll = F.cross_entropy(logits.reshape(-1, 50), batch.tgt_out.reshape(-1), ignore_index=0,
                          reduction="sum").item()
    tokens = sum(len(t) + 1 for t in tgt)
    assert result["tokens"] == tokens
    assert math.isclose(result["loss"], nll / tokens, rel_tol=1e-5)
    assert math.isclose(result["ppl"], math.exp(nll / tokens), rel_tol=1e-5)


def test_translate_returns_hypotheses_in_the_split_order(monkeypatch):
    """Decoding runs in length-sorted batches; the output must come back in the split's order.
    With a decoder that copies its source, the translations are the sources themselves."""
    from heads_lab.config.schemas import EvalConfig
    from heads_lab.training.evaluate import translate

    def copy_source(model, src, *args):
        return [[int(t) for t in row if t > 3] for row in src]

    class Detok:
        def decode(self, ids):
            return [" ".join(map(str, row)) for row in ids]

    monkeypatch.setattr("heads_lab.training.evaluate.decode_batch", copy_source)
    rng = np.random.default_rng(0)
    src = [rng.integers(4, 50, rng.integers(1, 15)).astype(np.int32) for _ in range(53)]
    split = Split([""] * 53, [""] * 53, src, src)
    model = Transformer(ModelConfig(d_model=16, heads=2), 50)
    hyps = translate(model, split, Detok(), EvalConfig(max_sentences=8), torch.device("cpu"))
    assert hyps == [" ".join(map(str, s)) for s in src]
