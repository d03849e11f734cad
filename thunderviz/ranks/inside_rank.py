"""Code that runs inside each rank process (an ipyparallel engine); the kernel calls it through ``protocol``.

The kernel never builds torch objects for the ranks: it sends ``protocol`` dataclasses, and these functions turn them
into a process group, a launched ``Fabric`` and a namespace the user's cell can rely on (``NAMESPACE_NAMES``). After
a user cell, the ``post_run_cell`` hook gathers what the report needs as plain picklable data (``ReportData``) and
publishes it on the cell's data channel.

Entry points (each called by ``apply`` from ``engine.py``): ``identify``, ``set_up``, ``prepare_cell``,
``check_process_group``. The rank's bookkeeping lives in ``STATE`` (this module is imported once per rank process),
never in the user's namespace. Importing this module is cheap (torch, thunder and IPython load inside the calls),
so the kernel can import it to name the functions it sends.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import sys
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from thunderviz.ranks import memory_measure
from thunderviz.ranks.failures import RankConnectionError
from thunderviz.ranks.protocol import (
    PHASE_DATA_KEY,
    REPORT_DATA_KEY,
    CellConfig,
    RankSetup,
    ReportData,
    StrategySpec,
)
from thunderviz.ranks.rendezvous import bind_listener, hostname_address, route_to, torchrun_environment

__all__ = [
    "STATE",
    "RankState",
    "bind_rendezvous",
    "check_process_group",
    "collect",
    "forget_unreachable_modules",
    "identify",
    "prepare_cell",
    "reset",
    "set_up",
    "snapshot_jitted_calls",
    "warm_up",
]


@dataclass
class RankState:
    """This rank's bookkeeping between cells.

    ``setup``: what ``set_up`` received; ``fabric``/``fabric_spec``: the ``Fabric`` we built and the spec it was built
    for; ``collect``: whether the hook gathers report data; ``calls_before``: call counts of jitted objects when the
    cell started (by ``id``, so nothing is kept alive); ``decisions_before``: length of the strategy's decision log
    then; ``hook``: the registered ``post_run_cell`` callback. With ``--timeline``: ``timeline_steps`` (0: off),
    the ``recorder`` running between the ``pre_run_cell`` hook (``pre_hook``) and the post-cell hook, and the
    problems met starting it.
    """

    setup: RankSetup | None = None
    fabric: Any = None
    fabric_spec: StrategySpec | None = None
    collect: bool = True
    calls_before: dict[int, int] = field(default_factory=dict)
    decisions_before: int = 0
    hook: Any = None
    timeline_steps: int = 0
    recorder: Any = None
    timeline_problems: list[str] = field(default_factory=list)
    pre_hook: Any = None
    rendezvous_socket: socket.socket | None = None


STATE = RankState()


def _user_namespace() -> dict[str, Any]:
    """The namespace user cells run in (the engine's IPython shell)."""
    from IPython import get_ipython

    return get_ipython().user_ns


def identify(controller_host: str = "127.0.0.1", controller_port: int = 0) -> dict[str, Any]:
    """Who this engine is, so the kernel can map engines to ranks (grouped by host), kill them by pid, and know which
    address and interface face the cluster (the ones that reach the controller)."""
    try:
        import torch

        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # torch broken on this host: set_up reports the import error per rank
        cuda_devices = 0
    try:
        address, interface = route_to(controller_host, controller_port)
    except OSError:
        address, interface = None, None
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "cuda_devices": cuda_devices,
        "cpus": os.cpu_count(),
        "address": address,
        "interface": interface,
    }


def warm_up() -> None:
    """Import what a first cell needs (Fabric, the strategies, trace capture), before anyone asks: no process group,
    no CUDA (``torch.cuda`` stays uninitialised until the first cell's set-up)."""
    import lightning.fabric  # noqa: F401


def bind_rendezvous(address: str) -> int:
    """Rank 0, before ``set_up``: listen on ``address`` on a port the OS picks and keep the socket, so nothing can
    take the port before the store serves on it. Returns the port."""
    _close_rendezvous_socket()
    STATE.rendezvous_socket = bind_listener(address)
    return STATE.rendezvous_socket.getsockname()[1]


def _close_rendezvous_socket() -> None:
    if STATE.rendezvous_socket is not None:
        STATE.rendezvous_socket.close()
        STATE.rendezvous_socket = None


def _store(setup: RankSetup) -> Any:
    """The ``TCPStore`` of this process group: rank 0 serves on the socket ``bind_rendezvous`` kept."""
    import torch.distributed as dist

    timeout = timedelta(seconds=float(setup.timeout_s))
    if setup.rank != 0:
        return dist.TCPStore(setup.master_addr, setup.master_port, setup.world_size, False, timeout)
    if STATE.rendezvous_socket is None:
        raise RuntimeError("set_up(rank=0) needs bind_rendezvous() first")
    fd = STATE.rendezvous_socket.detach()  # the store owns (and closes) the descriptor from here on
    STATE.rendezvous_socket = None
    return dist.TCPStore(
        setup.master_addr,
        setup.master_port,
        setup.world_size,
        True,
        timeout,
        wait_for_workers=False,
        master_listen_fd=fd,
        use_libuv=True,
    )


def _socket_interfaces(setup: RankSetup) -> dict[str, str]:
    """Tell gloo and NCCL which interface to use, unless the engine's environment already does.

    Without it gloo advertises whatever the hostname resolves to, which on Debian is 127.0.1.1: peers on other
    hosts then cannot connect.
    """
    chosen = {}
    for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if variable not in os.environ and setup.socket_ifname:
            os.environ[variable] = chosen[variable] = setup.socket_ifname
    return chosen


def _connection_advice(setup: RankSetup, exc: BaseException, chosen: dict[str, str]) -> str:
    """The message of a set-up that could not connect: where it tried, through which interface, and the fix."""
    host = socket.gethostname()
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    ifname = os.environ.get("GLOO_SOCKET_IFNAME") if setup.backend == "gloo" else os.environ.get("NCCL_SOCKET_IFNAME")
    variable = "GLOO_SOCKET_IFNAME" if setup.backend == "gloo" else "NCCL_SOCKET_IFNAME"
    who = "chosen by thunderviz" if variable in chosen else "set in the engine's environment"
    parts = [
        f"rank {setup.rank} on host {host} could not join the {setup.backend} process group within "
        f"{setup.timeout_s:.0f} s ({type(exc).__name__}: {first_line}).",
        f"The rendezvous is {setup.master_addr}:{setup.master_port} (rank 0's address facing the controller);",
        f"this rank reaches the controller through interface {setup.socket_ifname or 'unknown'};",
        f"{variable}={ifname} ({who})." if ifname else f"{variable} is not set.",
    ]
    resolved = hostname_address()
    if resolved and ipaddress.ip_address(resolved).is_loopback and setup.num_nodes > 1:
        parts.append(
            f"The hostname {host} resolves to {resolved}, a loopback address (Debian's default /etc/hosts "
            "line): peers cannot connect to an address advertised from it."
        )
    fix = (
        f"Fix: make {variable} name the interface that reaches the other hosts"
        + (f" (here {setup.socket_ifname})" if setup.socket_ifname else "")
        + f", or unset it so thunderviz chooses; and check that {setup.master_addr}:{setup.master_port} and the "
        "peers' ports are reachable from this host (firewall)."
    )
    return " ".join([*parts, fix])


def set_up(setup: RankSetup) -> None:
    """Set the torchrun environment, import torch and thunder, join the process group, fill the namespace, and
    install the report hook.

    The process group is created here (not by Fabric) so that its timeout is ours: it is what bounds a rank that
    waits in a collective its peers never enter. Fabric then finds it initialised and reuses it.

    Raises:
        RankConnectionError: the store or the peers could not be reached (names the address, interface and fix).
    """
    os.environ.update(
        torchrun_environment(
            rank=setup.rank,
            local_rank=setup.local_rank,
            world_size=setup.world_size,
            local_world_size=setup.local_world_size,
            node_rank=setup.node_rank,
            master_addr=setup.master_addr,
            master_port=setup.master_port,
            threads=setup.threads,
        )
    )
    chosen = _socket_interfaces(setup)
    import torch
    import torch.distributed as dist

    from thunderviz.thunder.compat import import_thunder

    if setup.threads:
        torch.set_num_threads(setup.threads)

    if setup.backend == "nccl":
        torch.cuda.set_device(setup.local_rank)
        device = torch.device("cuda", setup.local_rank)
    else:
        device = torch.device("cpu")
    if dist.is_initialized():
        dist.destroy_process_group()
    try:
        dist.init_process_group(
            backend=setup.backend,
            store=_store(setup),
            rank=setup.rank,
            world_size=setup.world_size,
            timeout=timedelta(seconds=float(setup.timeout_s)),
        )
    except (RuntimeError, OSError, TimeoutError) as exc:  # DistNetworkError/DistStoreError are RuntimeErrors
        raise RankConnectionError(_connection_advice(setup, exc, chosen)) from exc
    STATE.setup = setup
    STATE.fabric = STATE.fabric_spec = None
    _user_namespace().update(
        torch=torch,
        thunder=import_thunder(),
        rank=setup.rank,
        local_rank=setup.local_rank,
        world_size=setup.world_size,
        device=device,
        fabric=None,
    )
    _install_report_hook()


def _build_strategy(spec: StrategySpec) -> Any:
    """The strategy object (or Fabric's name for one of its own) for a ``StrategySpec``."""
    if spec.options is None:
        # One of Fabric's own registered strategies by name (e.g. "ddp"): used before ours exist, and in tests.
        return spec.fabric_name
    import thunderviz.strategies as strategies

    return getattr(strategies, spec.options.strategy_name).from_options(spec.options)


def configure_fabric(ns: dict[str, Any], spec: StrategySpec | None) -> None:
    """Put a launched ``Fabric`` for ``spec`` in the namespace; keep the existing one when the spec is unchanged
    and ``fabric`` still names it, so objects set up in earlier cells stay attached to the same strategy."""
    if spec is None or (STATE.fabric_spec == spec and ns.get("fabric") is STATE.fabric):
        return
    import lightning.fabric.connector as connector
    from lightning.fabric import Fabric

    # An ipyparallel engine runs an IPython shell, so Fabric believes it is in a notebook and refuses "ddp"-style
    # strategies (it would fork workers from there). This process *is* a worker whose group was created
    # externally, which is exactly the case Fabric's check exists to allow.
    connector._IS_INTERACTIVE = False
    setup = STATE.setup
    fabric = Fabric(
        accelerator="cuda" if setup.backend == "nccl" else "cpu",
        devices=setup.local_world_size,
        num_nodes=setup.num_nodes,
        strategy=_build_strategy(spec),
    )
    fabric.launch()
    ns["fabric"] = STATE.fabric = fabric
    STATE.fabric_spec = spec


def prepare_cell(config: CellConfig) -> None:
    """Before a cell whose strategy (or collect flag) changed, or after a failure: configure ``fabric`` and
    snapshot the call counts the report compares against."""
    ns = _user_namespace()
    configure_fabric(ns, config.strategy)
    STATE.collect = bool(config.collect)
    STATE.timeline_steps = config.steps if config.timeline else 0
    STATE.calls_before = snapshot_jitted_calls(ns)


def _strategy(ns: dict[str, Any]) -> Any:
    fabric = ns.get("fabric")
    return getattr(fabric, "strategy", None) if fabric is not None else None


def _jitted_objects(ns: dict[str, Any]) -> dict[str, Any]:
    from thunderviz.thunder.hooks import is_jitted

    found = {}
    for name, obj in list(ns.items()):
        if name.startswith("_") or isinstance(obj, (int, float, str, bytes, type(None))):
            continue
        try:
            if is_jitted(obj):
                found[name] = obj
        except Exception:
            continue
    return found


def _strategy_modules(ns: dict[str, Any]) -> list[tuple[str, Any]]:
    return list(getattr(_strategy(ns), "thunder_modules", None) or [])


def _calls(obj: Any) -> int:
    from thunderviz.thunder.hooks import call_count

    return call_count(obj)


def snapshot_jitted_calls(ns: dict[str, Any]) -> dict[int, int]:
    """Call counts of every jitted object (namespace and strategy), so ``collect`` can tell what ran this cell;
    also remembers where the strategy's decision log ends."""
    STATE.decisions_before = len(getattr(_strategy(ns), "decisions", None) or [])
    counts = {id(obj): _calls(obj) for obj in _jitted_objects(ns).values()}
    for _, module in _strategy_modules(ns):
        counts[id(module)] = _calls(module)
    return counts


def forget_unreachable_modules(ns: dict[str, Any]) -> int:
    """Drop the strategy's entries for modules nothing else holds any more; returns how many.

    Why: the strategy lists every module set up through it (``thunder_modules``), so a notebook that runs
    ``model = fabric.setup(Model())`` in each cell kept every earlier model, its compiled traces and caches alive
    (measured: 17-18 MB per cell per rank). A module whose only reference is that list can never be called again,
    so no later report needs it. Runs after the report data was gathered, so a module set up and dropped within
    one cell is still reported.
    """
    modules = getattr(_strategy(ns), "thunder_modules", None)
    if not modules:
        return 0
    # a module only the list holds has two references here: the entry's tuple, and getrefcount's argument
    keep = [entry for entry in modules if sys.getrefcount(entry[1]) > 2]
    dropped = len(modules) - len(keep)
    if dropped:
        modules[:] = keep
    return dropped


def _memory() -> dict[str, Any]:
    import psutil

    memory: dict[str, Any] = {"rss_bytes": psutil.Process().memory_info().rss}
    if STATE.setup is not None and STATE.setup.backend == "nccl":
        import torch

        memory["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        memory["cuda_allocated_bytes"] = int(torch.cuda.memory_allocated())
    return memory


def _targets(ns: dict[str, Any], calls_before: dict[int, int]) -> list[tuple[str, Any]]:
    """What this cell set up through the strategy (cases 1 and 3) or called (those, and case 2's jitted
    functions); objects from earlier cells that did not run again are not re-captured.

    Objects are told apart by their compile data: Fabric's wrapper forwards attribute lookups to the
    ThunderModule inside, so ``model`` and the strategy's module are one compiled object, captured once.
    """
    from thunderviz.thunder.hooks import compile_key as key
    from thunderviz.thunder.hooks import has_traces

    targets: list[tuple[str, Any]] = []
    seen: set[int] = set()

    for name, module in _strategy_modules(ns):
        if key(module) in seen:
            continue
        if id(module) not in calls_before or _calls(module) > calls_before[id(module)]:
            seen.add(key(module))
            targets.append((name, module))
    for name, obj in _jitted_objects(ns).items():
        if key(obj) in seen:
            continue
        if not has_traces(obj):
            continue
        if _calls(obj) > calls_before.get(id(obj), 0):
            seen.add(key(obj))
            targets.append((name, obj))
    return targets


def collect(
    ns: dict[str, Any], calls_before: dict[int, int], *, keep_bundles: bool, by_object: dict[int, Any] | None = None
) -> ReportData:
    """What the report needs from this rank: this cell's decisions, traces, ledgers, memory.

    A part that cannot be gathered is named in ``problems`` instead of failing the cell that already ran.
    ``by_object`` receives each captured bundle under the id of the object's compile data (the timeline names
    its collectives from them instead of capturing the traces again).
    """
    rank = STATE.setup.rank if STATE.setup is not None else None
    result: ReportData = {
        "rank": rank,
        "host": socket.gethostname(),
        "memory": _memory(),
        "step_memory": memory_measure.cell_finished(),
        "decisions": [],
        "bundles": {},
        "ledgers": {},
        "problems": [],
    }
    # only this cell's decisions: the log of a Fabric reused across cells keeps growing
    result["decisions"].extend(list(getattr(_strategy(ns), "decisions", None) or [])[STATE.decisions_before :])
    try:
        targets = _targets(ns, calls_before)
    except Exception:
        result["problems"].append("could not list the traced objects:\n" + traceback.format_exc())
        return result
    if not targets:
        return result
    _publish({PHASE_DATA_KEY: "collecting"})
    try:
        from thunderviz.thunder.capture import capture
        from thunderviz.thunder.hooks import compile_key
        from thunderviz.trace.ledger import ledger_from_bundle
    except ImportError as exc:
        result["problems"].append(f"the trace model is not available in this build ({exc}); traces were not captured")
        return result
    for name, obj in targets:
        try:
            bundle = capture(obj, name, rank=rank)
            result["ledgers"][name] = ledger_from_bundle(bundle)
            if by_object is not None:
                by_object[compile_key(obj)] = bundle
            if keep_bundles:
                result["bundles"][name] = bundle
        except Exception:
            result["problems"].append(f"capturing {name!r} failed:\n" + traceback.format_exc())
    return result


def check_process_group(timeout_s: float) -> bool:
    """True when every rank still answers a barrier; after a failed cell this tells whether the group is usable."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return False
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
        else:
            dist.barrier()
        return True
    except Exception:
        return False


def reset() -> None:
    """An in-place restart, for clusters whose engines we cannot replace: leave the process group, empty the
    namespace (``%reset``), forget the strategy. ``set_up`` follows."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    from IPython import get_ipython

    get_ipython().reset(new_session=False)
    STATE.fabric = STATE.fabric_spec = None
    STATE.calls_before = {}
    STATE.decisions_before = 0


def _publish(data: dict[str, Any]) -> None:
    from ipyparallel.datapub import publish_data

    publish_data(data)


def _after_user_cell(result: Any) -> None:
    """The ``post_run_cell`` hook: gather the report data and send it with the cell's own output.

    Why a hook: it runs inside the cell's execution, before the reply, so the data reaches the kernel with the
    reply and a warm cell costs one message per rank, not two. It also snapshots call counts for the next cell.
    Only user cells trigger it: our own calls arrive by ``apply``, which runs no cell.
    """
    ns = _user_namespace()
    data: ReportData | None = None
    succeeded = bool(getattr(result, "success", False))
    recorder, timeline_problems = _stop_timeline(failed=not succeeded)
    captured: dict[int, Any] = {}
    try:
        if succeeded and STATE.collect:
            data = collect(ns, STATE.calls_before, keep_bundles=True, by_object=captured)
        forget_unreachable_modules(ns)
        STATE.calls_before = snapshot_jitted_calls(ns)
    except Exception:
        rank = STATE.setup.rank if STATE.setup is not None else None
        data = {"rank": rank, "problems": ["collecting after the cell failed:\n" + traceback.format_exc()]}
    if STATE.timeline_steps or recorder is not None:
        # sent also for a cell that raised: what ran before the error, for the partial report
        data = data if data is not None else {"rank": STATE.setup.rank if STATE.setup is not None else None}
        data.update(_finish_timeline(recorder, failed=not succeeded, bundles=captured, problems=timeline_problems))
    if data is not None:
        _publish({REPORT_DATA_KEY: data})


def _before_user_cell(_info: Any) -> None:
    """The ``pre_run_cell`` hook: with ``--timeline``, start recording this rank just before the user's code."""
    memory_measure.cell_started(_user_namespace)
    if not STATE.timeline_steps:
        return
    from thunderviz.ranks.timeline_rank import start_cell_recording

    fabric = _user_namespace().get("fabric")
    STATE.recorder, STATE.timeline_problems = start_cell_recording(
        STATE.timeline_steps, fabric=fabric, previous=STATE.recorder
    )


def _stop_timeline(*, failed: bool) -> tuple[Any, list[str]]:
    """Stop this cell's recording, if one runs, before anything else the post-cell hook does."""
    recorder, STATE.recorder = STATE.recorder, None
    problems, STATE.timeline_problems = STATE.timeline_problems, []
    if recorder is None:
        return None, problems
    from thunderviz.ranks.timeline_rank import stop_cell_recording

    return recorder, problems + stop_cell_recording(recorder, failed=failed)


def _finish_timeline(recorder: Any, *, failed: bool, bundles: dict[int, Any], problems: list[str]) -> dict[str, Any]:
    from thunderviz.ranks.timeline_rank import finish_cell_recording

    if recorder is not None:
        _publish({PHASE_DATA_KEY: "collecting"})
    return dict(finish_cell_recording(recorder, failed=failed, bundles=bundles, problems=problems))


def _install_report_hook() -> None:
    from IPython import get_ipython

    events = get_ipython().events
    for event, old in (("post_run_cell", STATE.hook), ("pre_run_cell", STATE.pre_hook)):
        if old is not None:
            with contextlib.suppress(ValueError):  # already gone
                events.unregister(event, old)
    events.register("post_run_cell", _after_user_cell)
    events.register("pre_run_cell", _before_user_cell)
    STATE.hook, STATE.pre_hook = _after_user_cell, _before_user_cell
