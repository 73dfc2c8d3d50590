"""The config, torch-free: the typed schemas, the fixed choices, the attention variants and
sites, composing and validating conf/ (compose.py), and what a config costs (cost.py)."""
