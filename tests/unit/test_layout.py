"""The house rules of CONTRIBUTING.md, checked on the code itself: the wings and their arrows,
module and function sizes, and the config wing free of torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "heads_lab"
WINGS = {"api", "commands", "config", "data", "model", "training", "output", "analysis", "bench", "hf",
         "report", "sweeps", "subjects"}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def imported(path: Path) -> set[str]:
    """The heads_lab modules a file imports, anywhere in it (top level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("heads_lab"):
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("heads_lab")}
    return found


def test_the_package_is_in_its_wings():
    top = {p.name for p in PACKAGE.iterdir() if not p.name.startswith(("_", "."))}
    assert top == WINGS | {"errors.py"}, top ^ (WINGS | {"errors.py"})


def test_no_module_over_400_lines_and_no_function_over_80():
    too_long = []
    for path in modules():
        text = path.read_text()
        if len(text.splitlines()) > 400:
            too_long.append(f"{path.relative_to(PACKAGE)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    too_long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: "
                                    f"{length} lines")
    assert not too_long, too_long


def test_the_config_wing_points_at_nothing_but_itself_and_the_errors():
    """config/ is read by every stage; an arrow from it to a stage would run back up."""
    arrows = {f"{path.name} -> {m}" for path in (PACKAGE / "config").glob("*.py")
              for m in imported(path)
              if not m.startswith(("heads_lab.config", "heads_lab.errors"))}
    assert not arrows, arrows


def test_no_stage_imports_a_command():
    """Commands wire stages together; a stage (data, model, training, output, analysis) that
    imported a command would run back up."""
    arrows = {f"{path.relative_to(PACKAGE)} -> {m}" for wing in WINGS - {"api", "commands", "bench"}
              for path in (PACKAGE / wing).glob("*.py") for m in imported(path)
              if m.startswith("heads_lab.commands")}
    assert not arrows, arrows


def test_commands_name_a_model_family_only_where_the_command_line_is_parsed():
    """analyze and prune are written once against heads_lab/analysis/subject.py's Subject: in
    commands/, only command.py (which reads the `hf:` prefix and opens the family's adapter)
    imports a family's package."""
    arrows = {f"{path.name} -> {m}" for path in (PACKAGE / "commands").glob("*.py")
              for m in imported(path) if m.startswith(("heads_lab.hf", "heads_lab.subjects"))
              and path.name != "command.py"}
    assert not arrows, arrows


def test_the_config_and_the_dispatcher_start_without_torch():
    """`heads-lab info` and `--help` start without importing torch (seconds of start-up)."""
    code = ("import sys, heads_lab.config.compose, heads_lab.config.validate, "
            "heads_lab.config.cost, heads_lab.commands.cli, heads_lab.sweeps.jobs; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_every_import_inside_a_function_says_why_it_is_lazy():
    """CONTRIBUTING.md: imports at the top, unless lazy for start-up time or an optional
    dependency, said in a `# lazy: ...` comment on the import or the comment lines above it."""
    unexplained = []
    for path in modules():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            parent = parents.get(node)
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or isinstance(parent, ast.Module):
                continue
            if isinstance(parent, ast.If) and "TYPE_CHECKING" in ast.unparse(parent.test):
                continue
            said = lines[node.lineno - 1:node.end_lineno]
            above = node.lineno - 2  # the import and comment lines right above it, blank lines ending
            while above >= 0 and lines[above].strip().startswith(("#", "from ", "import ")):
                said.append(lines[above])
                above -= 1
            if above >= 1 and not lines[above].strip():  # one blank line between import groups
                above -= 1
                while above >= 0 and lines[above].strip().startswith(("#", "from ", "import ")):
                    said.append(lines[above])
                    above -= 1
            if not any("lazy" in line for line in said):
                unexplained.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: "
                                   f"{lines[node.lineno - 1].strip()}")
    assert not unexplained, unexplained


def _file_of(module: str) -> Path | None:
    """The file a heads_lab module name is: a .py, or a package's __init__.py."""
    parts = module.split(".")[1:]
    path = PACKAGE.joinpath(*parts)
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    return path / "__init__.py" if (path / "__init__.py").is_file() else None


def _arrows() -> dict[Path, set[Path]]:
    """file → the heads_lab files it imports, anywhere in it (top level, inside functions, under
    TYPE_CHECKING): `from heads_lab.data import tatoeba` points at data/tatoeba.py, and at the
    package's __init__.py only for a name that is not a submodule of it."""
    arrows: dict[Path, set[Path]] = {}
    for path in modules():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("heads_lab"):
                subs = [_file_of(f"{node.module}.{a.name}") for a in node.names]
                names = [s for s in subs if s is not None]
                if len(names) < len(subs):
                    names.append(_file_of(node.module))
            elif isinstance(node, ast.Import):
                names = [_file_of(a.name) for a in node.names if a.name.startswith("heads_lab")]
            targets |= {t for t in names if t is not None and t != path}
        arrows[path] = targets
    return arrows


def test_no_circle_of_imports():
    """No file reaches itself through imports (docs/architecture.md: imports run down the floors,
    never in a circle), lazy and type-only imports included."""
    arrows = _arrows()
    state: dict[Path, int] = {}  # 1: on the path, 2: done
    circles = []

    def visit(node: Path, trail: list[Path]) -> None:
        state[node] = 1
        for nxt in sorted(arrows.get(node, ())):
            if state.get(nxt) == 1:
                loop = trail[trail.index(nxt):] + [nxt]
                circles.append(" -> ".join(str(p.relative_to(PACKAGE)) for p in loop))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(arrows):
        if node not in state:
            visit(node, [node])
    assert not circles, circles


def test_the_ground_floor_imports_nothing_of_the_package():
    """errors.py is the ground: every wing imports it, it imports no wing (its typo hints, which
    read the config tree, live in config/messages.py)."""
    assert imported(PACKAGE / "errors.py") == set()
