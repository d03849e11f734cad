"""Session-wide test set-up: mark every process this test session starts, so the last test can find leftovers.

``THUNDERVIZ_TEST_SESSION`` is set once here, before any test or kernel starts; every process a test starts inherits
it (rank engines, controllers, kernels, their children). ``tests/zz_cleanup`` then looks for processes of *this*
session only (other people's clusters on the same machine are none of our business), and fails if it is unset.
"""

from __future__ import annotations

import os
import uuid

SESSION_VARIABLE = "THUNDERVIZ_TEST_SESSION"

os.environ.setdefault(SESSION_VARIABLE, uuid.uuid4().hex)

# Tests start their pools explicitly (and some check that bad flags start nothing): no background pool at
# %load_ext unless a test asks for one (tests/notebook/test_prestart.py does, in its own kernel).
os.environ.setdefault("THUNDERVIZ_PRESTART", "0")
