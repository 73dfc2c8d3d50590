"""Files heads-lab writes: atomically, with the permissions of any file the user creates."""

from __future__ import annotations

import json
import os
import stat

import pytest


@pytest.mark.parametrize("umask,expected", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_written_files_follow_the_umask_like_any_other_file(tmp_path, umask, expected):
    """results.json, hyps, reports: readable by colleagues where the umask lets any file be."""
    from heads_lab.output.files import write_atomic, write_json

    old = os.umask(umask)
    try:
        text, js = write_atomic(tmp_path / "a.txt", "x\n"), write_json(tmp_path / "r.json", {"a": 1})
        (tmp_path / "plain.txt").write_text("x")  # what open() gives under the same umask
    finally:
        os.umask(old)
    for path in (text, js, tmp_path / "plain.txt"):
        assert stat.S_IMODE(path.stat().st_mode) == expected, path
    assert json.loads(js.read_text()) == {"a": 1}
