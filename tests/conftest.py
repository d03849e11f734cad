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


#: The files that take longest (summed test seconds in a full run, longest first; measured 2026-12-06): they start
#: first, so that the two xdist workers (``--dist loadfile`` hands out files in collection order, one at a time) end
#: on short files instead of one worker running a long file alone at the end. Order only; a file missing here runs
#: after these, in collection order. Refresh from a full run's ``--durations=0`` when the order changes a lot.
SLOWEST_FIRST = (
    "tests/ranks/test_two_hosts.py",
    "tests/browser/test_jupyterlab.py",
    "tests/strategies/test_memory_plan_2rank.py",
    "tests/strategies/test_litgpt_2rank.py",
    "tests/thunder/test_rehearsal.py",
    "tests/demos/test_installed_demo.py",
    "tests/strategies/test_hf_2rank.py",
    "tests/ranks/test_faults.py",
    "tests/test_bench_device_check.py",
    "thunderviz/demos/further.ipynb",
    "tests/strategies/test_features_2rank.py",
    "tests/strategies/test_comm_2rank.py",
    "tests/strategies/test_hybrid_4rank.py",
    "tests/notebook/test_magics.py",
    "tests/strategies/test_training_2rank.py",
    "tests/strategies/test_compile_reuse_2rank.py",
    "tests/notebook/test_long_session.py",
    "tests/ranks/test_timeline_engine.py",
)


def pytest_collection_modifyitems(session: object, config: object, items: list) -> None:
    """``SLOWEST_FIRST`` first, the leftover-process check (``tests/zz_cleanup``) last; each file's tests stay
    together and in their order (a stable sort by file)."""
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}

    def key(item: object) -> int:
        path = item.nodeid.split("::", 1)[0]  # type: ignore[attr-defined]
        if path.startswith("tests/zz_cleanup/"):
            return len(rank) + 1
        return rank.get(path, len(rank))

    items.sort(key=key)
