"""``%%thunder_fsdp``, ``%%thunder_ddp`` and ``%thunder_ranks``: a thin shell over ``thunderviz.pool``.

Everything a magic does is one call on a ``RankEngine``; what the magic adds is argument parsing (with
``magic_arguments``, so ``%%thunder_fsdp?`` shows the flags), pool reuse across cells, a live per-rank status line,
and turning engine errors into what IPython shows well (``UsageError`` for bad flags, rank-tagged tracebacks).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import sys
import time
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, argument_group, magic_arguments, parse_argstring
from traitlets import Bool

from thunderviz.cell.driver import OUTPUT_MODES
from thunderviz.cell.failures import CellError, RankUsageError
from thunderviz.cell.protocol import StrategySpec
from thunderviz.cell.status import Phase
from thunderviz.notebook.cell_failure import FullTracebacks
from thunderviz.notebook.strategy_flags import flag_values, strategy_arguments
from thunderviz.notebook.timeline_cell import STEPS_HELP, TIMELINE_HELP, steps_arg, timeline_options
from thunderviz.parallel.option_values import Parallelism
from thunderviz.parallel.strategy_options import closest_name
from thunderviz.pool.engine import RankEngine
from thunderviz.pool.topology import BACKENDS, DEFAULT_TIMEOUT_S, check_local_backend
from thunderviz.pool.warm_pool import PRESTART_VARIABLE, WarmPool, prestart_enabled

__all__ = ["ThundervizMagics", "register"]

STATUS_REDRAW_S = 0.2
#: Local ranks started when a cell gives no --nproc.
LOCAL_NPROC = 2
#: How many of the latest reports keep their traces whatever holds them; older ones keep everything but the traces
#: (decisions, ledgers, memory, output) unless a variable names them. See ``ThundervizMagics._keep_recent``.
REPORT_HISTORY = 5
# Names IPython's output history gives results: _, __, ___, _12
_OUTPUT_CACHE_NAME = re.compile(r"^_{1,3}$|^_\d+$")


def _release_traces(report: Any) -> None:
    """Drop a report's trace bundles (its heavy part), and say so in the report."""
    if not (report.bundles or report.bundles_by_rank):
        return
    report.bundles = {}
    report.bundles_by_rank = {}
    report.problems.append(
        f"traces released to bound memory: only the last {REPORT_HISTORY} reports keep them unless a variable "
        "names the report (use --name)"
    )


def _nproc(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--nproc takes a whole number of ranks, got {text!r}; e.g. --nproc 2"
        ) from None
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


def _attaching(args: argparse.Namespace) -> bool:
    """Whether the flags name an existing cluster (instead of local ranks)."""
    return bool(args.cluster_id or args.profile or args.connection_file)


def _common_arguments(func: Any) -> Any:
    """Flags shared by both strategy magics (one definition, so the two cannot drift apart)."""
    decorators = [
        argument_group("ranks"),
        argument(
            "--nproc",
            type=_nproc,
            default=None,
            help=f"number of ranks (default {LOCAL_NPROC} local ranks; when attaching, every registered engine, "
            "and with --nproc N wait for N of them)",
        ),
        argument(
            "--backend",
            choices=list(BACKENDS),
            default="auto",
            help="process-group backend; auto = nccl with one GPU per local rank when CUDA is present, else gloo",
        ),
        argument(
            "--timeout",
            type=_seconds,
            default=DEFAULT_TIMEOUT_S,
            help=f"seconds a rank may wait in a collective before the cell fails (default {DEFAULT_TIMEOUT_S:.0f})",
        ),
        argument(
            "--cluster-id",
            default=None,
            help="attach to a running ipyparallel cluster (e.g. `ipcluster start -n 8 --engines slurm`) "
            "instead of starting local ranks",
        ),
        argument("--profile", default=None, help="IPython profile of the cluster to attach to"),
        argument(
            "--connection-file",
            default=None,
            help="attach to the cluster of this controller connection file (ipcontroller-client.json; "
            "e.g. a hand-started `ipcontroller` + `ipengine`)",
        ),
        argument_group("results"),
        argument("--name", type=_identifier, default=None, help="store the report in this variable"),
        argument(
            "--plan",
            type=_identifier,
            default=None,
            metavar="PLAN",
            help="a variable holding thunderviz.plan(...): the report shows its prediction for this cell's strategy "
            "and world size next to the measured per-rank step peak",
        ),
        argument(
            "--output",
            choices=list(OUTPUT_MODES),
            default="all",
            help="whose stdout/stderr to stream into the cell (default all)",
        ),
        argument("--timeline", action="store_true", help=TIMELINE_HELP),
        argument("--steps", type=steps_arg, default=None, metavar="N", help=STEPS_HELP),
    ]
    for decorate in reversed(decorators):
        func = decorate(func)
    return func


class _LiveStatus:
    """The cell's status line: a live ``RankStatus`` widget while the cell runs, replaced by its static picture
    (text/plain and HTML) when the cell ends.

    Why the swap: the widget redraws in place in JupyterLab while the kernel is busy, but a closed notebook,
    nbconvert, GitHub and nbval read the saved output, and keeping one widget model per cell alive would grow a
    long session without bound. So the last state is written as plain output and the widget is closed.
    """

    def __init__(self, nproc: int, label: str) -> None:
        from IPython.display import display

        from thunderviz.notebook.widgets import RankStatus

        self.widget = RankStatus(nproc, label=label)
        self.widget.show(dict.fromkeys(range(nproc), "starting"))
        self.handle = display(self.widget, display_id=True)
        self.drawn_at = time.monotonic()

    def update(self, phases: dict[int, Phase], *, final: bool = False) -> None:
        """Redraw when all ranks reach a new phase or one fails; mixed states (one rank done, the other still
        running) at most every 0.2 s, since each redraw is a message to the front end."""
        now = time.monotonic()
        values = set(phases.values())
        settled = len(values) == 1 or Phase.FAILED in values
        if not (final or settled) and now - self.drawn_at < STATUS_REDRAW_S:
            return
        self.drawn_at = now
        self.widget.show(phases)

    def close(self, phases: dict[int, Phase] | None, report: Any = None) -> None:
        """Leave the static picture; with the cell's report, the time it took in the words of its header."""
        try:
            if phases:
                self.update(phases, final=True)
            if report is not None:
                from thunderviz.render.run_report import cell_seconds

                self.widget.timing = f"the cell: {cell_seconds(report)}"
            if self.handle is not None:
                self.handle.update(self.widget.static_bundle(), raw=True)
        finally:
            self.widget.close()


@magics_class
class ThundervizMagics(Magics):
    """Holds the rank pool between cells; see the module docstring."""

    prestart = Bool(
        True,
        help=f"Start {LOCAL_NPROC} local engines in the background when the extension loads, so the first cell finds "
        "them warm (no process group or CUDA context before that cell). The environment variable "
        f"{PRESTART_VARIABLE}=0 turns it off too.",
    ).tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self.engine: RankEngine | None = None
        #: local engines started when the extension loaded, for the first cell (see ``pool.warm_pool``)
        self.warm: WarmPool | None = None
        self._recent_reports: collections.deque[Any] = collections.deque()
        self._pool_key: tuple[Any, ...] | None = None
        self._status: _LiveStatus | None = None
        #: the last failed cell's error (``%thunder_ranks traceback`` prints every rank's traceback in full)
        self._last_error: CellError | None = None

    # ----------------------------------------------------------------- pool

    def _on_status(self, phases: dict[int, Phase]) -> None:
        if self._status is None:
            return
        with contextlib.suppress(Exception):  # a status line that cannot be drawn must not fail the cell
            self._status.update(phases)

    def _pool(self, args: argparse.Namespace) -> RankEngine:
        attach = _attaching(args)
        nproc = args.nproc if attach else (args.nproc or LOCAL_NPROC)
        key = (nproc, args.backend, args.timeout, args.cluster_id, args.profile, args.connection_file)
        if self.engine is not None and self._pool_key == key:
            return self.engine
        if self.engine is not None:
            old = self._pool_key
            print(
                f"[thunderviz] Restarting the rank pool: it was started with nproc={old[0]}, backend={old[1]}, "
                f"timeout={old[2]:g}, and this cell asks for nproc={key[0]}, backend={key[1]}, timeout={key[2]:g}."
            )
            self._stop()
        try:
            if attach:
                self.engine = RankEngine.attach(
                    cluster_id=args.cluster_id,
                    profile=args.profile,
                    connection_file=args.connection_file,
                    nproc=args.nproc,
                    backend=args.backend,
                    timeout=args.timeout,
                    on_status=self._on_status,
                )
            else:
                warm, self.warm = (self.warm.take(nproc) if self.warm is not None else None), None
                self.engine = RankEngine.start(
                    nproc, backend=args.backend, timeout=args.timeout, on_status=self._on_status, warm=warm
                )
        except RankUsageError as exc:
            raise UsageError(str(exc)) from None
        self._pool_key = key
        return self.engine

    def _stop(self) -> None:
        if self.warm is not None:
            warm, self.warm = self.warm, None
            warm.close()
        if self.engine is not None:
            try:
                self.engine.stop()
            finally:
                self.engine = None
                self._pool_key = None

    # ----------------------------------------------------------------- running a cell

    def _run(self, kind: str, parallelism: Parallelism, args: argparse.Namespace, cell: str) -> Any:
        if not cell.strip():
            raise UsageError(f"%%{kind} needs code in the cell below the magic line.")
        try:
            if not _attaching(args):
                check_local_backend(args.backend, args.nproc or LOCAL_NPROC)
            spec = StrategySpec(kind, flag_values(parallelism, args))  # checks every option, here in the kernel
        except RankUsageError as exc:
            raise UsageError(str(exc)) from None
        timeline = timeline_options(args)
        plan = self._plan(args.plan)
        self._status = status = _LiveStatus(args.nproc or LOCAL_NPROC, label=f"%%{kind}")
        report = None
        try:
            engine = self._pool(args)
            starting = status.widget.elapsed()  # the chips' clock: the header then says what they count
            report = engine.run(cell, strategy=spec, output=args.output, cell_label=self._cell_label(), **timeline)
            report.start_seconds += starting
        except CellError as exc:
            from IPython.display import display

            self._last_error = exc
            if exc.partial_report is not None:  # --timeline: what the ranks that returned recorded
                display(exc.partial_report)
            display(FullTracebacks(exc))  # every rank's traceback in full, folded; the error below is the short form
            raise
        finally:
            self._status = None
            status.close(self.engine.phases if self.engine is not None else None, report)
        if plan is not None:
            _attach_prediction(report, plan, args.plan, spec)
        if args.name:
            report.name = args.name
            self.shell.user_ns[args.name] = report
        self._keep_recent(report)
        return report

    def _cell_label(self) -> int | None:
        """The notebook's number of the running cell (``In[13]``): the shell counted it already when it started."""
        count = getattr(self.shell, "execution_count", None)
        return count - 1 if isinstance(count, int) and count > 1 else None

    def _plan(self, name: str | None) -> Any:
        """The ``Plan`` a ``--plan NAME`` flag names (checked before any rank is touched)."""
        if name is None:
            return None
        value = self.shell.user_ns.get(name)
        if value is None or type(value).__name__ != "Plan" or not hasattr(value, "candidates"):
            raise UsageError(
                f"--plan {name}: expected a variable holding thunderviz.plan(...), found "
                f"{'nothing' if value is None else type(value).__name__}; run `{name} = thunderviz.plan(model, batch, "
                "world_sizes=(2,))` first"
            )
        return value

    # ----------------------------------------------------------------- the bounded report history

    def _keep_recent(self, report: Any) -> None:
        """Keep the last ``REPORT_HISTORY`` reports whole; release the traces of older ones nobody holds.

        Why: IPython's output history (``Out``, ``_N``) keeps every returned report, and traces are the heavy
        part, so a long session grew by one cell's traces per cell. A report that a variable names (``--name``, an
        assignment) or that anything else refers to (a list, a widget) keeps everything.
        """
        self._recent_reports.append(report)
        while len(self._recent_reports) > REPORT_HISTORY:
            old = self._recent_reports.popleft()
            if not self._held_elsewhere(old):
                _release_traces(old)

    def _held_elsewhere(self, report: Any) -> bool:
        ns = self.shell.user_ns
        named = [n for n, v in list(ns.items()) if v is report and not _OUTPUT_CACHE_NAME.match(n)]
        if named:
            return True
        # References IPython's output history holds: Out[N]; _N, _, __, ___ in the user's namespace and again in
        # user_ns_hidden (push(interactive=False) records them there); the display hook's own _, __, ___; and the
        # last ExecutionResult.
        out_cache = ns.get("Out") if isinstance(ns.get("Out"), dict) else {}
        hidden = getattr(self.shell, "user_ns_hidden", {})
        hook = getattr(self.shell, "displayhook", None)
        known = sum(1 for v in list(ns.values()) if v is report)
        known += sum(1 for v in list(out_cache.values()) if v is report)
        known += sum(1 for n, v in list(hidden.items()) if v is report and _OUTPUT_CACHE_NAME.match(str(n)))
        known += sum(1 for n in ("_", "__", "___") if getattr(hook, n, None) is report)
        last = getattr(getattr(self.shell, "last_execution_result", None), "result", None)
        known += 1 if last is report else 0
        # 3 more: the caller's variable, this frame's argument, and getrefcount's own
        return sys.getrefcount(report) - 3 > known

    @magic_arguments()
    @_common_arguments
    @strategy_arguments(Parallelism.FSDP)
    @cell_magic
    def thunder_fsdp(self, line: str, cell: str) -> Any:
        """Run the cell on every rank with ``fabric`` set up for ``ThunderFSDPStrategy``; returns a RunReport.

        Each rank's namespace has ``fabric`` (launched), ``rank``, ``world_size``, ``device``, ``torch`` and
        ``thunder``, and keeps its state across cells. Output streams prefixed by rank; a failure on any rank
        fails the cell with that rank's traceback.
        """
        args = _parse(self.thunder_fsdp, line)
        return self._run("thunder_fsdp", Parallelism.FSDP, args, cell)

    @magic_arguments()
    @_common_arguments
    @strategy_arguments(Parallelism.DDP)
    @cell_magic
    def thunder_ddp(self, line: str, cell: str) -> Any:
        """Run the cell on every rank with ``fabric`` set up for ``ThunderDDPStrategy``; returns a RunReport.

        Same namespace, streaming and failure reporting as ``%%thunder_fsdp``.
        """
        args = _parse(self.thunder_ddp, line)
        return self._run("thunder_ddp", Parallelism.DDP, args, cell)

    @magic_arguments()
    @argument(
        "action",
        nargs="?",
        default="status",
        choices=["status", "restart", "stop", "traceback"],
        help="status (default): per-rank phase, pid, host; restart: fresh rank processes; stop: end them; "
        "traceback: every rank's full traceback of the last cell that failed",
    )
    @line_magic
    def thunder_ranks(self, line: str) -> Any:
        """Inspect or control the rank pool used by ``%%thunder_fsdp`` / ``%%thunder_ddp``."""
        args = _parse(self.thunder_ranks, line)
        if args.action == "traceback":
            print(self._last_error.full_traceback() if self._last_error is not None else "No cell has failed yet.")
            return None
        if self.engine is None and self.warm is not None and args.action != "restart":
            if args.action == "stop":
                self._stop()
                print("Stopped the warm pool (started when the extension loaded).")
            else:
                print(
                    f"A warm pool of {self.warm.nproc} local engines ({self.warm.state}), started when the extension "
                    "loaded; the first %%thunder_fsdp or %%thunder_ddp cell uses it."
                )
            return None
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
            alive = "  (process gone)" if info.alive is False else ""
            print(f"  rank {rank}: {info.phase!s:<11} engine {info.engine_id}  pid {info.pid}  host {info.host}{alive}")
        return None


def _parse(magic: Any, line: str) -> argparse.Namespace:
    """``parse_argstring``, with "did you mean" for a flag the magic does not have (``--nrpoc 2``: ``--nproc``)."""
    try:
        return parse_argstring(magic, line)
    except UsageError as exc:
        text = str(exc)
        if "unrecognized arguments:" not in text:
            raise
        given = [w.split("=", 1)[0] for w in text.split("unrecognized arguments:", 1)[1].split() if w.startswith("-")]
        flags = [s for a in magic.parser._actions for s in a.option_strings if s.startswith("--")]
        hints = [f"{flag}: did you mean {close}?" for flag in given if (close := closest_name(flag, flags))]
        name = magic.__name__
        more = " See %thunder_ranks?" if name == "thunder_ranks" else f" The flags of %%{name}: %%{name}?"
        raise UsageError(f"{text}{' (' + '; '.join(hints) + ')' if hints else ''}.{more}") from None


def _attach_prediction(report: Any, plan: Any, plan_name: str, spec: StrategySpec) -> None:
    """Put the plan's estimate for this cell's strategy and world size on the report (or say why there is none)."""
    from thunderviz.parallel.plan import candidate_name

    if spec.options is None:
        report.problems.append(f"--plan {plan_name}: a plan predicts thunderviz strategies, not {spec.describe()}")
        return
    name = candidate_name(spec.options)
    found = [c for c in plan.candidates if c.name == name and c.world_size == report.world_size]
    if not found:
        have = ", ".join(sorted({f"{c.name} x{c.world_size}" for c in plan.candidates}))
        report.problems.append(
            f"--plan {plan_name}: the plan has no {name} on {report.world_size} ranks (it has {have}); plan it with "
            f"thunderviz.plan(..., world_sizes=({report.world_size},))"
        )
        return
    report.prediction = found[0].memory
    report.prediction_name = f"{name} x{report.world_size}"
    report.plan = plan


def _plan_html(plan: Any) -> str:
    from thunderviz.render.memory_view import plan_html

    return plan_html(plan)


def register(ipython: Any) -> ThundervizMagics:
    """Called by ``%load_ext thunderviz``; starts a warm pool in the background (unless opted out: see
    ``ThundervizMagics.prestart``) and stops every pool when the shell exits so no rank outlives the kernel."""
    magics = ThundervizMagics(parent=ipython, shell=ipython)
    ipython.register_magics(magics)
    # A Plan shows as its Memory view (render.memory_view); strategies/ never imports render itself.
    html = ipython.display_formatter.formatters["text/html"]
    html.for_type_by_name("thunderviz.strategies.planning", "Plan", _plan_html)
    if magics.prestart and prestart_enabled():
        magics.warm = WarmPool(LOCAL_NPROC)
    import atexit

    atexit.register(magics._stop)
    return magics
