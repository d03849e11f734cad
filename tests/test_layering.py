"""Layering: the core, the strategies, the renderer and the rank engine never import the notebook stack.

``thunderviz/core``, ``strategies``, ``render`` and ``ranks`` run in training scripts, rank processes and
``thunderviz render``; IPython, ipywidgets and anywidget belong to ``thunderviz/notebook`` only, which depends on the
layers below and never the reverse. Checked twice: statically (no module of those layers names the notebook stack
in an import statement; the one exception is IPython inside a function of ``ranks``, which runs in the rank
engine's own IPython shell, never in the kernel) and at run time (importing every module of those layers, in a
fresh interpreter, leaves the notebook stack out of ``sys.modules``).
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import thunderviz

LOWER_LAYERS = ("core", "strategies", "render", "ranks")
NOTEBOOK_STACK = ("IPython", "ipywidgets", "anywidget")
FORBIDDEN_IMPORTS = (*NOTEBOOK_STACK, "thunderviz.notebook", "thunderviz.demos")
PACKAGE = Path(thunderviz.__file__).parent


def _lower_layer_modules() -> list[str]:
    names = []
    for layer in LOWER_LAYERS:
        names.append(f"thunderviz.{layer}")
        names += [m.name for m in pkgutil.walk_packages([str(PACKAGE / layer)], f"thunderviz.{layer}.")]
    return names


def _imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported module, inside a function?) for every absolute import statement of ``path``."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, in_function) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module, in_function))
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), False)
    return found


def _allowed(path: Path, name: str, in_function: bool) -> bool:
    if not any(name == f or name.startswith(f + ".") for f in FORBIDDEN_IMPORTS):
        return True
    rank_side = path.relative_to(PACKAGE).parts[0] == "ranks"
    return rank_side and in_function and (name == "IPython" or name.startswith("IPython."))


def test_no_lower_layer_module_imports_the_notebook_stack() -> None:
    files = [p for layer in LOWER_LAYERS for p in sorted((PACKAGE / layer).rglob("*.py"))]
    assert len(files) >= len(LOWER_LAYERS)
    offending = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in files
        for line, name, in_function in _imports(path)
        if not _allowed(path, name, in_function)
    ]
    assert offending == []


def test_importing_every_lower_layer_module_leaves_the_notebook_stack_unloaded() -> None:
    modules = _lower_layer_modules()
    assert {"thunderviz.core.decisions", "thunderviz.render.html", "thunderviz.strategies.fsdp"} <= set(modules)
    code = (
        "import importlib, sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted(m for m in {NOTEBOOK_STACK!r} if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
