"""What each head does: the measurements of Voita et al. 2019 (confidence, positional,
syntactic and rare-word heads, LRP relevance), Michel et al. 2019 (importance) and Clark et al.
2019 (distance between heads, the head map), on teacher-forced attention maps.

Conventions (every measure is over the first `analysis.max_sentences` sentences of the split,
or of `analysis.treebank`):
- Heads are of one kind per number (heads_lab.model.heads.KIND_NAMES): multi-head attention has one
  kind; talking heads have h_K query/key, h softmax and h_V value heads. The maps are the
  softmax heads' weights, so every map measure is per softmax head; importance is measured per
  kind; no number of one kind is ever paired with a head of another.
- Maps are per sentence and site: [layers, heads, query, key], without padding. Source keys end
  with EOS; decoder queries are BOS + the reference tokens (teacher forcing).
- A head "points at" the key of its maximum weight (argmax) for each query. EOS is never a
  key of an argmax measure (Voita: "not a real token"; the other weights are not renormalised)
  and the encoder's EOS query is left out.
- Confidence (Voita): mean over queries of the maximum weight over the keys other than EOS.
- Positional (self-attention; Voita: "a specific relative position (in practice either −1 or
  +1)"): the share of queries whose argmax is at the head's most common relative offset k ≠ 0
  (argmax − query), among the queries for which that offset is inside the sentence (query 0 has
  no offset −1); positional when ≥ analysis.positional_threshold. Offset 0 is the query's own
  token: its share (`self_share`) is reported apart and never makes a head positional.
- Rare-word (source keys: enc-self, dec-enc; Voita): the share of queries whose argmax is a
  source token with the lowest training-data frequency in the sentence (frequency of subword
  ids on the training source side), over the sentences whose rarest token is not among the
  analysis.rare_top_k (500, as the paper) most frequent; rare when > analysis.rare_threshold.
- Syntactic (enc-self), at the word level: each sentence's map is converted to words as Clark
  et al. 2019 do (attention to a split word = the sum over its pieces, from it = the mean over
  its pieces; EOS and the diagonal out; a word is a surface token of the tree, so a multiword
  token is one word); for each relation (metrics.RELATIONS: nsubj, obj, amod, advmod, det,
  case, nmod, obl, conj, mark, aux; UD subtypes count as their base relation) and direction
  (dep→head: the dependent queries; head→dep: the head), Voita's accuracy: the share of arcs
  whose querying word's argmax word is the other word, against the baseline of always pointing
  at the relation's most common word offset (Voita's and Clark's baseline); syntactic for a
  relation with at least analysis.min_arcs arcs when the head beats it by
  analysis.syntactic_margin. Words are matched to subwords by character spans
  (heads_lab.analysis.syntax).
- Importance (Michel): I_h = mean over batches of |∂L/∂ξ_h|, ξ a multiplier at 1 on the heads
  of one kind (MHA: each head's output; talking heads: J's query/key heads, W's softmax heads,
  O's value heads), L the mean NLL per target token of the batch; normalised by the ℓ2 norm of
  its layer and kind.
- Relevance (Voita's LRP, heads_lab.analysis.lrp): seeded with the top-1 logit at each target
  position and propagated back through decoder and encoder; a head's relevance is what reaches
  its output (the output projection's input), its |share| of its layer averaged over target
  tokens; on the first analysis.lrp_sentences sentences.
- Distance (Clark): the Jensen–Shannon divergence between every two heads of a site, across
  its layers, as Clark's code (natural log, each row smoothed to 0.999 p + 0.001 / keys), summed
  over a sentence's queries and divided by their number (heads-lab's change, so sentences of any
  length weigh alike), averaged over sentences. A layer's diversity is the mean distance over
  its own head pairs; the head map places the heads in 2-D by MDS of the distance matrix. Heads
  of different sites attend from or to different tokens, so they have no distance: one matrix
  and one map per site (Clark's BERT has one site).
"""

from heads_lab.analysis.head_map import mds_coordinates, within_layer
from heads_lab.analysis.importance import head_importance, importance_by_kind, least_important
from heads_lab.analysis.maps import Sentence, collect_maps
from heads_lab.analysis.metrics import (
    RELATIONS,
    confidence,
    diversity,
    head_distances,
    positional,
    rare_sentences,
    rare_share,
    syntactic,
    word_map,
)
from heads_lab.analysis.syntax import (
    Tree,
    attach_arcs,
    piece_spans,
    read_conllu,
    word_spans,
    words_to_subwords,
)

__all__ = ["RELATIONS", "Sentence", "Tree", "attach_arcs", "collect_maps", "confidence",
           "diversity", "head_distances", "head_importance", "importance_by_kind", "least_important",
           "mds_coordinates", "piece_spans", "positional", "rare_sentences",
           "rare_share", "read_conllu", "syntactic", "within_layer", "word_map", "word_spans",
           "words_to_subwords"]
