"""A real IPython shell with ``%load_ext thunderviz``, shared by a test module (one rank pool per module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:  # noqa: F821
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "thunderviz")
    try:
        yield shell
    finally:
        magics = shell.magics_manager.registry.get("ThundervizMagics")
        if magics is not None:
            magics._stop()
