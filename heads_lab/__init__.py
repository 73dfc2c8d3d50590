"""heads-lab: attention head-count ablations — train, sweep, compare, analyse and prune heads.

In a notebook (docs/python.md):

    import heads_lab
    model = heads_lab.open("outputs/runs/<date>/<time>")     # or "hf:gpt2"
    model.maps(["A man rides a bike."])                       # attention maps per site
    with model.masked("enc:0:3"): model.evaluate()            # a head gone
    heads_lab.runs("outputs/multiruns/<date>/<time>")         # a study's runs, a DataFrame

`import heads_lab` loads nothing heavy: the names below are read on first use.
"""

from heads_lab._version import __version__
from heads_lab.errors import CheckpointError, ConfigError, DataError
from heads_lab.errors import HeadsLabError as Error

__all__ = ["Analysis", "CheckpointError", "ConfigError", "DataError", "Error", "Evaluation",
           "Maps", "Model", "__version__", "open", "rows", "runs"]
_LAZY = {"Analysis", "Evaluation", "Maps", "Model", "open", "rows", "runs"}


def __getattr__(name: str):
    if name in _LAZY:
        from heads_lab import api  # lazy: start-up time (torch, pandas)

        return getattr(api, name)
    raise AttributeError(f"module 'heads_lab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
