"""heads-lab: attention head-count ablations for Transformer translators."""

__version__ = "0.1.0"
