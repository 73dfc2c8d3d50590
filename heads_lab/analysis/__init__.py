"""What each head does: the measurements of Voita et al. 2019 (confidence, positional,
syntactic and rare-word heads), Michel et al. 2019 (importance) and Clark et al. 2019 (distance
between heads), on teacher-forced attention maps.

Conventions (every measure is over the first `analysis.max_sentences` sentences of the split,
or of `analysis.treebank`):
- Heads are of one kind per number (heads_lab.heads.KIND_NAMES): multi-head attention has one
  kind; talking heads have h_K query/key, h softmax and h_V value heads. The maps are the
  softmax heads' weights, so every map measure is per softmax head; importance is measured per
  kind; no number of one kind is ever paired with a head of another.
- Maps are per sentence and site: [layers, heads, query, key], without padding. Source keys end
  with EOS; decoder queries are BOS + the reference tokens (teacher forcing).
- A head "points at" the key of its maximum weight (argmax) for each query.
- Confidence: mean over queries of the maximum weight; EOS queries (the encoder's last
  position) are left out.
- Positional (self-attention): the share of queries whose argmax is at the head's most common
  relative offset (argmax − query), among the queries for which that offset is inside the
  sentence (query 0 has no offset −1); positional when ≥ analysis.positional_threshold.
- Rare-word (source keys: enc-self, dec-enc): the share of queries whose argmax is a source token
  with the lowest training-data frequency in the sentence (EOS excluded); rare when
  > analysis.rare_threshold.
- Syntactic (enc-self): for each relation (metrics.RELATIONS: nsubj, obj, amod, advmod, det,
  case, nmod, obl, conj, mark, aux; UD subtypes count as their base relation) and direction
  (dep→head: the dependent's first subword queries; head→dep: the head's), the share of arcs
  whose argmax is any subword of the other word, against the baseline accuracy of always
  pointing at the relation's most common word offset; syntactic for a relation with at least
  analysis.min_arcs arcs when the head beats it by analysis.syntactic_margin. Words are matched
  to subwords by character spans (heads_lab.analysis.syntax).
- Importance (Michel): I_h = mean over batches of |∂L/∂ξ_h|, ξ a multiplier at 1 on the heads
  of one kind (MHA: each head's output; talking heads: J's query/key heads, W's softmax heads,
  O's value heads), L the mean NLL per target token of the batch; normalised by the ℓ2 norm of
  its layer and kind.
- Distance (Clark): Jensen–Shannon divergence (base 2, so in [0, 1]) between two heads' weights
  (smoothed by 1e-9 and renormalised) summed over a sentence's queries, averaged over sentences;
  a layer's diversity is the mean distance over its head pairs.
"""

from heads_lab.analysis.importance import head_importance, head_importance_flat, importance_by_kind
from heads_lab.analysis.maps import Sentence, collect_maps
from heads_lab.analysis.metrics import (
    RELATIONS,
    confidence,
    diversity,
    js_distances,
    positional,
    rare_share,
    syntactic,
)
from heads_lab.analysis.record import analyze
from heads_lab.analysis.syntax import (
    Tree,
    attach_arcs,
    piece_spans,
    read_conllu,
    word_spans,
    words_to_subwords,
)

__all__ = ["RELATIONS", "Sentence", "Tree", "analyze", "attach_arcs", "collect_maps", "confidence",
           "diversity", "head_importance", "head_importance_flat", "importance_by_kind",
           "js_distances", "piece_spans", "positional", "rare_share", "read_conllu", "syntactic",
           "word_spans", "words_to_subwords"]
