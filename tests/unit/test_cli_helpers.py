"""Run dir naming and one-line error messages."""

from __future__ import annotations

from heads_lab.cli import _dir_suffix


def test_dir_suffix():
    assert _dir_suffix("") == ""
    assert _dir_suffix("model.heads=8,seed=2") == "_model.heads=8,seed=2"
    assert _dir_suffix("data.root=/a/b c") == "_data.root=-a-b-c"
    long_a, long_b = "x=" + "1" * 300, "x=" + "1" * 299 + "2"
    assert len(_dir_suffix(long_a)) <= 151 and _dir_suffix(long_a) != _dir_suffix(long_b)
