"""Shared fixtures: a private tokenizer cache, and the real config tree composed and shrunk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# `make test` runs the tests in parallel processes (pytest-xdist): one thread each, and for the
# heads-lab processes they start (two processes of two threads on two cores are slower than one)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Tests never touch the user's cache or a wandb server.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

# A tiny run: small model and corpus, a few steps, no tracker; used by unit and CLI tests.
TINY = [
    "model=tiny",
    "data.train_size=600",
    "data.valid_size=40",
    "data.test_size=40",
    "data.vocab_size=300",
    "data.nouns=60",
    "data.verbs=20",
    "data.adjectives=20",
    "data.adverbs=10",
    "trainer.max_steps=30",
    "trainer.max_tokens=1024",
    "trainer.valid_every=15",
    "trainer.log_every=10",
    "trainer.warmup_steps=2",
    "eval.beam=2",
    "logger=none",
]


@pytest.fixture(scope="session", autouse=True)
def cache_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("heads-lab-cache")
    os.environ["HEADS_LAB_CACHE"] = str(path)
    return path


def compose(overrides: list[str] | None = None):
    """The real conf/train.yaml composed with overrides, as Hydra's CLI would (no run dir)."""
    from heads_lab.config.compose import compose as compose_config

    return compose_config(overrides or [])


@pytest.fixture
def tiny_run():
    """The typed RunConfig of the TINY overrides."""
    from heads_lab.config.compose import to_object

    return to_object(compose(TINY))
