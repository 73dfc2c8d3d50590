"""Config fields with their help text."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def opt(default: Any, help: str) -> Any:
    """A config field with its help text (fairseq's metadata["help"]; `heads-lab train --help`
    prints it). Mutable defaults go through field(default_factory=..., metadata=...)."""
    return field(default=default, metadata={"help": help})

