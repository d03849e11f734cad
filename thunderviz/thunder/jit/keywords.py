"""Which keyword arguments the installed ``thunder.jit`` really reads, asked of thunder itself.

Why: ``thunder.jit(fn, **compile_options)`` accepts any keyword without complaint and ignores the ones nothing reads,
so a strategy that forwarded every unknown keyword to it turned a typo (or Fabric's ``activation_checkpointing_policy``)
into a run with no effect and no warning. A hand-written list would drift with thunder; instead this reads the
installed thunder: the named parameters of ``thunder.jit``'s signature, plus every compile option a thunder module
looks up — ``get_compile_option("name", ...)`` and ``compile_options.get("name")`` / ``compile_options["name"]`` —
found by parsing thunder's own source (its Python files; nothing is imported or executed).
"""

from __future__ import annotations

import ast
import functools
import inspect
from collections.abc import Iterator
from pathlib import Path

__all__ = ["jit_keywords", "read_compile_options"]

#: Parameters of ``thunder.jit`` that are not options of the call: the function, and the executors (a strategy option
#: of its own), with their deprecated spelling.
_NOT_OPTIONS = frozenset({"fn", "executors", "executors_list"})
#: thunder's own tests and benchmarks pass options to thunder; they do not read them.
_NOT_THUNDER = frozenset({"tests", "benchmarks"})


@functools.cache
def jit_keywords() -> frozenset[str]:
    """Every keyword the installed ``thunder.jit`` takes or reads (``executors`` excluded: it is a strategy option)."""
    import thunder

    named = {
        name
        for name, p in inspect.signature(thunder.jit).parameters.items()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }
    return frozenset((named | read_compile_options(Path(thunder.__file__).parent)) - _NOT_OPTIONS)


def read_compile_options(package: Path) -> frozenset[str]:
    """The compile-option names the Python files under ``package`` read (see the module docstring)."""
    found: set[str] = set()
    for path in sorted(package.rglob("*.py")):
        if _NOT_THUNDER & set(path.relative_to(package).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (SyntaxError, UnicodeDecodeError):
            continue
        found.update(_option_reads(tree))
    return frozenset(found)


def _option_reads(tree: ast.Module) -> Iterator[str]:
    constants = _string_constants(tree)

    def name_of(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            reads_options = called == "get_compile_option" or (
                called in ("get", "pop") and isinstance(func, ast.Attribute) and _is_compile_options(func.value)
            )
            if reads_options and (name := name_of(node.args[0])) is not None:
                yield name
        elif isinstance(node, ast.Subscript) and _is_compile_options(node.value):
            if (name := name_of(node.slice)) is not None:
                yield name
        elif _is_membership_test(node) and (name := name_of(node.left)) is not None:
            yield name


def _is_membership_test(node: ast.AST) -> bool:
    """``"name" in compile_options`` (or ``not in``)."""
    return (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], (ast.In, ast.NotIn))
        and _is_compile_options(node.comparators[0])
    )


def _is_compile_options(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "compile_options") or (
        isinstance(node, ast.Attribute) and node.attr == "compile_options"
    )


def _string_constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"`` assignments (thunder names some options by constant, e.g. FP8_RECIPE_KEY)."""
    out: dict[str, str] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            out[node.targets[0].id] = node.value.value
    return out
