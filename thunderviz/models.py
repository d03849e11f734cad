"""Moved to ``thunderviz.demos.models``; this re-export keeps old imports working until every importer is updated.

Deprecated: import ``TinyGPT`` and ``make_batch`` from ``thunderviz.demos.models``. (Kept while files owned by
parallel branches still import from here; the lead removes it after merging them.)
"""

from thunderviz.demos.models import TinyGPT, make_batch

__all__ = ["TinyGPT", "make_batch"]
