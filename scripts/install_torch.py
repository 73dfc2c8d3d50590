"""Install PyTorch into the current environment before anything else, and never a CUDA build on
a machine without a GPU (`make install` runs this; stdlib only).

  TORCH_SPEC   what to install (default: torch==2.13.0)
  TORCH_INDEX  a package index to take it from, e.g. https://download.pytorch.org/whl/cpu
               (CPU wheels) or https://download.pytorch.org/whl/cu128 (CUDA wheels)
  TORCH_ALLOW_CUDA=1  install a CUDA build even where no GPU is visible

Without a GPU (no nvidia-smi), pip's choice is checked first with a dry run: if it would pull
NVIDIA packages, nothing is installed and the message says how to get the CPU build.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile


def main() -> int:
    if importlib.util.find_spec("torch") is not None:
        return 0  # keep whatever build the user already has
    spec = os.environ.get("TORCH_SPEC") or "torch==2.13.0"
    index = os.environ.get("TORCH_INDEX")
    pip = [sys.executable, "-m", "pip", "install", spec]
    if index:
        pip += ["--index-url", index]
    has_gpu = shutil.which("nvidia-smi") is not None or os.environ.get("TORCH_ALLOW_CUDA") == "1"
    if not has_gpu:
        with tempfile.TemporaryDirectory() as tmp:
            report = os.path.join(tmp, "report.json")
            subprocess.run([*pip, "--dry-run", "--quiet", "--report", report], check=True)
            with open(report) as f:
                names = [item["metadata"]["name"] for item in json.load(f)["install"]]
        cuda = sorted(n for n in names if n.startswith(("nvidia-", "cuda-")) or n == "triton")
        if cuda:
            print(
                f"error: `pip install {spec}` would pull CUDA packages ({', '.join(cuda[:3])}, ...) "
                "but this machine has no GPU; install the CPU build with "
                "`make install TORCH_INDEX=https://download.pytorch.org/whl/cpu` "
                "(or TORCH_ALLOW_CUDA=1 to install it anyway)",
                file=sys.stderr,
            )
            return 2
    print(f"installing {spec}" + (f" from {index}" if index else ""), flush=True)
    return subprocess.run(pip).returncode


if __name__ == "__main__":
    sys.exit(main())
