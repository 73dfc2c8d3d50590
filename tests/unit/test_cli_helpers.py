"""Run dir naming and one-line error messages."""

from __future__ import annotations

from heads_lab.config import expand_sweeps
from heads_lab.config import run_dir_suffix as _dir_suffix


def test_dir_suffix():
    assert _dir_suffix("") == ""
    assert _dir_suffix("model.heads=8,seed=2") == "_model.heads=8,seed=2"
    assert _dir_suffix("data.root=/a/b c") == "_data.root=-a-b-c"
    long_a, long_b = "x=" + "1" * 300, "x=" + "1" * 299 + "2"
    assert len(_dir_suffix(long_a)) <= 151 and _dir_suffix(long_a) != _dir_suffix(long_b)


def test_expand_sweeps():
    assert expand_sweeps(["a=1,2", "b=x", "c=3,4"]) == [
        ["a=1", "b=x", "c=3"], ["a=1", "b=x", "c=4"], ["a=2", "b=x", "c=3"], ["a=2", "b=x", "c=4"]]
    assert expand_sweeps([]) == [[]]
    assert expand_sweeps(["+experiment=x", "m.l=[1,2]"]) == [["+experiment=x", "m.l=[1,2]"]]
