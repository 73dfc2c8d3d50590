"""docs/python.md runs: its Python blocks, in order, in one namespace, from a dir laid out as the
page assumes (a trained run under outputs/runs, a tiny hf: Llama under outputs/hf_tiny, the
published results/), so the page cannot rot. And `import heads_lab` stays light."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY
from tests.integration.test_cli import heads_lab

ROOT = Path(__file__).resolve().parents[2]


def blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)


def test_import_heads_lab_loads_nothing_heavy_and_names_its_public_api():
    code = ("import sys, heads_lab; "
            "print(sorted(m for m in ('torch', 'pandas', 'transformers', 'matplotlib') "
            "if m in sys.modules)); print(heads_lab.__all__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    heavy, names = out.stdout.splitlines()
    assert heavy == "[]"
    for name in ("open", "runs", "rows", "Error"):
        assert f"'{name}'" in names


@pytest.mark.slow  # a training, analyses, evaluations, a tiny hf model: `make test-slow`
def test_the_python_page_runs(tmp_path, monkeypatch):
    pytest.importorskip("transformers", reason="the hf extra (make test installs it)")
    proc = heads_lab("train", *TINY, "trainer.max_steps=60", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    sys.path.insert(0, str(ROOT / "scripts"))
    from hf_tiny_models import causal, texts

    data = os.environ.get("HEADS_LAB_DATA")
    causal(tmp_path / "outputs" / "hf_tiny", texts(Path(data) if data else None), ("llama",))
    (tmp_path / "results").symlink_to(ROOT / "results")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    found = blocks(ROOT / "docs" / "python.md")
    assert len(found) >= 6
    namespace: dict = {}
    for i, code in enumerate(found):
        try:
            exec(compile(code, f"docs/python.md block {i}", "exec"), namespace)  # noqa: S102
        except Exception as err:  # name the block that broke
            raise AssertionError(f"docs/python.md block {i} failed: {err!r}\n{code}") from err
    assert namespace["table"]["runs"].tolist() == [3, 3, 3, 3, 3]
    assert set(namespace["maps"].sites[0]) == {"enc-self"}


def test_a_mistake_is_the_command_lines_one_line_as_a_heads_lab_error(tmp_path, monkeypatch):
    """The API raises the CLI's one-line messages, word for word, as heads_lab.Error."""
    import heads_lab as api

    monkeypatch.chdir(tmp_path)
    for args, spec, settings in (
            (["analyze", "no-such-run"], "no-such-run", {}),
            (["analyze", "hf:no/such/dir"], "hf:no/such/dir", {}),
            (["analyze", "hf:x", "foo=1"], "hf:x", {"foo": 1})):
        proc = heads_lab(*args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.startswith("error: ")
        with pytest.raises(api.Error) as err:
            api.open(spec, **settings)
        assert proc.stderr.strip() == f"error: {err.value}"
