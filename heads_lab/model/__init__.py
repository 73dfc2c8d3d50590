"""The Transformer translator and its attention."""

from heads_lab.model.attention import Attention, MultiHeadAttention, TalkingHeadsAttention
from heads_lab.model.kernels import reorder_cache
from heads_lab.model.lm import LanguageModel
from heads_lab.model.loss import label_smoothed_loss, output_loss
from heads_lab.model.transformer import (
    Encoded,
    Transformer,
    admin_init,
    count_parameters,
    evaluating,
)

__all__ = [
    "Attention",
    "Encoded",
    "LanguageModel",
    "MultiHeadAttention",
    "TalkingHeadsAttention",
    "Transformer",
    "admin_init",
    "count_parameters",
    "evaluating",
    "label_smoothed_loss",
    "output_loss",
    "reorder_cache",
]
