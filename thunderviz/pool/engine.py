"""The persistent rank engine: N ipyparallel engines that are ranks of one process group, kept across cells.

``RankEngine`` speaks only in ranks, and reads as the path of one cell:

1. set-up (``start``/``attach``/``restart``, with ``pool.engine_setup``): ``rank.calls.identify`` on every engine
   (an ``EngineIdentity`` each), ``topology.layout_ranks`` numbers them by host, rank 0 binds the rendezvous on its
   address facing the controller (``rank.calls.bind_rendezvous``), and ``protocol.RankSetup`` goes to each rank
   (``rank.calls.set_up``: torchrun environment, socket interface, process group with our timeout, namespace,
   report hook);
2. ``run``: a ``protocol.CellConfig`` only when the strategy or collect flag changed (``rank.calls.prepare_cell``),
   then the cell's source by ``execute``; ``driver.drive`` waits and streams; the report data arrives on the cell's
   data channel (``protocol.REPORT_DATA_KEY``, read by ``pool.cell_results``) and becomes a ``RunReport``;
3. a failure becomes a ``failures.CellError``; whether the process group survived decides a restart.

Failure policy (why it looks like this): a rank stuck in a gloo collective cannot be interrupted, and a process
group that saw a failure is not safe to reuse. So when one rank fails, ranks still running are sent SIGINT, and
killed after a short grace if that does not release them; any kill marks the pool for a restart, which happens
at the start of the next ``run`` (and says so). A failure where every rank returned is followed by a barrier
check; if the group does not answer, the pool is restarted too.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psutil

from thunderviz.cell.driver import OUTPUT_MODES, Outcome, drive, output_filter
from thunderviz.cell.failures import CellError, FailureKind, RankFailure, RankUsageError, cell_error
from thunderviz.cell.numbers import CellNumbers
from thunderviz.cell.output import LOG as OUTPUT_LOG
from thunderviz.cell.output import is_chatter
from thunderviz.cell.protocol import (
    DEFAULT_TIMELINE_STEPS,
    CellConfig,
    StrategySpec,
)
from thunderviz.cell.status import Phase, RankStatusInfo
from thunderviz.pool.cell_results import explain_deaths, partial_report, report_data
from thunderviz.pool.cluster import (
    ATTACH_WAIT_S,
    AttachedCluster,
    LocalCluster,
    RankCluster,
)
from thunderviz.pool.engine_setup import SETUP_TIMEOUT_S, identify_engines, rank_setups
from thunderviz.pool.topology import (
    DEFAULT_TIMEOUT_S,
    RankLayout,
    check_local_backend,
    layout_ranks,
    resolve_backend,
    validate_pool_args,
)
from thunderviz.rank import calls as inside_rank

__all__ = ["RankEngine"]

# How long the barrier check after a failed cell may take before the group counts as broken.
PG_CHECK_S = 2.0
PG_CHECK_DEADLINE_S = 5.0


def _default_output(rank: int, stream: str, line: str) -> None:
    """Rank output prefixed by rank; ``rank == -1`` is a message from the engine itself."""
    target = sys.stderr if stream == "stderr" else sys.stdout
    target.write(f"[rank {rank}] {line}" if rank >= 0 else f"[thunderviz] {line}")
    target.flush()


class RankEngine:
    """A pool of rank processes that keeps its state across ``run`` calls.

    Use ``RankEngine.start(nproc)`` for a local pool on loopback, ``RankEngine.attach(cluster_id=...)`` for an
    existing (multi-node) ipyparallel cluster. Both return a ready engine: every rank has joined the process group
    and has ``protocol.NAMESPACE_NAMES`` in its namespace.
    """

    def __init__(
        self,
        cluster: RankCluster,
        *,
        backend: str = "auto",
        timeout: float = DEFAULT_TIMEOUT_S,
        on_status: Callable[[dict[int, Phase]], None] | None = None,
        on_output: Callable[[int, str, str], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.requested_backend = backend
        self.timeout = float(timeout)
        self.on_status = on_status
        self.on_output = on_output or _default_output
        self.backend = "gloo"
        self.layout: RankLayout | None = None
        self.rank_to_engine: dict[int, int] = {}
        self.rank_hosts: dict[int, str] = {}
        self.rank_pids: dict[int, int] = {}
        self.phases: dict[int, Phase] = {}
        self._processes: dict[int, psutil.Process] = {}
        self.restart_reason: str | None = None
        self._config: CellConfig | None = None  # what the ranks were last prepared with
        self._views: dict[int, Any] = {}
        self._views_client: Any = None
        self._shows_output: Callable[[int], bool] = output_filter("all")
        #: each rank's cell numbers -> the notebook's, so tracebacks say the cell the notebook shows
        self.cell_numbers = CellNumbers()

    # ----------------------------------------------------------------- construction

    @classmethod
    def start(
        cls,
        nproc: int,
        *,
        backend: str = "auto",
        timeout: float = DEFAULT_TIMEOUT_S,
        on_status: Callable[[dict[int, Phase]], None] | None = None,
        on_output: Callable[[int, str, str], None] | None = None,
        warm: LocalCluster | None = None,
    ) -> RankEngine:
        """Start ``nproc`` local ranks (controller and engines on 127.0.0.1, guarded against orphaning).

        ``warm``: a ``LocalCluster`` of ``nproc`` engines already started (``warm_pool.WarmPool.take``) to use instead.
        """
        nproc, backend, timeout = validate_pool_args(nproc, backend, timeout)
        try:
            check_local_backend(backend, nproc)  # fail before starting anything
        except RankUsageError:
            if warm is not None:
                warm.close()
            raise
        if on_status:
            on_status(dict.fromkeys(range(nproc), Phase.STARTING))
        cluster = warm if warm is not None else LocalCluster(nproc)
        engine = cls(cluster, backend=backend, timeout=timeout, on_status=on_status, on_output=on_output)
        try:
            engine._set_up()
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
        connection_file: str | None = None,
        nproc: int | None = None,
        backend: str = "auto",
        timeout: float = DEFAULT_TIMEOUT_S,
        wait_s: float = ATTACH_WAIT_S,
        on_status: Callable[[dict[int, Phase]], None] | None = None,
        on_output: Callable[[int, str, str], None] | None = None,
    ) -> RankEngine:
        """Use the engines of a running ipyparallel cluster as ranks (the multi-node path); never stops it.

        The cluster is found by ``profile``/``cluster_id`` or by the controller's ``connection_file``
        (``ipcontroller-client.json``). With ``nproc``, wait up to ``wait_s`` until that many engines registered
        (more is an error: every engine becomes a rank); without, every registered engine becomes a rank.
        """
        _, backend, timeout = validate_pool_args(nproc or 1, backend, timeout)
        cluster = AttachedCluster(
            cluster_id=cluster_id, profile=profile, connection_file=connection_file, nproc=nproc, wait_s=wait_s
        )
        engine = cls(cluster, backend=backend, timeout=timeout, on_status=on_status, on_output=on_output)
        try:
            engine._set_up()
        except BaseException:
            engine.stop()  # detaches only
            raise
        return engine

    @property
    def world_size(self) -> int:
        return len(self.rank_to_engine)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.rank_to_engine)

    # ----------------------------------------------------------------- set-up

    def _set_up(self, *, reset_in_place: bool = False) -> None:
        """Map engines to ranks, pick backend and rendezvous, and join every rank to a fresh process group.

        ``reset_in_place``: the engines are the ones of earlier cells (a cluster we cannot restart): empty their
        namespaces and leave their process group first.
        """
        self._views = {}  # engine ids change across restarts: a view must never outlive one
        if isinstance(self.cluster, LocalCluster):
            self.cluster.wait_for_engines()
        layout = self.layout = layout_ranks(identify_engines(self.cluster, self.cluster.engine_ids()))
        self.rank_to_engine = layout.rank_to_engine
        self.rank_hosts = layout.rank_hosts
        self.rank_pids = layout.rank_pids
        # exactly the layout's ranks: a rank new to this layout is starting, one gone from it is no longer shown
        self.phases = {rank: self.phases.get(rank, Phase.STARTING) for rank in self.ranks}
        if isinstance(self.cluster, LocalCluster):
            self.cluster.engine_pids = {e.engine_id: e.pid for e in layout.engines}
        self.cell_numbers.reset(self.ranks, fresh=isinstance(self.cluster, LocalCluster) and not reset_in_place)
        self.backend = resolve_backend(self.requested_backend, layout.local_world_size, layout.cuda_devices_per_host)
        if reset_in_place:
            resets = {rank: self._view(rank).apply_async(inside_rank.reset) for rank in self.ranks}
            outcome = self._drive(resets, deadline_s=SETUP_TIMEOUT_S, stream=False)
            if outcome.failures:
                self.restart_reason = "resetting the ranks in place failed"
                raise self._cell_error(outcome.failures, what="Resetting the ranks in place")
        master_addr = layout.master_address
        master_port = self._view(0).apply_sync(inside_rank.bind_rendezvous, master_addr)
        self._set_phase(self.ranks, Phase.IMPORTING)
        setups = rank_setups(
            layout, master_addr=master_addr, master_port=master_port, backend=self.backend, timeout_s=self.timeout
        )
        requests = {rank: self._view(rank).apply_async(inside_rank.set_up, setups[rank]) for rank in self.ranks}
        outcome = self._drive(requests, deadline_s=SETUP_TIMEOUT_S, done_phase=Phase.WAITING, stop_peers=False)
        if outcome.failures:
            self.restart_reason = "setting up the ranks failed"
            raise self._cell_error(outcome.failures, what="Setting up the ranks")
        self._config = None

    # ----------------------------------------------------------------- what the driver needs (RankControls)

    def set_phase(self, ranks: list[int], phase: Phase) -> None:
        self._set_phase(ranks, phase)

    def _set_phase(self, ranks: list[int], phase: Phase) -> None:
        changed = False
        for rank in ranks:
            if self.phases.get(rank) != phase:
                self.phases[rank] = phase
                changed = True
        if changed and self.on_status:
            self.on_status(dict(self.phases))

    def rank_dead(self, rank: int) -> bool:
        """Whether a local rank's process is gone (attached ranks are watched by their controller instead)."""
        if not self.cluster.is_local:
            return False
        pid = self.rank_pids.get(rank)
        if pid is None:
            return False
        try:
            process = self._processes.get(pid)
            if process is None:  # built once: psutil.Process() reads /proc, and this runs every poll
                process = self._processes[pid] = psutil.Process(pid)
            return process.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
        except psutil.NoSuchProcess:
            return True

    def signal(self, ranks: list[int], sig: int) -> None:
        engine_ids = [self.rank_to_engine[r] for r in ranks]
        if sig == signal.SIGKILL:
            self.cluster.kill_engines(engine_ids)
        else:
            self.cluster.signal_engines(sig, engine_ids)

    def emit(self, rank: int, stream: str, line: str) -> None:
        if is_chatter(line):  # gloo's and torch's, not the user's: kept in the report and the debug log
            OUTPUT_LOG.debug("rank %d %s: %s", rank, stream, line.rstrip("\n"))
            return
        if self._shows_output(rank):
            self.on_output(rank, stream, line)

    def _drive(self, requests: dict[int, Any], **kwargs: Any) -> Outcome:
        outcome = drive(requests, self, **kwargs)
        if outcome.restart_reason:
            self.restart_reason = outcome.restart_reason
        explain_deaths(self.cluster, self.rank_pids, outcome)
        return outcome

    # ----------------------------------------------------------------- running

    def _view(self, rank: int) -> Any:
        """One DirectView per engine, built once per client and set-up (building one costs more than a message)."""
        client = self.cluster.client
        if self._views_client is not client:
            self._views = {}
            self._views_client = client
        engine_id = self.rank_to_engine[rank]
        view = self._views.get(engine_id)
        if view is None:
            view = self._views[engine_id] = client[engine_id]
        return view

    def run(
        self,
        source: str,
        *,
        strategy: StrategySpec | None = None,
        output: str = "all",
        collect: bool = True,
        timeline: bool = False,
        steps: int = DEFAULT_TIMELINE_STEPS,
        cell_label: int | None = None,
    ) -> Any:
        """Run ``source`` on every rank; return a ``RunReport`` or raise ``CellError`` naming the failed ranks.

        ``strategy`` (re)configures ``fabric`` in every rank's namespace when it differs from the last cell's.
        ``output``: ``all`` streams every rank, ``rank0`` only rank 0, ``none`` nothing (all of it is kept in the
        report either way). ``timeline``: record ``steps`` training steps of the cell on every rank
        (``RunReport.timeline``); when the cell fails, ``CellError.partial_report`` holds what the ranks that
        returned recorded. ``cell_label``: the notebook's number of this cell (``In[13]``), which the ranks'
        tracebacks then use (``cell.numbers``).
        """
        try:
            return self._run(
                source,
                strategy=strategy,
                output=output,
                collect=collect,
                timeline=timeline,
                steps=steps,
                cell_label=cell_label,
            )
        finally:
            self._forget_finished()

    def _run(
        self,
        source: str,
        *,
        strategy: StrategySpec | None,
        output: str,
        collect: bool,
        timeline: bool,
        steps: int,
        cell_label: int | None,
    ) -> Any:
        from thunderviz.reports.run_report import RunReport

        if output not in OUTPUT_MODES:
            raise RankUsageError(f"output must be one of {', '.join(OUTPUT_MODES)}, got {output!r}")
        if not isinstance(source, str):
            raise RankUsageError(f"source must be a string of Python code, got {type(source).__name__}")
        spec = strategy
        config = CellConfig(strategy=spec, collect=collect, timeline=bool(timeline), steps=steps)  # checks steps
        restarting = time.monotonic()
        self._ensure_ready()
        started = time.monotonic()  # the report's seconds count from here; a restart is its start_seconds
        self._shows_output = output_filter(output)
        captured: dict[int, list[str]] = {}
        self._prepare(config, captured)
        self._set_phase(self.ranks, Phase.RUNNING)
        cell = {rank: self._view(rank).execute(source, block=False, silent=False) for rank in self.ranks}
        outcome = self._drive(cell, captured=captured, done_phase=Phase.DONE, flush_partial_lines=True)
        self._number_cells(outcome, cell_label)
        elapsed = time.monotonic() - started
        if outcome.failures:
            self._config = None  # snapshot again before the next cell
            self._after_failure(outcome.failures)
            error = self._cell_error(outcome.failures)
            if timeline:
                error.partial_report = partial_report(
                    cell, outcome, captured, spec, elapsed, world_size=self.world_size, backend=self.backend
                )
            raise error
        wanted = collect or timeline
        collected = {rank: report_data(rank, request) for rank, request in cell.items()} if wanted else {}
        report = RunReport.from_ranks(
            collected,
            outputs={r: "\n".join(lines) for r, lines in captured.items()},
            world_size=self.world_size,
            backend=self.backend,
            strategy=spec,
            seconds=elapsed,
            timeline=timeline,
        )
        report.start_seconds = started - restarting
        report.rank_hosts = dict(self.rank_hosts)
        return report

    def _number_cells(self, outcome: Outcome, cell_label: int | None) -> None:
        """Each rank counted this cell: remember as which notebook cell, and renumber its traceback."""
        for rank, value in outcome.values.items():
            self.cell_numbers.ran(rank, cell_label, getattr(value, "execution_count", None))
        for rank, failure in outcome.failures.items():
            if failure.kind is not FailureKind.DIED and failure.kind is not FailureKind.KILLED:
                self.cell_numbers.ran(rank, cell_label)
            failure.traceback = self.cell_numbers.renumber(rank, failure.traceback)

    def _prepare(self, config: CellConfig, captured: dict[int, list[str]]) -> None:
        """Send a ``CellConfig`` when it differs from the last one (or after a failure): otherwise the rank's
        post-cell hook already took the snapshot, and a warm cell is one message per rank."""
        wanted = config
        if config.strategy is None and self._config is not None:
            wanted = replace(config, strategy=self._config.strategy)
        if wanted == self._config:
            return
        self._set_phase(self.ranks, Phase.CONFIGURING)
        requests = {rank: self._view(rank).apply_async(inside_rank.prepare_cell, config) for rank in self.ranks}
        outcome = self._drive(requests, captured=captured)
        if outcome.failures:
            self._config = None
            self._after_failure(outcome.failures)
            raise self._cell_error(outcome.failures, what="Configuring fabric")
        self._config = wanted

    def pull(self, name: str, rank: int = 0) -> Any:
        """The value of ``name`` in ``rank``'s namespace (pickled across)."""
        try:
            return self._view(rank).pull(name, block=True)
        finally:
            self._forget_finished()

    def _forget_finished(self) -> None:
        """Drop ipyparallel's records of our finished requests.

        Why: the client keeps every reply, its metadata (which holds the report data, traces included) and the
        message history forever, so a long session grew by a cell's report data per cell. The report already holds
        what it needs; nothing reads these records again.
        """
        client = self.cluster.client
        if client is None:
            return
        outstanding = set(client.outstanding)
        finished = [msg_id for msg_id in list(client.metadata) if msg_id not in outstanding]
        if finished:
            client.purge_local_results(jobs=finished)
        client.history[:] = [m for m in client.history if m in outstanding]
        for view in self._views.values():
            view.history[:] = [m for m in view.history if m in outstanding]

    # ----------------------------------------------------------------- failures

    def _cell_error(self, failures: dict[int, RankFailure], *, what: str = "The cell") -> CellError:
        return cell_error(
            failures,
            ranks=self.ranks,
            timeout_s=self.timeout,
            restart_pending=self.restart_reason is not None,
            what=what,
        )

    def _after_failure(self, failures: dict[int, RankFailure]) -> None:
        """Decide whether the process group survived; if it did not, mark the pool for a restart."""
        if self.restart_reason:
            return
        broken = (FailureKind.TIMEOUT, FailureKind.DIED, FailureKind.KILLED)
        if any(f.kind in broken for f in failures.values()):
            self.restart_reason = "the process group saw a collective fail"
            return
        registered = set(self.cluster.client.ids)
        lost = [r for r, eid in self.rank_to_engine.items() if eid not in registered]
        if lost:
            self.restart_reason = f"rank(s) {', '.join(map(str, lost))} left the cluster"
            return
        check = {rank: self._view(rank).apply_async(inside_rank.check_process_group, PG_CHECK_S) for rank in self.ranks}
        outcome = self._drive(check, deadline_s=PG_CHECK_DEADLINE_S, stream=False)
        if outcome.failures or not all(outcome.values.get(rank) for rank in self.ranks):
            self.restart_reason = "the process group did not answer a barrier after the failure"

    def _ensure_ready(self) -> None:
        if self.restart_reason is None:
            return
        reason = self.restart_reason
        self.on_output(-1, "stderr", f"Restarting the {self.world_size} ranks because {reason}.\n")
        self.restart()

    # ----------------------------------------------------------------- control

    def restart(self) -> None:
        """Fresh rank processes and process group (the namespace of earlier cells is lost).

        An attached cluster that ``ipcluster`` launched gets fresh engines; one started by hand keeps its live
        engines and resets them in place (fresh process group, empty namespace), or raises naming the engines its
        owner must restart.
        """
        self._set_phase(self.ranks, Phase.STARTING)
        where = {eid: f"rank {rank} on {self.rank_hosts.get(rank)}" for rank, eid in self.rank_to_engine.items()}
        before = self.restart_reason
        try:
            how = self.cluster.restart(where)
            self._set_up(reset_in_place=how == "in-place")
        except BaseException:
            # Pending still, so the next cell tries again instead of using the engine ids of a cluster that is gone
            # (one failed restart used to turn every later cell into "IndexError: No such engine").
            if self.restart_reason is None or self.restart_reason == before:
                self.restart_reason = "the previous restart did not complete"
            raise
        self.restart_reason = None

    def interrupt(self) -> None:
        """Send SIGINT to every rank (what Ctrl-C does while a cell runs)."""
        self.signal(self.ranks, signal.SIGINT)

    def status(self) -> dict[int, RankStatusInfo]:
        """Per rank: phase, engine id, host, pid, and whether the process is alive (local pools only)."""
        return {
            rank: RankStatusInfo(
                phase=self.phases[rank],
                engine_id=self.rank_to_engine[rank],
                host=self.rank_hosts[rank],
                pid=self.rank_pids[rank],
                alive=(not self.rank_dead(rank)) if self.cluster.is_local else None,
            )
            for rank in self.ranks
        }

    def describe(self) -> str:
        state = f"restart pending ({self.restart_reason})" if self.restart_reason else "ready"
        return (
            f"{self.world_size} ranks, backend {self.backend}, timeout {self.timeout:.0f} s, "
            f"{self.cluster.description}: {state}"
        )

    def stop(self) -> None:
        """Stop a local pool (every process it started) or detach from an attached cluster."""
        try:
            self.cluster.close()
        finally:
            self._set_phase(self.ranks, Phase.STOPPED)

    def __enter__(self) -> RankEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
