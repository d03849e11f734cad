"""The top-level API is exactly ``thunderviz.__all__``: sorted, complete, lazy, and light to import.

The idea is httpx's ``tests/test_exported_members.py``: every public name the package offers is in ``__all__``
and every name in ``__all__`` is offered, so adding a name means deciding it is public.
"""

from __future__ import annotations

import importlib
import inspect
import re
import types
from pathlib import Path

import pytest

import thunderviz
import thunderviz.errors
from tests.helpers.fresh_interpreter import CLUSTER, HEAVY, NOTEBOOK, light_paths, present


def _offered_names() -> set[str]:
    """Public attributes defined by thunderviz (not submodules, not what it imported from typing or __future__)."""
    eager = {
        n
        for n, v in vars(thunderviz).items()
        if not n.startswith("_")
        and not isinstance(v, types.ModuleType)
        and getattr(v, "__module__", "").startswith("thunderviz")
    }
    return eager | set(thunderviz._LAZY)


def test_all_is_sorted_without_duplicates() -> None:
    assert thunderviz.__all__ == sorted(set(thunderviz.__all__))


def test_all_lists_exactly_what_the_package_offers() -> None:
    assert set(thunderviz.__all__) == _offered_names()
    assert set(thunderviz.__all__) <= set(dir(thunderviz))


def test_every_name_resolves_to_the_object_in_its_home_module() -> None:
    for name in thunderviz.__all__:
        value = getattr(thunderviz, name)
        home = thunderviz._LAZY.get(name)
        if home is not None:
            assert value is getattr(importlib.import_module(home), name), name


def test_the_api_the_readme_promises_is_there() -> None:
    for name in ("ThunderFSDPStrategy", "ThunderDDPStrategy", "capture", "save", "load", "TraceView", "compare"):
        assert name in thunderviz.__all__
    assert {"render_html", "run_ranks"} <= set(thunderviz.__all__)
    assert callable(thunderviz.capture) and callable(thunderviz.render_html) and callable(thunderviz.run_ranks)
    assert inspect.isclass(thunderviz.TraceView) and inspect.isclass(thunderviz.ThunderFSDPStrategy)


def test_every_error_class_is_exported_and_derives_from_thundervizerror() -> None:
    errors = [getattr(thunderviz.errors, n) for n in thunderviz.errors.__all__]
    classes = [v for v in vars(thunderviz.errors).values() if inspect.isclass(v) and issubclass(v, BaseException)]
    assert {c.__name__ for c in classes} == set(thunderviz.errors.__all__)
    for cls in errors:
        assert cls.__name__ in thunderviz.__all__
        assert getattr(thunderviz, cls.__name__) is cls
        assert issubclass(cls, thunderviz.ThundervizError)
    assert "TraceCaptureError" in thunderviz.__all__


def test_unknown_names_raise_attributeerror() -> None:
    with pytest.raises(AttributeError, match="module 'thunderviz' has no attribute 'nope'"):
        _ = thunderviz.nope


def test_import_thunderviz_imports_no_heavy_dependency() -> None:
    """Checked in a fresh interpreter: this test process has imported everything already."""
    assert present(light_paths().loaded["import thunderviz"], HEAVY, NOTEBOOK, CLUSTER) == []


def test_removed_core_paths_are_named_with_their_new_home():
    """``thunderviz.core`` is gone; the release notes in docs/architecture.md say where each of its names lives now,
    and every one of them imports from there."""
    package = Path(thunderviz.__file__).parent
    assert not (package / "core").exists()
    notes = (package.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    moved = re.findall(r"^- `(thunderviz\.core\.\w+)`: `([\w, ]+)` -> `(thunderviz[\w.]*)`", notes, re.MULTILINE)
    assert {old for old, _, _ in moved} == {"thunderviz.core.diff", "thunderviz.core.timeline"}
    for _, names, new in moved:
        module = importlib.import_module(new)
        for name in names.split(", "):
            assert hasattr(module, name), (new, name)
    assert thunderviz.collective_changes is importlib.import_module("thunderviz.trace.diff").collective_changes
