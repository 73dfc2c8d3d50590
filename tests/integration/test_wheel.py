"""`pip install .` (non-editable): the config tree ships inside the wheel and the CLI composes
it from any working directory."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", str(REPO), "-w", str(out)], check=True, capture_output=True)
    (whl,) = out.glob("heads_lab-*.whl")
    return whl


def test_wheel_holds_the_config_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for conf in sorted((REPO / "conf").rglob("*.yaml")):
        assert f"heads_lab/conf/{conf.relative_to(REPO / 'conf')}" in names, conf
    assert "heads_lab/commands/cli.py" in names
    assert any(n.endswith("entry_points.txt") for n in names)


def test_installed_wheel_composes_its_own_config_from_anywhere(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target",
                    str(target), str(wheel)], check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import heads_lab, heads_lab.config.compose as c; print(heads_lab.__file__); "
            "print(c.config_dir()); from heads_lab.commands.cli import main; "
            "raise SystemExit(main(['train', '--cfg', 'job', 'model.heads=2']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(target)})
    assert proc.returncode == 0, proc.stderr
    module_file, conf_dir, *config = proc.stdout.splitlines()
    assert module_file.startswith(str(target)) and conf_dir == str(target / "heads_lab" / "conf")
    assert "heads: 2" in "\n".join(config)
