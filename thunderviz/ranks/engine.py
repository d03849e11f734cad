"""The persistent rank engine: N ipyparallel engines that are ranks of one process group, kept across cells.

``RankEngine`` speaks only in ranks. It maps engine ids to ranks once (grouped by host, so local ranks are
contiguous and rank 0 lives on the first host), gives every rank the torchrun environment and a process group
with a bounded timeout, and runs cell source on all ranks while streaming their output prefixed by rank.

Failure policy (why it looks like this): a rank stuck in a gloo collective cannot be interrupted, and a process
group that saw a failure is not safe to reuse. So when one rank fails, ranks still running are sent SIGINT, and
killed after a short grace if that does not release them; any kill marks the pool for a restart, which happens
at the start of the next ``run`` (and says so). A failure where every rank returned is followed by a barrier
check; if the group does not answer, the pool is restarted too.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import psutil

from thunderviz.errors import RankError, ThundervizError
from thunderviz.ranks.cluster import AttachedCluster, LocalCluster, RankCluster

__all__ = [
    "BACKENDS",
    "CellError",
    "PHASES",
    "DEFAULT_TIMEOUT_S",
    "OUTPUT_MODES",
    "RankEngine",
    "RankFailure",
    "RankUsageError",
    "StrategySpec",
]

BACKENDS = ("auto", "gloo", "nccl")
#: What ``on_status`` reports per rank: starting, importing (torch/thunder, process group), waiting (ready for a
#: cell), configuring (fabric for a new strategy), running, done, failed, interrupted, stopped.
PHASES = ("starting", "importing", "waiting", "configuring", "running", "done", "failed", "interrupted", "stopped")
OUTPUT_MODES = ("all", "rank0", "none")
DEFAULT_TIMEOUT_S = 60.0
# After one rank fails: how long its peers get to finish on their own, then how long SIGINT gets before a kill.
PEER_GRACE_S = 0.3
SIGINT_GRACE_S = 1.0
# After a user interrupt (Ctrl-C): how long ranks get to stop before they are killed.
INTERRUPT_GRACE_S = 3.0
SETUP_TIMEOUT_S = 180.0
POLL_S = 0.02

_COLLECTIVES = (
    "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather", "reduce_scatter", "all_reduce", "all_to_all",
    "broadcast", "monitored_barrier", "barrier", "reduce", "gather", "scatter", "send", "recv", "wait",
)
# Frame headers in a traceback ("..., in all_reduce(tensor, op" / "in torch_all_reduce_prim_impl(") say which
# collective a rank was in; the gloo message itself only says "recv".
_COLLECTIVE_RE = re.compile(r"\bin (?:torch_)?(" + "|".join(_COLLECTIVES) + r")(?:_prim_impl)?\(")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


class RankUsageError(ThundervizError, ValueError):
    """Bad arguments to the engine (or the magics): nothing was started."""


@dataclass
class StrategySpec:
    """Which Fabric strategy every rank builds: ``thunder_fsdp``/``thunder_ddp`` with their options, or
    ``fabric`` with ``options={"name": "ddp"}`` for one of Fabric's own strategies."""

    kind: str
    options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "options": dict(self.options)}


@dataclass
class RankFailure:
    """What went wrong on one rank. ``kind``: raised, died, timeout, killed, interrupted."""

    rank: int
    kind: str
    summary: str
    traceback: str = ""
    collective: str | None = None


class CellError(RankError):
    """A cell failed on one or more ranks; ``failures`` has every rank's story, ``rank`` the first to fail."""

    def __init__(self, message: str, failures: dict[int, RankFailure], *, restarted: bool) -> None:
        first = min(failures.values(), key=lambda f: (f.kind in ("killed", "interrupted"), f.rank))
        super().__init__(message, rank=first.rank, remote_traceback=first.traceback)
        self.failures = failures
        self.pool_restart_pending = restarted

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of the kernel-side stack, which says nothing about the ranks."""
        lines = [f"{type(self).__name__}: {self}"]
        for rank in sorted(self.failures):
            failure = self.failures[rank]
            if failure.traceback:
                lines.append(f"--- rank {rank} traceback ---")
                lines.extend(f"[rank {rank}] {line}" for line in failure.traceback.rstrip().splitlines())
        return lines


def _remote_traceback(exc: BaseException) -> str:
    lines = getattr(exc, "traceback", None)
    if isinstance(lines, str) and lines:
        return _ANSI_RE.sub("", lines)
    if isinstance(lines, list) and lines:
        return _ANSI_RE.sub("", "\n".join(lines))
    render = getattr(exc, "render_traceback", None)
    if callable(render):
        try:
            return _ANSI_RE.sub("", "\n".join(render()))
        except Exception:
            pass
    return f"{type(exc).__name__}: {exc}"


def _find_collective(text: str) -> str | None:
    matches = _COLLECTIVE_RE.findall(text)
    meaningful = [m for m in matches if m not in ("wait", "send", "recv")]
    return (meaningful or matches or [None])[-1]


def _is_collective_timeout(text: str) -> bool:
    lowered = text.lower()
    return ("timed out" in lowered or "timeout" in lowered) and ("gloo" in lowered or "nccl" in lowered or "c10d" in lowered)


def _local_cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def _validate(nproc: Any, backend: str, timeout: Any) -> tuple[int, str, float]:
    if isinstance(nproc, bool) or not isinstance(nproc, int):
        raise RankUsageError(f"nproc must be a whole number of ranks, got {nproc!r}; pass e.g. --nproc 2")
    if nproc < 1:
        raise RankUsageError(f"nproc must be at least 1, got {nproc}; pass e.g. --nproc 2")
    if backend not in BACKENDS:
        raise RankUsageError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    try:
        timeout = float(timeout)
    except (TypeError, ValueError):
        raise RankUsageError(f"timeout must be a number of seconds, got {timeout!r}") from None
    if not timeout > 0:
        raise RankUsageError(f"timeout must be positive, got {timeout}; it bounds how long a rank waits in a collective")
    return nproc, backend, timeout


def _resolve_backend(backend: str, nproc_per_host: int, cuda_devices: int) -> str:
    if backend == "auto":
        return "nccl" if cuda_devices >= nproc_per_host and cuda_devices > 0 else "gloo"
    if backend == "nccl":
        if cuda_devices == 0:
            raise RankUsageError(
                "--backend nccl needs CUDA, and no CUDA device is visible here. Use --backend gloo (CPU ranks) "
                "or --backend auto."
            )
        if nproc_per_host > cuda_devices:
            raise RankUsageError(
                f"--backend nccl gives each local rank its own GPU, but {nproc_per_host} ranks were asked for on a "
                f"host with {cuda_devices} GPU(s). Use --nproc {cuda_devices} or fewer, or --backend gloo."
            )
    return backend


def _default_output(rank: int, stream: str, line: str) -> None:
    """Rank output prefixed by rank; ``rank == -1`` is a message from the engine itself."""
    target = sys.stderr if stream == "stderr" else sys.stdout
    target.write(f"[rank {rank}] {line}" if rank >= 0 else f"[thunderviz] {line}")
    target.flush()


class RankEngine:
    """A pool of rank processes that keeps its state across ``run`` calls.

    Use ``RankEngine.start(nproc)`` for a local pool on loopback, ``RankEngine.attach(cluster_id=...)`` for an
    existing (multi-node) ipyparallel cluster. Both return a ready engine: every rank has joined the process group
    and has ``torch``, ``thunder``, ``rank``, ``world_size``, ``device`` in its namespace.
    """

    def __init__(
        self,
        cluster: RankCluster,
        *,
        backend: str = "auto",
        timeout: float = DEFAULT_TIMEOUT_S,
        on_status: Callable[[dict[int, str]], None] | None = None,
        on_output: Callable[[int, str, str], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.requested_backend = backend
        self.timeout = float(timeout)
        self.on_status = on_status
        self.on_output = on_output or _default_output
        self.backend = "gloo"
        self.rank_to_engine: dict[int, int] = {}
        self.rank_hosts: dict[int, str] = {}
        self.rank_pids: dict[int, int] = {}
        self.phases: dict[int, str] = {}
        self.restart_reason: str | None = None
        self._rendezvous_dir: str | None = None
        self._fabric_spec: dict[str, Any] | None = None
        self._needs_snapshot = True
        self._collect = True
        self._views: dict[int, Any] = {}
        self._views_client: Any = None
        self._output_filter: Callable[[int], bool] = lambda rank: True

    # ----------------------------------------------------------------- construction

    @classmethod
    def start(
        cls,
        nproc: int,
        *,
        backend: str = "auto",
        timeout: float = DEFAULT_TIMEOUT_S,
        on_status: Callable[[dict[int, str]], None] | None = None,
        on_output: Callable[[int, str, str], None] | None = None,
    ) -> RankEngine:
        """Start ``nproc`` local ranks (controller and engines on 127.0.0.1, guarded against orphaning)."""
        nproc, backend, timeout = _validate(nproc, backend, timeout)
        if backend != "gloo":
            _resolve_backend(backend, nproc, _local_cuda_devices())  # fail before starting anything
        if on_status:
            on_status({r: "starting" for r in range(nproc)})
        cluster = LocalCluster(nproc)
        engine = cls(cluster, backend=backend, timeout=timeout, on_status=on_status, on_output=on_output)
        try:
            engine._setup()
        except BaseException:
            engine.stop()
            raise
        return engine

    @classmethod
    def attach(
        cls,
        *,
        cluster_id: str | None = None,
        profile: str | None = None,
        backend: str = "auto",
        timeout: float = DEFAULT_TIMEOUT_S,
        on_status: Callable[[dict[int, str]], None] | None = None,
        on_output: Callable[[int, str, str], None] | None = None,
    ) -> RankEngine:
        """Use the engines of a running ipyparallel cluster as ranks (the multi-node path); never stops it."""
        _, backend, timeout = _validate(1, backend, timeout)
        cluster = AttachedCluster(cluster_id=cluster_id, profile=profile)
        engine = cls(cluster, backend=backend, timeout=timeout, on_status=on_status, on_output=on_output)
        engine._setup()
        return engine

    @property
    def world_size(self) -> int:
        return len(self.rank_to_engine)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.rank_to_engine)

    def _set_phase(self, ranks: Any, phase: str) -> None:
        changed = False
        for rank in ranks:
            if self.phases.get(rank) != phase:
                self.phases[rank] = phase
                changed = True
        if changed and self.on_status:
            self.on_status(dict(self.phases))

    def _setup(self) -> None:
        """Map engines to ranks, pick backend and rendezvous, and join every rank to a fresh process group."""
        from thunderviz.ranks import bootstrap

        client = self.cluster.client
        if isinstance(self.cluster, LocalCluster):
            self.cluster.wait_for_engines()
        ids = sorted(client.ids)
        identities = dict(zip(ids, client[ids].apply_sync(bootstrap.engine_identity)))
        hosts: list[str] = []
        for eid in ids:
            if identities[eid]["host"] not in hosts:
                hosts.append(identities[eid]["host"])
        ordered = [eid for host in hosts for eid in ids if identities[eid]["host"] == host]
        per_host = {host: sum(1 for e in ids if identities[e]["host"] == host) for host in hosts}
        if len(set(per_host.values())) != 1:
            raise RankUsageError(
                f"Every host must run the same number of engines for Fabric, got {per_host}. Start the cluster "
                "with the same engine count per node."
            )
        local_world_size = per_host[hosts[0]]
        self.rank_to_engine = {rank: eid for rank, eid in enumerate(ordered)}
        self.rank_hosts = {rank: identities[eid]["host"] for rank, eid in self.rank_to_engine.items()}
        self.rank_pids = {rank: identities[eid]["pid"] for rank, eid in self.rank_to_engine.items()}
        if isinstance(self.cluster, LocalCluster):
            self.cluster.engine_pids = {eid: identities[eid]["pid"] for eid in ids}
        cuda = min(identities[eid]["cuda_devices"] for eid in ids)
        self.backend = _resolve_backend(self.requested_backend, local_world_size, cuda)

        rank0 = self.rank_to_engine[0]
        if self.cluster.is_local:
            master_addr = "127.0.0.1"
            # TCPStore listens on every interface; a file store keeps the local rendezvous off the network.
            self._rendezvous_dir = tempfile.mkdtemp(prefix="thunderviz-rdzv-")
            init_method = "file://" + os.path.join(self._rendezvous_dir, "store")
        else:
            master_addr = self.rank_hosts[0]
            init_method = None
        master_port = client[rank0].apply_sync(bootstrap.free_port, "127.0.0.1" if self.cluster.is_local else "")
        if init_method is None:
            init_method = f"tcp://{master_addr}:{master_port}"
        cpus = identities[rank0].get("cpus") or 1
        threads = max(1, cpus // local_world_size)
        self._set_phase(self.ranks, "importing")
        code = {}
        for rank, eid in self.rank_to_engine.items():
            info = {
                "rank": rank,
                "local_rank": rank % local_world_size,
                "world_size": self.world_size,
                "local_world_size": local_world_size,
                "node_rank": rank // local_world_size,
                "num_nodes": len(hosts),
                "master_addr": master_addr,
                "master_port": master_port,
                "backend": self.backend,
                "timeout_s": self.timeout,
                "init_method": init_method,
                "threads": threads,
            }
            code[rank] = (
                "# thunderviz-internal\n"
                "import thunderviz.ranks.bootstrap as _thunderviz_bootstrap\n"
                f"_thunderviz_bootstrap.init_rank(globals(), {info!r})\n"
                "_thunderviz_bootstrap.install_report_hook()\n"
            )
        failures = self._drive(self._submit(code), deadline_s=SETUP_TIMEOUT_S, stream=True, done_phase="waiting")
        if failures:
            self.restart_reason = "setting up the ranks failed"
            raise self._cell_error(failures, what="Setting up the ranks")
        self._fabric_spec = None
        self._needs_snapshot = True
        self._views = {}

    # ----------------------------------------------------------------- running

    def _view(self, rank: int) -> Any:
        """One DirectView per rank, built once per client (building one costs more than a message)."""
        client = self.cluster.client
        if self._views_client is not client:
            self._views = {}
            self._views_client = client
        view = self._views.get(rank)
        if view is None:
            view = self._views[rank] = client[self.rank_to_engine[rank]]
        return view

    def _submit(self, code_by_rank: dict[int, str] | str, ranks: list[int] | None = None) -> dict[int, Any]:
        client = self.cluster.client
        ranks = self.ranks if ranks is None else ranks
        results = {}
        for rank in ranks:
            code = code_by_rank if isinstance(code_by_rank, str) else code_by_rank[rank]
            results[rank] = self._view(rank).execute(code, block=False, silent=False)
        return results

    def _pump(self, ars: dict[int, Any], cursors: dict[tuple[int, str], int], partial: dict[tuple[int, str], str],
              captured: dict[int, list[str]], stream: bool, final: bool = False) -> None:
        for rank, ar in ars.items():
            md = ar.metadata  # live dict, filled by the client's IO thread as stream messages arrive
            for name in ("stdout", "stderr"):
                text = md.get(name) or ""
                key = (rank, name)
                start = cursors.get(key, 0)
                if len(text) <= start and not (final and partial.get(key)):
                    continue
                cursors[key] = len(text)
                buffered = partial.get(key, "") + text[start:]
                *lines, rest = buffered.split("\n")
                if final and rest:
                    lines.append(rest)
                    rest = ""
                partial[key] = rest
                for line in lines:
                    captured.setdefault(rank, []).append(line)
                    if stream and self._output_filter(rank):
                        self.on_output(rank, name, line + "\n")

    def _rank_dead(self, rank: int) -> bool:
        if not self.cluster.is_local:
            return False
        pid = self.rank_pids.get(rank)
        if pid is None:
            return False
        try:
            return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
        except psutil.NoSuchProcess:
            return True

    def _signal(self, ranks: list[int], sig: int) -> None:
        engine_ids = [self.rank_to_engine[r] for r in ranks]
        if sig == signal.SIGKILL:
            self.cluster.kill_engines(engine_ids)
        else:
            self.cluster.signal_engines(sig, engine_ids)

    def _drive(self, ars: dict[int, Any], *, deadline_s: float | None = None, stream: bool = True,
               captured: dict[int, list[str]] | None = None, done_phase: str | None = None,
               values: dict[int, Any] | None = None) -> dict[int, RankFailure]:
        """Wait for every rank's result while streaming output; resolve stragglers after a failure or Ctrl-C.

        Returns the failures by rank (empty when all succeeded). Kills mark the pool for a restart.
        """
        from ipyparallel.error import EngineError, RemoteError

        captured = {} if captured is None else captured
        cursors: dict[tuple[int, str], int] = {}
        partial: dict[tuple[int, str], str] = {}
        failures: dict[int, RankFailure] = {}
        settled: set[int] = set()
        started = time.monotonic()
        first_failure_at: float | None = None
        first_ok_at: float | None = None
        sigint_at: float | None = None
        interrupted_at: float | None = None
        while True:
            try:
                self._pump(ars, cursors, partial, captured, stream)
                for rank, ar in ars.items():
                    if rank in settled:
                        continue
                    if ar.ready():
                        settled.add(rank)
                        try:
                            value = ar.get(0)
                            if values is not None:
                                values[rank] = value
                            if done_phase:
                                self._set_phase([rank], done_phase)
                            first_ok_at = first_ok_at or time.monotonic()
                        except RemoteError as exc:
                            tb = _remote_traceback(exc)
                            if exc.ename == "EngineError":
                                # the controller reports a vanished engine as a remote EngineError
                                failures[rank] = RankFailure(rank, "died", f"the rank process exited ({exc.evalue})")
                                self.restart_reason = f"rank {rank} died"
                            elif exc.ename == "KeyboardInterrupt" and (interrupted_at or sigint_at):
                                failures[rank] = RankFailure(rank, "interrupted", "stopped by KeyboardInterrupt", tb)
                                self._set_phase([rank], "interrupted")
                                continue
                            elif _is_collective_timeout(f"{exc.evalue}\n{tb}"):
                                failures[rank] = RankFailure(
                                    rank, "timeout", f"{exc.ename}: {exc.evalue}", tb, _find_collective(tb))
                            else:
                                failures[rank] = RankFailure(rank, "raised", f"{exc.ename}: {exc.evalue}", tb)
                            self._set_phase([rank], "failed")
                        except EngineError as exc:
                            failures[rank] = RankFailure(rank, "died", f"the rank process exited ({exc})")
                            self.restart_reason = f"rank {rank} died"
                            self._set_phase([rank], "failed")
                    elif self._rank_dead(rank):
                        settled.add(rank)
                        failures[rank] = RankFailure(rank, "died", "the rank process exited while running the cell")
                        self.restart_reason = f"rank {rank} died"
                        self._set_phase([rank], "failed")
                pending = [r for r in ars if r not in settled]
                if not pending:
                    break
                now = time.monotonic()
                if failures and first_failure_at is None:
                    first_failure_at = now
                stop_from = interrupted_at if interrupted_at is not None else (
                    first_failure_at + PEER_GRACE_S if first_failure_at is not None else None)
                if stop_from is not None and sigint_at is None and now >= stop_from:
                    # Peers of a failed rank usually wait for it in a collective: try to stop them politely.
                    self._signal(pending, signal.SIGINT)
                    sigint_at = now
                grace = INTERRUPT_GRACE_S if interrupted_at is not None else SIGINT_GRACE_S
                kill_reason = None
                if sigint_at is not None and now - sigint_at > grace:
                    kill_reason = ("did not stop within {:.0f} s of the interrupt".format(grace)
                                   if interrupted_at is not None else
                                   "was still running after another rank failed (most likely waiting for it in a "
                                   "collective) and did not stop on SIGINT")
                elif first_ok_at is not None and now - first_ok_at > self.timeout + 10.0:
                    kill_reason = (f"was still running {self.timeout + 10:.0f} s after another rank finished the "
                                   "cell; the process-group timeout should have released it")
                elif deadline_s is not None and now - started > deadline_s:
                    kill_reason = f"did not finish within {deadline_s:.0f} s"
                if kill_reason is not None:
                    self._signal(pending, signal.SIGKILL)
                    for rank in pending:
                        kind = "interrupted" if interrupted_at is not None else "killed"
                        failures[rank] = RankFailure(rank, kind, f"killed: it {kill_reason}")
                        self._set_phase([rank], "interrupted" if interrupted_at is not None else "failed")
                    self.restart_reason = f"rank(s) {', '.join(map(str, pending))} had to be killed"
                    break
                # returns as soon as that rank's reply is in; other ranks are checked on the next pass
                ars[pending[0]].wait(POLL_S)
            except KeyboardInterrupt:
                if interrupted_at is None:
                    interrupted_at = time.monotonic()
                    sigint_at = None
                # a second Ctrl-C while waiting for the grace period just keeps waiting; the kill comes anyway
        for rank, ar in ars.items():
            if rank not in failures or failures[rank].kind in ("raised", "timeout", "interrupted"):
                # the reply can overtake the last stream messages; wait briefly for the engine's idle status
                ar.wait_for_output(timeout=1.0)
        # A half line at the end of a cell is the cell's last output; during setup it is C++ output still on its
        # way (gloo's banner), better dropped than cut in two.
        self._pump(ars, cursors, partial, captured, stream, final=done_phase == "done")
        if interrupted_at is not None:
            for rank in ars:
                failures.setdefault(rank, RankFailure(rank, "interrupted", "finished before the interrupt arrived"))
        return failures

    def _cell_error(self, failures: dict[int, RankFailure], *, what: str = "The cell") -> CellError:
        parts = []
        finished = [r for r in self.ranks if r not in failures]
        for rank in sorted(failures):
            f = failures[rank]
            if f.kind == "raised":
                parts.append(f"rank {rank} raised {f.summary}")
            elif f.kind == "died":
                parts.append(f"rank {rank} died: {f.summary}")
            elif f.kind == "timeout":
                where = f" in {f.collective}" if f.collective else " in a collective"
                parts.append(f"rank {rank} is stuck: it waited {self.timeout:.0f} s (--timeout){where} that not "
                             "every rank entered")
            elif f.kind == "interrupted":
                parts.append(f"rank {rank} interrupted ({f.summary})")
            else:
                parts.append(f"rank {rank} {f.summary}")
        if finished and any(f.kind == "timeout" for f in failures.values()):
            parts.append(f"rank(s) {', '.join(map(str, finished))} finished the cell without entering it")
        message = f"{what} failed on {len(failures)} of {self.world_size} ranks: " + "; ".join(parts) + "."
        if self.restart_reason:
            message += " The ranks will be restarted before the next cell (their state is lost)."
        if all(f.kind == "interrupted" for f in failures.values()):
            return RanksInterrupted(message, failures, restarted=self.restart_reason is not None)
        return CellError(message, failures, restarted=self.restart_reason is not None)

    def _after_failure(self, failures: dict[int, RankFailure]) -> None:
        """Decide whether the process group survived; if it did not, mark the pool for a restart."""
        if self.restart_reason:
            return
        if any(f.kind in ("timeout", "died", "killed") for f in failures.values()):
            self.restart_reason = "the process group saw a collective fail"
            return
        registered = set(self.cluster.client.ids)
        lost = [r for r, eid in self.rank_to_engine.items() if eid not in registered]
        if lost:
            self.restart_reason = f"rank(s) {', '.join(map(str, lost))} left the cluster"
            return
        check = self._submit("# thunderviz-internal\n"
                             "_thunderviz_pg_ok = _thunderviz_bootstrap.check_process_group(2.0)\n")
        problems = self._drive(check, deadline_s=5.0, stream=False)
        if problems:
            self.restart_reason = "the process group did not answer a barrier after the failure"
            return
        client = self.cluster.client
        for rank in self.ranks:
            if not self._view(rank).pull("_thunderviz_pg_ok", block=True):
                self.restart_reason = "the process group did not answer a barrier after the failure"
                return

    def _ensure_ready(self) -> None:
        if self.restart_reason is None:
            return
        reason = self.restart_reason
        self.on_output(-1, "stderr", f"Restarting the {self.world_size} ranks because {reason}.\n")
        self.restart()

    def restart(self) -> None:
        """Fresh rank processes and process group (the namespace of earlier cells is lost)."""
        self._set_phase(self.ranks, "starting")
        self._cleanup_rendezvous()
        self.cluster.restart()
        self.restart_reason = None
        self._setup()

    def run(
        self,
        source: str,
        *,
        strategy: StrategySpec | None = None,
        output: str = "all",
        collect: bool = True,
    ) -> Any:
        """Run ``source`` on every rank; return a ``RunReport`` or raise ``CellError`` naming the failed ranks.

        ``strategy`` (re)configures ``fabric`` in every rank's namespace when it differs from the last cell's.
        ``output``: ``all`` streams every rank, ``rank0`` only rank 0, ``none`` nothing (all of it is kept in the
        report either way).
        """
        from thunderviz.ranks.report import RunReport

        if output not in OUTPUT_MODES:
            raise RankUsageError(f"output must be one of {', '.join(OUTPUT_MODES)}, got {output!r}")
        if not isinstance(source, str):
            raise RankUsageError(f"source must be a string of Python code, got {type(source).__name__}")
        self._ensure_ready()
        self._output_filter = {"all": lambda r: True, "rank0": lambda r: r == 0, "none": lambda r: False}[output]
        from thunderviz.ranks import bootstrap

        captured: dict[int, list[str]] = {}
        started = time.monotonic()
        spec = strategy.to_dict() if strategy is not None else None
        client = self.cluster.client
        if (spec is not None and spec != self._fabric_spec) or self._needs_snapshot or collect != self._collect:
            # Only when something changed (or after a failure): otherwise the rank's post-cell hook already took
            # the snapshot, and a warm cell is one message per rank.
            self._set_phase(self.ranks, "configuring")
            prepared = {r: self._view(r).apply_async(bootstrap.prepare_cell, spec, collect) for r in self.ranks}
            failures = self._drive(prepared, stream=True, captured=captured)
            if failures:
                self._needs_snapshot = True
                self._after_failure(failures)
                raise self._cell_error(failures, what="Configuring fabric")
            if spec is not None:
                self._fabric_spec = spec
            self._collect = collect
            self._needs_snapshot = False
        self._set_phase(self.ranks, "running")
        cell = self._submit(source)
        failures = self._drive(cell, stream=True, captured=captured, done_phase="done")
        elapsed = time.monotonic() - started
        if failures:
            self._needs_snapshot = True
            self._after_failure(failures)
            raise self._cell_error(failures)
        collected: dict[int, dict[str, Any]] = {}
        if collect:
            for rank, ar in cell.items():
                # sent by the rank's post_run_cell hook on the cell's own output channel, before the reply
                data = ar.data.get(bootstrap.DATA_KEY) if ar.wait_for_output(timeout=10.0) else None
                collected[rank] = data if data is not None else {
                    "rank": rank, "problems": ["sent no report data (its output did not complete within 10 s)"]}
        return RunReport.from_ranks(
            collected,
            outputs={r: "\n".join(lines) for r, lines in captured.items()},
            world_size=self.world_size,
            backend=self.backend,
            strategy=spec,
            seconds=elapsed,
        )

    def pull(self, name: str, rank: int = 0) -> Any:
        """The value of ``name`` in ``rank``'s namespace (pickled across)."""
        return self._view(rank).pull(name, block=True)

    # ----------------------------------------------------------------- control

    def interrupt(self) -> None:
        """Send SIGINT to every rank (what Ctrl-C does while a cell runs)."""
        self._signal(self.ranks, signal.SIGINT)

    def status(self) -> dict[int, dict[str, Any]]:
        """Per rank: phase, engine id, host, pid, and whether the process is alive (local pools only)."""
        return {
            rank: {
                "phase": self.phases.get(rank, "unknown"),
                "engine_id": self.rank_to_engine[rank],
                "host": self.rank_hosts.get(rank),
                "pid": self.rank_pids.get(rank),
                "alive": (not self._rank_dead(rank)) if self.cluster.is_local else None,
            }
            for rank in self.ranks
        }

    def describe(self) -> str:
        state = f"restart pending ({self.restart_reason})" if self.restart_reason else "ready"
        return (f"{self.world_size} ranks, backend {self.backend}, timeout {self.timeout:.0f} s, "
                f"{self.cluster.description}: {state}")

    def _cleanup_rendezvous(self) -> None:
        if self._rendezvous_dir:
            shutil.rmtree(self._rendezvous_dir, ignore_errors=True)
            self._rendezvous_dir = None

    def stop(self) -> None:
        """Stop a local pool (every process it started) or detach from an attached cluster."""
        try:
            self.cluster.close()
        finally:
            self._cleanup_rendezvous()
            self._set_phase(self.ranks, "stopped")

    def __enter__(self) -> RankEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RanksInterrupted(CellError):
    """The user interrupted the cell; ranks that did not stop in time were killed."""
