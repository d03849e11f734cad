"""A local pool started in the background before anyone asks for it, so the first cell finds warm engines.

``%load_ext thunderviz`` starts one (opt out: ``THUNDERVIZ_PRESTART=0`` in the kernel's environment, or
``c.ThundervizMagics.prestart = False`` in an IPython profile). In the background, and only this: a ``LocalCluster``
of ``nproc`` engines on loopback (they import torch and thunder before registering), then the imports a first cell
needs (``rank.calls.warm_up``: lightning.fabric, the strategies, trace capture) on every engine, and the kernel-side
modules that build the first report. No process group and no CUDA: set-up, which picks the backend and may create a
CUDA context, waits for the first cell, which also decides ``--nproc``, ``--backend`` and ``--timeout``.
"""

from __future__ import annotations

import os
import threading

from thunderviz.pool.cluster import ENGINE_START_TIMEOUT_S, LocalCluster
from thunderviz.rank import calls as inside_rank

__all__ = ["PRESTART_VARIABLE", "WarmPool", "prestart_enabled"]

PRESTART_VARIABLE = "THUNDERVIZ_PRESTART"


def prestart_enabled() -> bool:
    """False when ``THUNDERVIZ_PRESTART`` is 0/false/no/off."""
    return os.environ.get(PRESTART_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


class WarmPool:
    """Starts ``nproc`` local engines in a background thread; ``take`` hands them to the first cell."""

    def __init__(self, nproc: int) -> None:
        self.nproc = nproc
        self.error: BaseException | None = None
        self._cluster: LocalCluster | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._start, name="thunderviz-warm-pool", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        cluster = None
        try:
            cluster = LocalCluster(self.nproc)
            cluster.wait_for_engines()
            cluster.client[:].apply_sync(inside_rank.warm_up)
            _warm_kernel_side()
        except BaseException as exc:  # reported by `state`; the first cell then starts a pool itself
            self.error = exc
            if cluster is not None:
                cluster.close()
            return
        with self._lock:
            if not self._closed:
                self._cluster = cluster
                return
        cluster.close()  # closed while starting

    @property
    def state(self) -> str:
        """``starting``, ``ready``, ``failed: ...`` or ``taken``."""
        if self._thread.is_alive():
            return "starting"
        if self._cluster is not None:
            return "ready"
        return f"failed: {self.error}" if self.error is not None else "taken"

    def wait(self, seconds: float = ENGINE_START_TIMEOUT_S) -> bool:
        """Wait for the background start to finish; True when the pool is ready."""
        self._thread.join(seconds)
        return self._cluster is not None

    def take(self, nproc: int) -> LocalCluster | None:
        """The warm cluster when it has ``nproc`` engines (waiting for the background start); otherwise None, and
        the warm engines are stopped. Either way this pool is used up."""
        self._thread.join(ENGINE_START_TIMEOUT_S)
        with self._lock:
            cluster, self._cluster, self._closed = self._cluster, None, True
        if cluster is not None and cluster.n != nproc:
            cluster.close()
            return None
        return cluster

    def close(self) -> None:
        """Stop the warm engines (or make the background start stop them when it finishes)."""
        with self._lock:
            cluster, self._cluster, self._closed = self._cluster, None, True
        if cluster is not None:
            cluster.close()


def _warm_kernel_side() -> None:
    """Import what the kernel needs to build and show the first report."""
