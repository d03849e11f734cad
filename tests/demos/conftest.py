"""The demos start kernels and rank processes: tag them so tests/zz_cleanup can find leftovers of this run only."""

from __future__ import annotations

import os
import uuid

os.environ.setdefault("THUNDERVIZ_TEST_SESSION", uuid.uuid4().hex)
