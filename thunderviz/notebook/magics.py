"""``%%thunder_fsdp``, ``%%thunder_ddp`` and ``%thunder_ranks``: a thin shell over ``thunderviz.ranks``.

Everything a magic does is one call on a ``RankEngine``; what the magic adds is argument parsing (with
``magic_arguments``, so ``%%thunder_fsdp?`` shows the flags), pool reuse across cells, a live per-rank status line,
and turning engine errors into what IPython shows well (``UsageError`` for bad flags, rank-tagged tracebacks).
"""

from __future__ import annotations

import argparse
import html
import time
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, argument_group, magic_arguments, parse_argstring

from thunderviz.ranks import RankEngine, RankUsageError, StrategySpec
from thunderviz.ranks.engine import DEFAULT_TIMEOUT_S

__all__ = ["ThundervizMagics", "register"]

STATUS_REDRAW_S = 0.2


def _nproc(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nproc takes a whole number of ranks, got {text!r}; e.g. --nproc 2") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--nproc must be at least 1, got {value}; e.g. --nproc 2")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--timeout takes seconds, got {text!r}; e.g. --timeout 60") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--timeout must be positive, got {value}")
    return value


def _identifier(text: str) -> str:
    if not text.isidentifier():
        raise argparse.ArgumentTypeError(f"--name must be a Python variable name, got {text!r}")
    return text


def _common_arguments(func: Any) -> Any:
    """Flags shared by both strategy magics (one definition, so the two cannot drift apart)."""
    decorators = [
        argument_group("ranks"),
        argument("--nproc", type=_nproc, default=2, help="number of ranks (default 2)"),
        argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                 help="process-group backend; auto = nccl with one GPU per local rank when CUDA is present, else gloo"),
        argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT_S,
                 help=f"seconds a rank may wait in a collective before the cell fails (default {DEFAULT_TIMEOUT_S:.0f})"),
        argument("--cluster-id", default=None,
                 help="attach to a running ipyparallel cluster (e.g. `ipcluster start -n 8 --engines slurm`) "
                      "instead of starting local ranks"),
        argument("--profile", default=None, help="IPython profile of the cluster given by --cluster-id"),
        argument_group("strategy"),
        argument("--no-jit", action="store_true",
                 help="do not thunder.jit what fabric.setup receives (case 2: you jit your own function)"),
        argument("--executors", default=None, help="comma-separated thunder executors, e.g. torch,python"),
        argument_group("results"),
        argument("--name", type=_identifier, default=None, help="store the report in this variable"),
        argument("--output", choices=["all", "rank0", "none"], default="all",
                 help="whose stdout/stderr to stream into the cell (default all)"),
    ]
    for decorate in reversed(decorators):
        func = decorate(func)
    return func


class _StatusLine:
    """One line per cell: every rank's phase (starting, importing, running, done, failed...)."""

    def __init__(self, phases: dict[int, str]) -> None:
        self.phases = dict(phases)

    def __repr__(self) -> str:
        return "ranks: " + "  ".join(f"{rank}:{phase}" for rank, phase in sorted(self.phases.items()))

    def _repr_html_(self) -> str:
        colours = {"failed": "#c00", "done": "#080", "running": "#06c"}
        cells = " ".join(
            f"<span style='color:{colours.get(p, '#666')}'>rank {r}: {html.escape(p)}</span>"
            for r, p in sorted(self.phases.items())
        )
        return f"<div class='thunderviz-status'>{cells}</div>"


@magics_class
class ThundervizMagics(Magics):
    """Holds the rank pool between cells; see the module docstring."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.engine: RankEngine | None = None
        self._pool_key: tuple[Any, ...] | None = None
        self._status_handle: Any = None
        self._status_drawn_at = 0.0

    # ----------------------------------------------------------------- pool

    def _on_status(self, phases: dict[int, str], *, final: bool = False) -> None:
        """Redraw the status line when all ranks reach a new phase or one fails; mixed states (one rank done,
        the other still running) at most every 0.2 s, since each redraw is a message to the front end."""
        if self._status_handle is None:
            return
        now = time.monotonic()
        values = set(phases.values())
        settled = len(values) == 1 or "failed" in values
        if not (final or settled) and now - self._status_drawn_at < STATUS_REDRAW_S:
            return
        self._status_drawn_at = now
        try:
            self._status_handle.update(_StatusLine(phases))
        except Exception:
            pass

    def _pool(self, args: argparse.Namespace) -> RankEngine:
        key = (args.nproc if not args.cluster_id else None, args.backend, args.timeout, args.cluster_id, args.profile)
        if self.engine is not None and self._pool_key == key:
            return self.engine
        if self.engine is not None:
            old = self._pool_key
            print(f"[thunderviz] Restarting the rank pool: it was started with nproc={old[0]}, backend={old[1]}, "
                  f"timeout={old[2]:g}, and this cell asks for nproc={key[0]}, backend={key[1]}, timeout={key[2]:g}.")
            self._stop()
        try:
            if args.cluster_id or args.profile:
                self.engine = RankEngine.attach(cluster_id=args.cluster_id, profile=args.profile,
                                                backend=args.backend, timeout=args.timeout, on_status=self._on_status)
            else:
                self.engine = RankEngine.start(args.nproc, backend=args.backend, timeout=args.timeout,
                                               on_status=self._on_status)
        except RankUsageError as exc:
            raise UsageError(str(exc)) from None
        self._pool_key = key
        return self.engine

    def _stop(self) -> None:
        if self.engine is not None:
            try:
                self.engine.stop()
            finally:
                self.engine = None
                self._pool_key = None

    # ----------------------------------------------------------------- running a cell

    def _run(self, kind: str, options: dict[str, Any], args: argparse.Namespace, cell: str) -> Any:
        if not cell.strip():
            raise UsageError(f"%%{kind} needs code in the cell below the magic line.")
        if args.backend == "nccl" and not (args.cluster_id or args.profile):
            from thunderviz.ranks.engine import _local_cuda_devices, _resolve_backend

            try:
                _resolve_backend("nccl", args.nproc, _local_cuda_devices())
            except RankUsageError as exc:
                raise UsageError(str(exc)) from None
        executors = [e.strip() for e in args.executors.split(",") if e.strip()] if args.executors else None
        options = {"jit": not args.no_jit, **options}
        if executors:
            options["executors"] = executors
        spec = StrategySpec(kind, options)
        from IPython.display import display

        phases = {r: "starting" for r in range(args.nproc)}
        self._status_handle = display(_StatusLine(phases), display_id=True)
        self._status_drawn_at = time.monotonic()
        try:
            engine = self._pool(args)
            report = engine.run(cell, strategy=spec, output=args.output)
        finally:
            if self.engine is not None:
                self._on_status(self.engine.phases, final=True)
            self._status_handle = None
        if args.name:
            self.shell.user_ns[args.name] = report
        return report

    @magic_arguments()
    @_common_arguments
    @argument("--sharding", choices=["zero2", "zero3"], default="zero2", help="FSDP sharding (default zero2)")
    @argument("--bucketing", choices=["none", "layer", "block"], default="none",
              help="FSDP collective bucketing (default none)")
    @cell_magic
    def thunder_fsdp(self, line: str, cell: str) -> Any:
        """Run the cell on every rank with ``fabric`` set up for ``ThunderFSDPStrategy``; returns a RunReport.

        Each rank's namespace has ``fabric`` (launched), ``rank``, ``world_size``, ``device``, ``torch`` and
        ``thunder``, and keeps its state across cells. Output streams prefixed by rank; a failure on any rank
        fails the cell with that rank's traceback.
        """
        args = parse_argstring(self.thunder_fsdp, line)
        options = {"sharding_strategy": args.sharding.upper(), "bucketing_strategy": args.bucketing.upper()}
        return self._run("thunder_fsdp", options, args, cell)

    @magic_arguments()
    @_common_arguments
    @cell_magic
    def thunder_ddp(self, line: str, cell: str) -> Any:
        """Run the cell on every rank with ``fabric`` set up for ``ThunderDDPStrategy``; returns a RunReport.

        Same namespace, streaming and failure reporting as ``%%thunder_fsdp``.
        """
        args = parse_argstring(self.thunder_ddp, line)
        return self._run("thunder_ddp", {}, args, cell)

    @magic_arguments()
    @argument("action", nargs="?", default="status", choices=["status", "restart", "stop"],
              help="status (default): per-rank phase, pid, host; restart: fresh rank processes; stop: end them")
    @line_magic
    def thunder_ranks(self, line: str) -> Any:
        """Inspect or control the rank pool used by ``%%thunder_fsdp`` / ``%%thunder_ddp``."""
        args = parse_argstring(self.thunder_ranks, line)
        if self.engine is None:
            print("No rank pool is running; a %%thunder_fsdp or %%thunder_ddp cell starts one.")
            return None
        if args.action == "stop":
            self._stop()
            print("Stopped the rank pool.")
            return None
        if args.action == "restart":
            self.engine.restart()
            print(f"Restarted: {self.engine.describe()}")
            return None
        print(self.engine.describe())
        for rank, info in self.engine.status().items():
            alive = "" if info["alive"] is None else ("" if info["alive"] else "  (process gone)")
            print(f"  rank {rank}: {info['phase']:<11} engine {info['engine_id']}  pid {info['pid']}  "
                  f"host {info['host']}{alive}")
        return None


def register(ipython: Any) -> ThundervizMagics:
    """Called by ``%load_ext thunderviz``; stops the pool when the shell exits so no rank outlives the kernel."""
    magics = ThundervizMagics(ipython)
    ipython.register_magics(magics)
    import atexit

    atexit.register(magics._stop)
    return magics
