"""heads-lab's Python API, for notebooks: `heads_lab.open`, `heads_lab.runs`, `heads_lab.rows`
(docs/python.md). The package's own `__init__` loads these on first use, so `import heads_lab`
stays fast (no torch, no transformers, no pandas until a model or a table is asked for)."""

from heads_lab.api.model import Analysis, Evaluation, Maps, Model, open  # noqa: A004
from heads_lab.api.tables import rows, runs

__all__ = ["Analysis", "Evaluation", "Maps", "Model", "open", "rows", "runs"]
