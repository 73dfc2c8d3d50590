"""Pretrained Hugging Face models in heads-lab's terms (`hf:<hub name or save_pretrained dir>`):
MarianMT translators (encoder-decoder: enc-self, dec-self and dec-enc attention, Voita et al.'s
setting) and BERT / DistilBERT encoders (enc-self only: Clark et al., Michel et al., the forum's
BERT-base vs DistilBERT). `info` gives their heads and costs, `analyze` the same measures as for
heads-lab's own models (analysis/measures.py) on the models' own attention, `prune` Michel et
al.'s iterative importance pruning with the model's task metric.

- models.py: loading (offline: one line), the families and where their heads are
- heads.py: attention maps per sentence, head gates through hooks (masks, importance)
- analysis.py: the sentences analysed (a treebank, a data set's split) and what is not measured
- prune.py: a pruning point's task metric (BLEU and chrF, or masked-LM accuracy)
- subject.py: the adapter (heads_lab/analysis/subject.py's Subject) analyze and prune read, its
  command line, its output dirs; info's table
"""

HF_PREFIX = "hf:"


def is_hf(name: str) -> bool:
    """Whether a command's first argument names a Hugging Face model (`hf:...`)."""
    return name.startswith(HF_PREFIX)
