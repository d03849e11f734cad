"""Session-wide test set-up: mark every process this test session starts, so the last test can find leftovers.

``THUNDERVIZ_TEST_SESSION`` is set once here, before any test or kernel starts; every process a test starts inherits
it (rank engines, controllers, kernels, their children). ``tests/zz_cleanup`` then looks for processes of *this*
session only (other people's clusters on the same machine are none of our business), and fails if it is unset.

Under pytest-xdist (``./run test`` runs two workers, see ``run``) the workers inherit the controller's session, and
one worker's last test cannot know whether the other is still running a cluster: there the controller does the
leftover check once both workers have finished (``pytest_sessionfinish`` below), and fails the run if anything of
the session is left.
"""

from __future__ import annotations

import os
import uuid

SESSION_VARIABLE = "THUNDERVIZ_TEST_SESSION"

os.environ.setdefault(SESSION_VARIABLE, uuid.uuid4().hex)

# Tests start their pools explicitly (and some check that bad flags start nothing): no background pool at
# %load_ext unless a test asks for one (tests/notebook/test_prestart.py does, in its own kernel).
os.environ.setdefault("THUNDERVIZ_PRESTART", "0")

# Inductor (thunder's torchcompile executor) probes each vector ISA the CPU reports by compiling a test program and
# loading it in a fresh `python -c "import torch ..."`, in every process that first compiles a region: a warm-cache
# MLP's first call took 11.3 s with the probe and 7.1 s without, here. Torch's own switch skips the probe and trusts
# the CPU's flags (the same ISA, avx512 amx_tile, was picked either way); users' rank processes keep the probe.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")


def _xdist_controller(config: object) -> bool:
    """This process runs the workers of an xdist session (and no tests itself)."""
    return getattr(config, "workerinput", None) is None and bool(getattr(config.option, "numprocesses", None))


def pytest_sessionfinish(session: object, exitstatus: int) -> None:
    if not _xdist_controller(session.config):  # type: ignore[attr-defined]
        return
    import shutil

    from tests.helpers.run_once import shared_folder

    shutil.rmtree(shared_folder(os.environ[SESSION_VARIABLE]), ignore_errors=True)
    from tests.zz_cleanup.test_no_leftover_processes import leftovers_after_grace

    left = leftovers_after_grace(os.environ[SESSION_VARIABLE])
    if left:
        print("\nprocesses left behind by the tests:\n" + "\n".join(left))
        session.exitstatus = 1  # type: ignore[attr-defined]
