"""Which lightning-thunder this package was built against, checked before any of its internals are read.

Every module of ``thunderviz.thunder`` reads thunder 0.2.6's private structures (trace formats, the proxify hook,
compile data). A different version fails here, once, with the fix, instead of somewhere deep inside a trace.
"""

from __future__ import annotations

from types import ModuleType

from thunderviz.errors import UnsupportedThunderError

__all__ = ["SUPPORTED_THUNDER_VERSIONS", "ensure_supported_thunder", "import_thunder"]

SUPPORTED_THUNDER_VERSIONS = ("0.2.6",)


def ensure_supported_thunder() -> str:
    """Fail early, with the fix, on a thunder whose internals we have not tested."""
    import thunder

    version = getattr(thunder, "__version__", "unknown")
    if version not in SUPPORTED_THUNDER_VERSIONS:
        raise UnsupportedThunderError(
            f"thunderviz's thunder hooks were tested with lightning-thunder {', '.join(SUPPORTED_THUNDER_VERSIONS)},"
            f" but {version} is installed. Install a tested version (`pip install lightning-thunder==0.2.6"
            " torch==2.9.1`) or use thunder's own `thunder.distributed.fsdp(thunder.jit(model))`."
        )
    return version


def import_thunder() -> ModuleType:
    """The ``thunder`` module, once its version is checked: what a rank hands to the user's cells as ``thunder``."""
    ensure_supported_thunder()
    import thunder

    return thunder
