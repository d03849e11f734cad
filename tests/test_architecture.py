"""The package layout's rules, checked on every import statement of the package (module level and inside functions).

One row per package: which thunderviz packages it may import and which third-party packages it may not. The rules
(README, "Architecture"):

- ``trace``: the trace model as plain data. No torch, no thunder: trace files open anywhere.
- ``timeline``: measured timelines. No torch or thunder, except ``timeline.record``, which records with
  torch.profiler on a rank, and ``timeline.instrumentation``, the hooks and wrappers it puts in place meanwhile.
- ``parallel``: options, decisions and bucket plans in plain Python. No thunder, no lightning.
- ``thunder``: the only package that imports lightning-thunder (and the only one that reads its internals).
- ``strategies``: the Fabric strategies; lightning lives here and above.
- ``render``: DOT/SVG/HTML from trace and timeline data. No torch, no thunder.
- ``pool`` (kernel: the rank processes), ``cell`` (kernel: one cell across the ranks), ``rank`` (inside each
  rank process): IPython only inside functions that run in the rank engine's own shell. ``reports``: what a
  run reports, drawn by ``render``.
- ``notebook``: magics and widgets, the top layer: nothing below imports it.
- ``demos``: example user code (models, scenarios, the tutorial): like a user's notebook it may call thunder.

And no import cycle between modules anywhere in the package.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import thunderviz
from tests.helpers.fresh_interpreter import HEAVY, NOTEBOOK, modules_loaded_by, present

PACKAGE = Path(thunderviz.__file__).parent

#: Modules every package may import: the exception hierarchy, the GC pause helper and where this process sits among
#: the ranks (``process_rank``) depend on nothing.
BASE = {"errors", "gc_pause", "process_rank"}


#: What was ranks/: the rank processes (pool), one cell across them (cell), inside a rank (rank),
#: what a run reports (reports).
RANK_PACKAGES = {"pool", "cell", "rank", "reports"}


@dataclass(frozen=True)
class Rule:
    may_import: frozenset[str]  # thunderviz packages (first name under thunderviz/) besides itself and BASE
    forbidden: tuple[str, ...]  # third-party top-level packages it must not import
    exempt_modules: tuple[str, ...] = ()  # modules of the package allowed the forbidden ones (named in the docs)


def _rule(may: set[str], forbidden: tuple[str, ...], exempt: tuple[str, ...] = ()) -> Rule:
    return Rule(frozenset(may), forbidden, exempt)


RULES: dict[str, Rule] = {
    "errors": _rule(set(), (*HEAVY, *NOTEBOOK)),
    "gc_pause": _rule(set(), (*HEAVY, *NOTEBOOK)),
    "process_rank": _rule(set(), (*HEAVY, *NOTEBOOK)),
    "trace": _rule(set(), ("torch", "thunder", "lightning", "lightning_fabric", "numpy", *NOTEBOOK)),
    "timeline": _rule(
        {"trace", "thunder"},
        ("torch", "thunder", "lightning", *NOTEBOOK),
        exempt=("timeline.record", "timeline.instrumentation"),
    ),
    "parallel": _rule({"trace"}, ("thunder", "lightning", "lightning_fabric", *NOTEBOOK)),
    "thunder": _rule({"trace", "parallel"}, ("lightning", "lightning_fabric", *NOTEBOOK)),
    "strategies": _rule({"trace", "parallel", "thunder"}, ("thunder", *NOTEBOOK)),
    "render": _rule({"trace", "timeline"}, ("torch", "thunder", "lightning", *NOTEBOOK)),
    # kernel side: the rank processes (IPython only inside functions run in the rank engine's own shell)
    "pool": _rule({"trace", "timeline", "parallel", "cell", "rank", "reports"}, ("thunder", *NOTEBOOK)),
    # kernel side: one cell across the ranks; what crosses is plain data
    "cell": _rule({"trace", "timeline", "parallel"}, ("thunder", *NOTEBOOK)),
    # rank side: inside each rank process
    "rank": _rule({"trace", "timeline", "parallel", "thunder", "strategies", "cell", "pool"}, ("thunder", *NOTEBOOK)),
    # what a run reports: picklable objects that open anywhere, drawn by render
    "reports": _rule({"trace", "timeline", "parallel", "render", "cell", "rank"}, ("thunder", *NOTEBOOK)),
    "notebook": _rule(
        {"trace", "timeline", "parallel", "thunder", "strategies", "render", *RANK_PACKAGES, "demos"}, ()
    ),
    # example user code imports thunderviz's public API (the package itself) like any user would
    "demos": _rule(
        {"__init__", "trace", "timeline", "parallel", "thunder", "strategies", "render", *RANK_PACKAGES}, NOTEBOOK
    ),
    "cli": _rule({"trace", "timeline", "render", "demos", "strategies"}, NOTEBOOK),
    # the package's front door re-exports the public API (lazily) and loads the notebook extension on request
    "__init__": _rule(
        {"trace", "timeline", "parallel", "thunder", "strategies", "render", *RANK_PACKAGES, "notebook"}, ()
    ),
}


@dataclass(frozen=True)
class Import:
    source: str  # importing module, dotted
    target: str  # imported module, dotted (resolved to a submodule where ``from X import sub`` names one)
    line: int
    in_function: bool


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _is_module(dotted: str) -> bool:
    rel = Path(*dotted.split("."))
    return (PACKAGE.parent / rel).with_suffix(".py").is_file() or (PACKAGE.parent / rel / "__init__.py").is_file()


def _imports_of(path: Path, *, annotations: bool = False) -> Iterator[Import]:
    """Every run-time import of ``path``; with ``annotations``, the ``if TYPE_CHECKING:`` imports too (no third-party
    package is loaded for them, so the package rules skip them, but a module they name is still one this module
    reads after, so the cycle check counts them)."""
    source = _module_name(path)
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]

    def visit(node: ast.AST, in_function: bool) -> Iterator[Import]:
        if isinstance(node, ast.If) and _is_type_checking(node) and not annotations:
            for child in node.orelse:
                yield from visit(child, in_function)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(source, alias.name, node.lineno, in_function)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield Import(source, sub if _is_module(sub) else base, node.lineno, in_function)
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inner)

    yield from visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), False)


def _all_imports(*, annotations: bool = False) -> list[Import]:
    return [imp for path in sorted(PACKAGE.rglob("*.py")) for imp in _imports_of(path, annotations=annotations)]


def _layer(module: str) -> str:
    """``thunderviz.trace.model`` -> ``trace``; ``thunderviz`` -> ``__init__``; ``thunderviz.cli`` -> ``cli``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _violation(imp: Import) -> str | None:
    layer = _layer(imp.source)
    rule = RULES[layer]
    top = imp.target.split(".")[0]
    where = f"{imp.source}:{imp.line} imports {imp.target}"
    if top == "thunderviz":
        target_layer = _layer(imp.target)
        if target_layer in (layer, *BASE) or target_layer in rule.may_import:
            return None
        return f"{where}: the {layer!r} package may import only {sorted(rule.may_import | BASE)} of thunderviz"
    if top not in rule.forbidden:
        return None
    if any(imp.source == f"thunderviz.{m}" for m in rule.exempt_modules):
        return None
    if layer in {"pool", "cell", "rank"} and top == "IPython":
        return None if imp.in_function else f"{where}: ranks use IPython only inside the rank engine's functions"
    return f"{where}: the {layer!r} package must not import {top}"


def test_every_package_has_a_rule():
    """A new package must say what it may import before it lands."""
    layers = {_layer(_module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert layers - set(RULES) == set()
    assert {"trace", "timeline", "parallel", "thunder", "strategies", "render", *RANK_PACKAGES, "notebook"} <= layers


def test_every_import_follows_its_package_rule():
    imports = _all_imports()
    assert len(imports) > 300  # the walk reached the whole package, function-level imports included
    assert any(i.source == "thunderviz.thunder.capture.traces" and i.target == "thunder" for i in imports)
    assert [v for imp in imports if (v := _violation(imp))] == []


def test_only_the_thunder_package_imports_thunder():
    importers = {_layer(i.source) for i in _all_imports() if i.target.split(".")[0] == "thunder"}
    assert importers <= {"thunder", "demos"}, importers


def test_the_checks_catch_what_they_forbid():
    """The rules bite: a trace module importing torch, a strategy importing thunder, core importing the notebook."""
    assert _violation(Import("thunderviz.trace.model", "torch", 1, True)) is not None
    assert _violation(Import("thunderviz.strategies.base", "thunder", 1, True)) is not None
    assert _violation(Import("thunderviz.render.html", "thunderviz.notebook.widgets", 1, False)) is not None
    assert _violation(Import("thunderviz.timeline.model", "torch", 1, True)) is not None
    assert _violation(Import("thunderviz.timeline.record", "torch", 1, True)) is None
    assert _violation(Import("thunderviz.pool.engine", "IPython", 1, False)) is not None
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted; a module importing itself too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(out)


def test_no_import_cycle_between_modules():
    """A module graph without cycles: every module can be read (and imported) after the ones it uses, type
    annotations included (an ``if TYPE_CHECKING:`` import back into a module that imports this one is a circle too,
    only one hidden from the interpreter)."""
    graph: dict[str, set[str]] = {}
    for imp in _all_imports(annotations=True):
        if imp.target.startswith("thunderviz") and imp.target != imp.source:
            # importing a submodule runs its package's __init__ first; that implicit edge is not the module's choice
            if imp.source.startswith(imp.target + "."):
                continue
            graph.setdefault(imp.source, set()).add(imp.target)
    assert len(graph) > 50
    assert _cycles(graph) == []


def test_importing_every_lower_layer_module_leaves_the_notebook_stack_unloaded():
    """The static rules hold at run time too: importing everything below the notebook loads no IPython/widgets."""
    lower = sorted(
        _module_name(p)
        for p in PACKAGE.rglob("*.py")
        if _layer(_module_name(p))
        in {"trace", "timeline", "parallel", "thunder", "strategies", "render", *RANK_PACKAGES}
    )
    assert {"thunderviz.parallel.decisions", "thunderviz.render.html", "thunderviz.strategies.fsdp"} <= set(lower)
    code = (
        "import importlib, warnings\n"
        "warnings.simplefilter('ignore')\n"
        f"for name in {lower!r}:\n"
        "    importlib.import_module(name)\n"
    )
    (loaded,) = modules_loaded_by(code)
    assert {"torch", "thunder", "lightning"} <= loaded  # the probe really imported the lower layers
    assert present(loaded, NOTEBOOK) == []


#: A tracker number ("issue" and a number) in the tree: it means nothing to a reader of the code. Spelt in two pieces
#: so that this line does not match itself.
TRACKER_NUMBER = re.compile("iss" + r"ue\s?#?\d+", re.IGNORECASE)


def test_no_tracker_numbers_in_the_tree():
    """Code, docstrings, comments, test names, notebooks and docs say the behaviour, not which ticket asked for it."""
    root = PACKAGE.parent
    files = [
        path
        for top in ("thunderviz", "tests", "bench", "docs")
        for path in sorted((root / top).rglob("*"))
        if path.is_file() and path.suffix in {".py", ".md", ".ipynb", ".sh", ".cfg", ".toml", ".txt", ".yml"}
    ]
    assert len(files) > 100  # the walk reached the tree
    hits = [
        f"{path.relative_to(root)}:{n}: {line.strip()[:80]}"
        for path in files
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if TRACKER_NUMBER.search(line)
    ]
    assert hits == []
    assert TRACKER_NUMBER.search("(see iss" + "ue 29)") and TRACKER_NUMBER.search("Iss" + "ue 30 item 7: ...")
