"""How a model learns and is measured while it does: the loop (loop.py), its optimiser and
schedule (optim.py), checkpoints, stops and data parallelism, the device and precision, and
evaluation (perplexity, BLEU)."""
