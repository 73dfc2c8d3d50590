#!/usr/bin/env python3
"""heads-lab's GPU check: one call that checks every CUDA path, measures GPU speed and runs a
whole study (Vaswani et al. Table 3 (A), 15 runs), in ≤ 10 minutes, on a machine that has
PyTorch and a GPU but maybe no network and none of heads-lab's other dependencies.

Two steps, from the repository root:

  python scripts/gpu_check.py prepare        # on a machine with pip and ../shared/data (or
                                             # $HEADS_LAB_DATA): wheels into .whl/, Multi30k
                                             # and Tatoeba into .gpu_data/ (~8 MB), git-ignored
  python scripts/gpu_check.py run --out DIR  # on the GPU machine (carry .whl and .gpu_data)

`run` installs the wheels into a private folder (--site; never torch, never the machine's own
packages: pip --no-deps --target) only where heads-lab's dependencies are missing, then runs its
parts in order, each with its share of the time left, and cuts (saying so) a part that would
overrun: the CUDA tests (`pytest -m cuda tests/cuda`), `heads-lab bench` at d_model 512, 6+6
layers in bf16 against torch.nn.Transformer (with trainer.compile and trainer.capture rows), the
same training at a paper-sized batch (25,600 target tokens a step), a profile of one training
step, and the table_a preset (h = 1, 4, 8, 16, 32 × seeds 1-3) as
several jobs at once on the one GPU, with its report.
Everything lands in --out: summary.md (the parts, their times and outcomes), gpu_check.json,
cuda_tests.xml, bench.json, bench_large.json, profile.json, table_a/ (runs, report.md/.csv/.png), logs/.

`--parts studies --study 'PRESET [OVERRIDE ...]'` (repeatable) runs other presets' whole sweeps
the same way, one after another while time is left, each into <out>/<preset>/ with its report.

The lease plan, for a GPU lent for 15 minutes in all (no call over 10), in priority order, each
call's results packed so that what comes back is ≤ 8 files (--pack: summary.md, gpu_check.json
and one pack.tar.gz holding the rest):

  1. run --out $OUT/base --parts base_size --budget 540 --pack
     the base-size question: +experiment=table_a_tatoeba_base (d_model 512, 6+6 layers, peak lr
     7e-4 over 1,000 warm-up steps, 8,192 tokens a step), h = 1 and h = 8 × seeds 1 and 2, four
     runs at once, captured (trainer.capture=true trainer.pad_multiple=8), up to 6,000 steps
     with trainer.max_time as the horizon: what the call leaves after its evaluation, so every
     run still validates and is tested (BLEU, chrF, multi-reference); results.json says where
     it stopped (train.stopped_by, steps), its tokens/s and whether it was captured.
  2. run --out $OUT/speed --parts speed --budget 480 --pack
     the speed table: every variant captured (mha h = 1, 8, 32, kv_heads = 1, talking heads
     h = 8, 32) beside torch.nn.Transformer and Marian compiled, at 8,192 tokens a step.
  3. only if time is left: --parts studies --study 'table_a_tatoeba_base model.heads=32 seed=1
     trainer.capture=true trainer.pad_multiple=8' (then seed 3 of h = 1, 8; then the learning
     rate per h, trainer.lr=3.5e-4,1.4e-3 on seed 1).

`run --cpu` is the dry run that keeps this script from rotting between GPU windows (`make
test-slow` runs it): the same parts on CPU, the CUDA tests skipping with their reason, a tiny bench and a
tiny two-run study on the embedded synthetic corpus. A user with a GPU runs the same two steps
(or just `run` when heads-lab is installed): README, "On a GPU".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".whl"
DATA = ROOT / ".gpu_data"
# what a PyTorch image may lack; pure-Python wheels (antlr4's 4.9.3 is an sdist on PyPI: built here)
NEEDED = ["hydra-core==1.3.8", "omegaconf==2.3.1", "antlr4-python3-runtime==4.9.3",
          "hydra-joblib-launcher==1.2.0"]
# the modules heads-lab imports at start-up and in the parts below, with the wheel that brings each
# when the image lacks it (the CUDA image has the rest: numpy, rich, sacrebleu, sentencepiece,
# matplotlib, scikit-learn and its scipy (the report's t-test), joblib, pytest, pyyaml)
MODULES = {"hydra": "hydra-core", "omegaconf": "omegaconf", "antlr4": "antlr4-python3-runtime",
           "hydra_plugins.hydra_joblib_launcher": "hydra-joblib-launcher", "numpy": None,
           "rich": None, "sacrebleu": None, "sentencepiece": None, "matplotlib": None,
           "sklearn": None, "scipy": None, "joblib": None, "pytest": None, "yaml": None}
MULTI30K = ("train.", "val.", "test_2016_flickr.")  # de and en: the study's pair

# Each part: (name, share of the budget it may take at most unless it is the last, the seconds
# it needs to start at all, the seconds it takes whole: a small budget's share never cuts a part
# below that while the later parts can still start).
# Measured on an H200 (2026-11-26): tests 49 s, bench ~180 s (decoding and the compile row are
# most of it), table_a 168 s for its 15 runs at once; on an H100 the tests took 48–54 s (a 230 s
# budget's 20 % share, 46 s, cut them). Not yet measured: the captured-step CUDA tests (they
# compile: tests' whole raised to 100 s) and bench_large (25,600 tokens a step, no decoding).
# bench_peers (not a default part; not yet measured: its whole is a guess, 12 compiled rows at
# two batch sizes) is every variant captured beside the peers, at 8k and 25.6k tokens a step;
# profile_captured (not a default part; its whole a guess too) the captured step's profile.
GPU_PARTS = (("base_size", 1.0, 240, 0), ("speed", 1.0, 120, 0),
             ("tests", 0.2, 30, 100), ("bench", 0.4, 60, 180), ("bench_large", 0.2, 40, 90),
             ("bench_peers", 0.6, 60, 400), ("profile", 0.1, 20, 40),
             ("profile_captured", 0.3, 40, 120),
             ("table_a", 0.6, 120, 170), ("studies", 1.0, 120, 0))


def allowance(parts: list | tuple, i: int, left: float, budget: float) -> float:
    """Seconds part i may take: what is left once the later parts can start; unless it is the
    last, at most its share of the budget, or the time it takes whole if that is more."""
    allowed = left - sum(p[2] for p in parts[i + 1:])
    if i < len(parts) - 1:
        _, share, _, whole = parts[i]
        allowed = min(allowed, max(share * budget, whole))
    return allowed


# the dry run's study: tiny, on the synthetic pair, two jobs at once as on the GPU
DRY_STUDY = ["data=synthetic", "model=tiny", "trainer.max_steps=20", "trainer.valid_every=10",
             "trainer.warmup_steps=5", "data.train_size=400", "data.valid_size=30",
             "data.test_size=30", "data.vocab_size=200", "eval.beam=2", "trainer.precision=fp32",
             "trainer.device=cpu", "hydra.launcher.n_jobs=2"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="wheels into .whl/ and Multi30k into .gpu_data/ (needs pip)")
    prep.add_argument("--data", default=os.environ.get("HEADS_LAB_DATA", str(ROOT.parent / "shared/data")),
                      help="where multi30k/ is (default: $HEADS_LAB_DATA or ../shared/data)")
    run = sub.add_parser("run", help="the check itself, writing everything into --out")
    run.add_argument("--out", required=True, help="output folder (created; must be empty or new)")
    run.add_argument("--cpu", action="store_true", help="dry run on CPU: tiny bench and study")
    run.add_argument("--budget", type=float, default=540.0,
                     help="seconds for the whole run (default 540: 9 min, inside a 10-min window)")
    run.add_argument("--site", default="/tmp/heads-lab-site", help="where missing wheels go")
    run.add_argument("--jobs", type=int, default=8, help="jobs at once on the GPU (table_a, studies)")
    run.add_argument("--parts", default="tests,bench,bench_large,profile,table_a",
                     help="which parts, in order: tests, bench, bench_large, bench_peers (not "
                          "by default), profile, profile_captured (not by default), table_a, "
                          "studies")
    run.add_argument("--pack", action="store_true",
                     help="pack everything but summary.md and gpu_check.json into pack.tar.gz "
                          "at the end (a lent machine returns few files)")
    run.add_argument("--study", action="append", default=[], metavar="'PRESET [OVERRIDE ...]'",
                     help="for the studies part (repeat it): a preset's whole sweep on the GPU, "
                          "with its overrides, e.g. 'kv_heads seed=1,2,3'; into <out>/<preset>/ "
                          "with its report, one study after another while time is left")
    opts = parser.parse_args(argv)
    if opts.command == "prepare":
        return prepare(Path(opts.data))
    if "studies" in opts.parts.split(",") and not all(s.split() for s in opts.study or [""]):
        parser.error("--parts studies needs at least one --study 'PRESET [OVERRIDE ...]', "
                     "e.g. --study 'kv_heads seed=1,2,3'")
    return Check(opts).run()


# --------------------------------------------------------------------------- prepare (with pip)

def prepare(data: Path) -> int:
    """Download the wheels an image without network lacks, and copy Multi30k beside the repo."""
    WHEELS.mkdir(exist_ok=True)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(WHEELS)]
    for spec in NEEDED:
        name = spec.split("==")[0].replace("-", "_")
        if not any(WHEELS.glob(f"{name}-*.whl")):
            print(f"wheel: {spec}", flush=True)
            subprocess.run([*pip, spec], check=True)
    if any(w.name.startswith("torch-") for w in WHEELS.iterdir()):
        sys.exit("gpu_check: .whl/ holds a torch wheel; remove it: the GPU machine's torch stays")
    src = data / "multi30k"
    if not src.is_dir():
        sys.exit(f"gpu_check: no Multi30k at {src}; pass --data DIR (the folder holding multi30k/)")
    dst = DATA / "multi30k"
    dst.mkdir(parents=True, exist_ok=True)
    copied = 0
    for f in sorted(src.iterdir()):
        if f.is_file() and f.name.startswith(MULTI30K) and f.name.split(".")[1] in ("de", "en"):
            (dst / f.name).unlink(missing_ok=True)
            shutil.copyfile(f, dst / f.name)
            copied += f.stat().st_size
    tatoeba = data / "tatoeba" / "deu-eng.zip"  # for the *_tatoeba presets' studies
    if tatoeba.is_file():
        (DATA / "tatoeba").mkdir(exist_ok=True)
        (DATA / "tatoeba" / tatoeba.name).unlink(missing_ok=True)
        shutil.copyfile(tatoeba, DATA / "tatoeba" / tatoeba.name)
    print(f"prepared: {len(list(WHEELS.glob('*.whl')))} wheels in {WHEELS}, "
          f"{copied / 2**20:.1f} MB of Multi30k in {dst}"
          + (f", Tatoeba's {tatoeba.stat().st_size / 2**20:.1f} MB zip in {DATA / 'tatoeba'}"
             if tatoeba.is_file() else f" (no Tatoeba at {tatoeba}: the *_tatoeba presets "
                                        "cannot run there)"))
    print("on the GPU machine (carry .whl and .gpu_data): python scripts/gpu_check.py run --out DIR")
    return 0


# --------------------------------------------------------------------------- run (on the GPU)

class Check:
    def __init__(self, opts):
        self.opts, self.started = opts, time.monotonic()
        self.out = Path(opts.out).resolve()
        if self.out.exists() and any(self.out.iterdir()):
            sys.exit(f"gpu_check: {self.out} is not empty; give a new or empty --out folder")
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="offline",
                        HEADS_LAB_CACHE=str(self.out / "cache"))
        self.env.pop("HEADS_LAB_CUDA_TESTS_ON", None)  # the CUDA tests run on CUDA or skip
        self.parts: list[dict] = []
        self.facts: dict = {}

    def left(self) -> float:
        return self.opts.budget - (time.monotonic() - self.started)

    def run(self) -> int:
        self.say(f"gpu_check: {'CPU dry run' if self.opts.cpu else 'GPU'}, budget "
                 f"{self.opts.budget:.0f} s, output {self.out}")
        self.part("install", self.install, 60)
        if self.parts[-1]["status"] != "ok":
            return self.finish()
        self.part("environment", self.environment, 60)
        wanted = self.opts.parts.split(",")
        parts = [p for p in GPU_PARTS if p[0] in wanted]
        for i, (name, _, need, _) in enumerate(parts):
            allowed = allowance(parts, i, self.left(), self.opts.budget)
            if self.opts.cpu:  # the dry run never cuts: a CI machine may be slow
                allowed = max(allowed, 600.0)
            if allowed < need and not self.opts.cpu:
                self.parts.append({"part": name, "status": "cut", "seconds": 0.0,
                                   "detail": f"{self.left():.0f} s left, it needs {need} s"})
                self.say(f"[{name}] cut: {self.left():.0f} s left, it needs {need} s")
                continue
            self.part(name, getattr(self, name.replace("-", "_")), allowed)
        return self.finish()

    # ---- plumbing

    def say(self, text: str) -> None:
        print(text, flush=True)
        with open(self.out / "logs" / "gpu_check.log", "a", encoding="utf-8") as f:
            f.write(text + "\n")

    def part(self, name: str, fn, allowed: float) -> None:
        self.say(f"[{name}] start ({allowed:.0f} s allowed, {self.left():.0f} s left)")
        t0 = time.monotonic()
        try:
            status, detail = fn(allowed)
        except subprocess.TimeoutExpired:
            status, detail = "cut", f"stopped at its {allowed:.0f} s share (it would overrun)"
        except Exception as err:  # a broken part is recorded; the next parts still run
            status, detail = "failed", f"{type(err).__name__}: {err}"
        seconds = time.monotonic() - t0
        self.parts.append({"part": name, "status": status, "seconds": round(seconds, 1),
                           "detail": detail})
        self.say(f"[{name}] {status} in {seconds:.0f} s: {detail}")

    def sh(self, name: str, cmd: list[str], timeout: float,
           data: bool = True) -> subprocess.CompletedProcess:
        """A command with its output in logs/<name>.log (and the last lines echoed); `data=False`:
        without HEADS_LAB_DATA (the benches: no Multi30k, whose padding figure is the CPU
        table's, and the GPU's time is better spent on the speeds)."""
        env = self.env if data else {k: v for k, v in self.env.items() if k != "HEADS_LAB_DATA"}
        log = self.out / "logs" / f"{name}.log"
        with open(log, "w", encoding="utf-8") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                proc.wait(timeout=max(1.0, timeout))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                raise
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-6:]
        for line in tail:
            self.say(f"    {line[:200]}")
        return subprocess.CompletedProcess(cmd, proc.returncode)

    def heads_lab(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "heads_lab", *args]

    def sweep_command(self, sweep: Path, preset: str, extra: list[str]) -> list[str]:
        """`heads-lab train -m` of a preset's sweep into `sweep`: on the GPU (--jobs at once) or,
        in the dry run, tiny on CPU; the study's own overrides (`extra`) win over these. No
        checkpoints: none comes back from the GPU machine, nor resumes there (each call starts a
        bare one), and writing them costs GPU time (a d_model-512 run's full state is ~0.6 GB a
        new best); eval.checkpoint=best keeps the best weights in memory instead. The eager step
        (trainer.capture=false), whose time the parts' allowances were measured with: a study
        captured as a GPU run is by default is `--study 'PRESET trainer.capture=true
        trainer.pad_multiple=8'`."""
        ours = [*(DRY_STUDY if self.opts.cpu else ["trainer.device=cuda",
                                                    f"hydra.launcher.n_jobs={self.opts.jobs}",
                                                    "trainer.capture=false"]),
                "trainer.save_checkpoint=false"]
        keys = {a.split("=")[0] for a in extra}
        return self.heads_lab("train", "-m", "hydra/launcher=local", "trainer.threads=1",
                              "logger=none", f"hydra.sweep.dir={sweep}", f"+experiment={preset}",
                              *[a for a in ours if a.split("=")[0] not in keys], *extra)

    # ---- parts

    def install(self, allowed: float):
        """Install the wheels the image lacks into --site (never torch); heads-lab itself runs
        from this checkout (PYTHONPATH), so it is always the code that travelled."""
        import importlib.util

        missing = [m for m in MODULES if importlib.util.find_spec(m.split(".")[0]) is None
                   or (m.startswith("hydra_plugins") and not _has_plugin(m))]
        paths = [str(ROOT)]
        if missing:
            wheels = sorted(WHEELS.glob("*.whl"))
            if not wheels:
                return "failed", (f"missing {', '.join(missing)} and no wheels in {WHEELS}: run "
                                  "`python scripts/gpu_check.py prepare` where pip works, carry .whl")
            if any(w.name.startswith("torch-") for w in wheels):
                return "failed", f"{WHEELS} holds a torch wheel: the machine's torch must stay"
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                            "--no-compile", "--no-cache-dir", "--upgrade", "--target",
                            self.opts.site, *map(str, wheels)], check=True, timeout=allowed)
            paths.append(self.opts.site)
        self.env["PYTHONPATH"] = os.pathsep.join(paths + [self.env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep)
        if self.opts.cpu:  # the dry run's study is synthetic; no Multi30k tokenizer to train
            self.env.pop("HEADS_LAB_DATA", None)
        elif DATA.is_dir() and "HEADS_LAB_DATA" not in os.environ:
            self.env["HEADS_LAB_DATA"] = str(DATA)
        check = subprocess.run([sys.executable, "-c", "import heads_lab.commands.cli, hydra, torch; "
                                "print(torch.__version__, heads_lab.__file__)"],
                               env=self.env, capture_output=True, text=True, timeout=allowed)
        if check.returncode:
            return "failed", "import: " + (check.stderr.strip().splitlines() or ["?"])[-1]
        return "ok", (f"installed {len(missing)} missing module(s) from wheels: {', '.join(missing)}"
                      if missing else "every dependency already there") + f"; torch {check.stdout.split()[0]}"

    def environment(self, allowed: float):
        code = ("import json, platform, torch; d = torch.cuda.is_available(); print(json.dumps({"
                "'python': platform.python_version(), 'torch': torch.__version__, "
                "'cuda': torch.version.cuda, 'gpu': torch.cuda.get_device_name(0) if d else None, "
                "'bf16': torch.cuda.is_bf16_supported() if d else None, "
                "'cpus': __import__('os').cpu_count()}))")
        proc = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True,
                              text=True, timeout=allowed)
        self.facts = json.loads(proc.stdout)
        if not self.opts.cpu and not self.facts["gpu"]:
            raise RuntimeError("no CUDA device visible to torch: use --cpu for the dry run")
        smi = shutil.which("nvidia-smi")
        if smi:
            (self.out / "logs" / "nvidia-smi.txt").write_text(
                subprocess.run([smi], capture_output=True, text=True).stdout)
        return "ok", ", ".join(f"{k} {v}" for k, v in self.facts.items())

    def tests(self, allowed: float):
        xml = self.out / "cuda_tests.xml"
        proc = self.sh("cuda_tests", [sys.executable, "-m", "pytest", "-q", "-ra", "-m", "cuda",
                                      "-p", "no:cacheprovider", f"--junitxml={xml}",
                                      str(ROOT / "tests" / "cuda")], allowed)
        counts = _junit_counts(xml)
        status = "ok" if proc.returncode == 0 else "failed"
        return status, ", ".join(f"{v} {k}" for k, v in counts.items()) or f"exit {proc.returncode}"

    def bench(self, allowed: float):
        if self.opts.cpu:
            args = ["--quick", "--steps", "1", "--warmup", "0", "--batch", "4", "--length", "6",
                    "--device", "cpu", "--precision", "fp32", "model.d_model=32", "model.d_ff=64",
                    "model.encoder_layers=1", "model.decoder_layers=1"]
        else:  # the dims; a GPU-sized batch (256 pairs × 32 tokens = 8192 target tokens)
            args = ["--quick", "--steps", "10", "--warmup", "3", "--batch", "256", "--length", "32",
                    "--device", "cuda", "--precision", "bf16", "--compile", "model.d_model=512",
                    "model.d_ff=2048", "model.encoder_layers=6", "model.decoder_layers=6"]
        json_path = self.out / "bench.json"
        proc = self.sh("bench", self.heads_lab("bench", *args, "--json", str(json_path)), allowed,
                       data=False)
        if proc.returncode or not json_path.is_file():
            return "failed", f"exit {proc.returncode} (logs/bench.log)"
        result = json.loads(json_path.read_text())
        met = [f"{name}: {value} ({'met' if ok else 'NOT met' if ok is False else '-'})"
               for name, value, ok in result["targets"][:3]]
        return "ok", "; ".join(met)

    def bench_large(self, allowed: float):
        """Training speed at a paper-sized batch (Vaswani et al.: ~25k target tokens a step;
        here 800 pairs × 32 = 25,600), eager, compiled and captured, no decoding:
        bench_large.json."""
        if self.opts.cpu:
            args = ["--batch", "8", "--length", "6", "--device", "cpu", "--precision", "fp32",
                    "--steps", "1", "--warmup", "0", "model.d_model=32", "model.d_ff=64",
                    "model.encoder_layers=1", "model.decoder_layers=1"]
        else:
            args = ["--batch", "800", "--length", "32", "--device", "cuda", "--precision",
                    "bf16", "--steps", "10", "--warmup", "3", "--compile", "model.d_model=512",
                    "model.d_ff=2048", "model.encoder_layers=6", "model.decoder_layers=6"]
        json_path = self.out / "bench_large.json"
        proc = self.sh("bench_large", self.heads_lab(
            "bench", "--quick", "--no-decode", *args, "--json", str(json_path)), allowed,
            data=False)
        if proc.returncode or not json_path.is_file():
            return "failed", f"exit {proc.returncode} (logs/bench_large.log)"
        result = json.loads(json_path.read_text())
        tokens = result["workload"]["batch"] * result["workload"]["length"]
        rows = "; ".join(f"{r['name']} {r['tokens_per_s']:,.0f} tok/s (MFU {r['mfu']:.0%})"
                         for r in result["rows"] if r["name"].startswith(("mha h=8", "torch.nn")))
        return "ok", f"{tokens:,} target tokens a step: {rows}"

    def base_size(self, allowed: float):
        """The base-size question (the lease plan's first call, module doc): table_a_tatoeba_base
        at h = 1 and 8, seeds 1 and 2, at once, captured, its horizon trainer.max_time = the
        part's time less the evaluation's, then its report. The dry run: tiny, on the synthetic
        pair, with a one-minute horizon."""
        sweep = self.out / "base_size"
        after = 90 if self.opts.cpu else 210  # starting, evaluating four runs, the report
        horizon = max(20.0 if self.opts.cpu else 60.0, allowed - after)
        extra = ["model.heads=1,8", "seed=1,2", f"trainer.max_time={horizon:.0f}"]
        if not self.opts.cpu:
            extra += ["trainer.capture=true", "trainer.pad_multiple=8", "trainer.max_steps=6000",
                      "eval.checkpoint=last"]
        else:  # the preset's size made tiny (its dims are its own keys, over model=tiny's)
            extra += ["trainer.max_steps=40", "model.d_model=32", "model.d_ff=64",
                      "model.encoder_layers=1", "model.decoder_layers=1",
                      "trainer.max_tokens=1024", "trainer.warmup_steps=5",
                      "trainer.valid_every=20"]
        proc = self.sh("base_size", self.sweep_command(sweep, "table_a_tatoeba_base", extra),
                       allowed - 30)
        done = sorted(sweep.glob("*/results.json"))
        if not done:
            return "failed", f"no run finished (exit {proc.returncode}; logs/base_size.log)"
        rep = self.sh("base_size_report", self.heads_lab("report", str(sweep)),
                      max(10.0, min(30.0, self.left())))
        runs = [json.loads(p.read_text()) for p in done]
        said = "; ".join(
            f"{r['name']}: {r['train']['steps']} steps ({r['train']['stopped_by']}), "
            f"{r['metrics']['train/tokens_per_s']:,.0f} tok/s, captured "
            f"{r['train'].get('captured')}, BLEU {r['metrics'].get('test/bleu', float('nan')):.2f}"
            for r in runs)
        ok = proc.returncode == 0 and rep.returncode == 0 and len(done) == 4
        return ("ok" if ok else "failed"), f"horizon {horizon:.0f} s; {said}"

    def speed(self, allowed: float):
        """The speed table (the lease plan's second call): bench_peers at 8,192 tokens a step
        only, every variant captured beside the compiled peers."""
        return self.bench_peers(allowed, first_only=True)

    def bench_peers(self, allowed: float, first_only: bool = False):
        """Every variant captured (mha h=1, 8, 32 and kv_heads=1, talking heads h=8 and 32)
        beside the peers (torch.nn.Transformer and Hugging Face's Marian, eager and compiled) at
        8,192 target tokens a step with greedy and beam-4 decoding (Marian's by its own
        generate), and at 25,600 without: bench_peers_<tokens>.json each. The dry run: the
        peers' rows, tiny, with decoding (compiling is minutes on a CPU)."""
        started, found = time.monotonic(), []
        batches = (4,) if self.opts.cpu else (256,) if first_only else (256, 800)
        for batch in batches:
            if self.opts.cpu:
                args = ["--batch", str(batch), "--length", "6", "--device", "cpu", "--precision",
                        "fp32", "--steps", "1", "--warmup", "0", "model.d_model=32",
                        "model.d_ff=64", "model.encoder_layers=1", "model.decoder_layers=1"]
            else:
                args = ["--batch", str(batch), "--length", "32", "--device", "cuda",
                        "--precision", "bf16", "--steps", "10", "--warmup", "3", "--compile",
                        "--capture-all", "model.d_model=512", "model.d_ff=2048",
                        "model.encoder_layers=6", "model.decoder_layers=6"]
            tokens = batch * (6 if self.opts.cpu else 32)
            json_path = self.out / f"bench_peers_{tokens}.json"
            left = allowed - (time.monotonic() - started)
            decode = [] if batch == batches[0] else ["--no-decode"]  # decoding: the 8k one
            proc = self.sh(f"bench_peers_{tokens}", self.heads_lab(
                "bench", "--quick", *decode, "--peers", *args, "--json", str(json_path)), left,
                data=False)
            if proc.returncode or not json_path.is_file():
                return "failed", f"exit {proc.returncode} (logs/bench_peers_{tokens}.log)"
            rows = json.loads(json_path.read_text())["rows"]
            best = max(rows, key=lambda r: r["tokens_per_s"])
            found.append(f"{tokens:,} tokens: fastest {best['name']} "
                         f"{best['tokens_per_s']:,.0f} tok/s")
        return "ok", "; ".join(found)

    def profile(self, allowed: float):
        """Where a training step's time goes on the device (heads-lab bench --profile train):
        profile.json (the top operators and kernels by device time) and trace.json."""
        return self._profile(allowed, "")

    def profile_captured(self, allowed: float):
        """The same of the captured step (--capture), as a GPU run trains by default:
        profile_captured.json and trace_captured.json (not a default part)."""
        return self._profile(allowed, "_captured")

    def _profile(self, allowed: float, suffix: str):
        if self.opts.cpu:
            args = ["--batch", "4", "--length", "6", "--device", "cpu", "--precision", "fp32",
                    "--steps", "2", "--warmup", "1", "model.d_model=32", "model.d_ff=64",
                    "model.encoder_layers=1", "model.decoder_layers=1"]
        else:  # the bench's dims and batch
            args = ["--batch", "256", "--length", "32", "--device", "cuda", "--precision",
                    "bf16", "--steps", "5", "--warmup", "3", "model.d_model=512",
                    "model.d_ff=2048", "model.encoder_layers=6", "model.decoder_layers=6"]
        json_path = self.out / f"profile{suffix}.json"
        proc = self.sh(f"profile{suffix}", self.heads_lab(
            "bench", "--profile", "train", *(["--capture"] if suffix else []), "model.heads=8",
            *args, "--json", str(json_path), "--trace", str(self.out / f"trace{suffix}.json")),
            allowed)
        if proc.returncode or not json_path.is_file():
            return "failed", f"exit {proc.returncode} (logs/profile{suffix}.log)"
        result = json.loads(json_path.read_text())
        top = "; ".join(f"{r['name']} {100 * r['share']:.0f} %" for r in result["rows"][:3])
        return "ok", f"{result['total_ms_per_step']:.1f} ms/step ({result['clock']}): {top}"

    def table_a(self, allowed: float):
        sweep = self.out / "table_a"
        # the dry run: two tiny runs on the synthetic pair, two at once, as on the GPU
        args = ["model.heads=1,4", "seed=1"] if self.opts.cpu else []
        report_s = 40 if not self.opts.cpu else 60
        proc = self.sh("table_a", self.sweep_command(sweep, "table_a", args), allowed - report_s)
        done = sorted(sweep.glob("*/results.json"))
        if not done:
            return "failed", f"no run finished (exit {proc.returncode}; logs/table_a.log)"
        rep = self.sh("table_a_report", self.heads_lab("report", str(sweep)),
                      min(report_s, self.left()))
        runs = [json.loads(p.read_text()) for p in done]
        mfu = [r["metrics"].get("cost/mfu") for r in runs if r["metrics"].get("cost/mfu")]
        peak = max(r["metrics"]["cost/peak_mem_mb"] for r in runs)
        detail = (f"{len(done)} runs finished; report exit {rep.returncode}; peak memory "
                  f"{peak:,.0f} MB" + (f"; MFU {min(mfu):.1%}-{max(mfu):.1%}" if mfu else ""))
        return ("ok" if proc.returncode == 0 and rep.returncode == 0 else "failed"), detail

    def studies(self, allowed: float):
        """Each --study in turn: the preset's sweep (its overrides after heads-lab's GPU ones),
        then its report. A study that would overrun what is left is stopped; its finished runs
        are kept and reported, and the studies after it are cut. The last study on a GPU may run
        to the end (a run cut for its report's 30 s is lost; a report can be made later from the
        runs' files): its report is made only where time is left."""
        ended = time.monotonic() + allowed
        said, failed, cut = [], False, False
        presets = [spec.split()[0] for spec in self.opts.study]
        for i, spec in enumerate(self.opts.study):
            preset, *extra = spec.split()
            name = preset if presets.count(preset) == 1 else f"{preset}-{i + 1}"
            sweep, report_s = self.out / name, 60 if self.opts.cpu else 30
            last = i == len(self.opts.study) - 1 and not self.opts.cpu
            left = ended - time.monotonic()
            if left < report_s + 30 and not self.opts.cpu:
                said.append(f"{name}: cut ({left:.0f} s left)")
                cut = True
                continue
            try:
                exit_code = self.sh(name, self.sweep_command(sweep, preset, extra),
                                    left - (0 if last else report_s)).returncode
                how, stopped = f"exit {exit_code}", False
            except subprocess.TimeoutExpired:  # stopped at the time left: not a failure
                exit_code, how, stopped = 0, "stopped at the time left", True
            cut |= stopped
            done = sorted(sweep.glob("*/results.json"))
            failed |= exit_code != 0 or (not done and not stopped)
            if done and last and ended - time.monotonic() < 10:
                how += f", no time left for its report: heads-lab report {sweep}"
            elif done:
                try:
                    rep = self.sh(f"{name}_report", self.heads_lab("report", str(sweep)),
                                  max(1.0, min(report_s, ended - time.monotonic())))
                    how += f", report exit {rep.returncode}"
                    failed |= rep.returncode != 0
                except subprocess.TimeoutExpired:  # the runs are kept: a report can follow
                    how += f", report stopped at the time left: heads-lab report {sweep}"
                    cut = True
            said.append(f"{name}: {len(done)} runs finished ({how}; logs/{name}.log)")
        return ("failed" if failed else "cut" if cut else "ok"), "; ".join(said)

    # ---- the end

    def finish(self) -> int:
        total = time.monotonic() - self.started
        summary = {"device": "cpu (dry run)" if self.opts.cpu else "gpu", "facts": self.facts,
                   "budget_s": self.opts.budget, "total_s": round(total, 1), "parts": self.parts}
        (self.out / "gpu_check.json").write_text(json.dumps(summary, indent=2) + "\n")
        lines = [f"# heads-lab GPU check ({summary['device']})", "",
                 ", ".join(f"{k}: {v}" for k, v in self.facts.items()), "",
                 "| part | status | seconds | detail |", "| --- | --- | --- | --- |"]
        lines += [f"| {p['part']} | {p['status']} | {p['seconds']:.0f} | "
                  f"{p['detail'].replace('|', '/')} |" for p in self.parts]
        lines += ["", f"total {total:.0f} s of a {self.opts.budget:.0f} s budget"]
        (self.out / "summary.md").write_text("\n".join(lines) + "\n")
        self.say("\n".join(lines))
        if self.opts.pack:
            self.pack()
        bad = [p["part"] for p in self.parts if p["status"] == "failed"]
        return 1 if bad else 0


    def pack(self) -> None:
        """Everything but summary.md and gpu_check.json into pack.tar.gz (then removed), so a
        lent machine returns three files; `tar xzf pack.tar.gz` gives the folders back."""
        import tarfile

        keep = {"summary.md", "gpu_check.json", "pack.tar.gz"}
        items = [p for p in sorted(self.out.iterdir()) if p.name not in keep]
        with tarfile.open(self.out / "pack.tar.gz", "w:gz") as tar:
            for item in items:
                tar.add(item, arcname=item.name)
        for item in items:
            shutil.rmtree(item) if item.is_dir() else item.unlink()


def _has_plugin(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _junit_counts(xml: Path) -> dict[str, int]:
    if not xml.is_file():
        return {}
    import xml.etree.ElementTree as ET

    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return {"passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"],
            "failed": n["failures"], "errors": n["errors"], "skipped": n["skipped"]}


if __name__ == "__main__":
    sys.exit(main())
