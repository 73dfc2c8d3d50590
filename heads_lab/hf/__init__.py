"""Pretrained Hugging Face models in heads-lab's terms (`hf:<hub name or save_pretrained dir>`):
MarianMT translators (encoder-decoder: enc-self, dec-self and dec-enc attention, Voita et al.'s
setting), BERT / DistilBERT encoders (enc-self only: Clark et al., Michel et al., the forum's
BERT-base vs DistilBERT) and decoder-only language models, GPT-2, GPT-NeoX (Pythia), Llama,
Mistral and Qwen2 (lm-self: causal self-attention; grouped-query attention included). `info`
gives their heads and costs, `analyze` the same measures as for heads-lab's own models
(analysis/measures.py) on the models' own attention, and a language model's head roles,
`prune` Michel et al.'s iterative importance pruning with the task's metric.

- models.py: loading (offline: one line), the families and where their heads are
- tasks.py: the task kinds (translate, mlm, lm): inputs, labels, special tokens, metric
- heads.py: attention maps per sentence, head gates through hooks (masks, importance per head
  or key/value group)
- analysis.py: the sentences analysed (a treebank, a data set's split) and what is not measured
- prune.py: a pruning point's task metric
- subject.py: the adapter (heads_lab/analysis/subject.py's Subject) analyze and prune read, its
  command line, its output dirs; info's table
"""

HF_PREFIX = "hf:"


def is_hf(name: str) -> bool:
    """Whether a command's first argument names a Hugging Face model (`hf:...`)."""
    return name.startswith(HF_PREFIX)
