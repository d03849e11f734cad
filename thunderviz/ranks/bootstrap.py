"""Code that runs inside each rank process (an ipyparallel engine), called by the kernel-side ``RankEngine``.

The kernel never builds torch objects for the ranks: it sends plain dicts, and these functions turn them into a
process group, a launched ``Fabric`` and a namespace the user's cell can rely on (``fabric``, ``rank``,
``world_size``, ``device``, ``torch``, ``thunder``). After a cell they gather what the report needs, as picklable
plain data, so nothing here ever has to be importable in the kernel's IPython.
"""

from __future__ import annotations

import os
import socket
import traceback
from datetime import timedelta
from typing import Any

__all__ = [
    "RankInfo",
    "check_process_group",
    "collect",
    "configure_fabric",
    "engine_identity",
    "free_port",
    "init_rank",
    "snapshot_jitted_calls",
]

RankInfo = dict[str, Any]


def engine_identity() -> dict[str, Any]:
    """Who this engine is, so the kernel can map engines to ranks (grouped by host) and kill them by pid."""
    try:
        import torch

        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # torch broken on this host: the kernel reports it when it initialises the rank
        cuda_devices = 0
    return {"host": socket.gethostname(), "pid": os.getpid(), "cuda_devices": cuda_devices, "cpus": os.cpu_count()}


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free on this rank's host right now (rank 0 hosts the rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def init_rank(ns: dict[str, Any], info: RankInfo) -> None:
    """Set the torchrun-style environment, import torch and thunder, and join the process group.

    The process group is created here (not by Fabric) so that its timeout is ours: it is what bounds a rank that
    waits in a collective its peers never enter. Fabric then finds it initialised and reuses it.
    """
    os.environ.update(
        RANK=str(info["rank"]),
        LOCAL_RANK=str(info["local_rank"]),
        WORLD_SIZE=str(info["world_size"]),
        LOCAL_WORLD_SIZE=str(info["local_world_size"]),
        NODE_RANK=str(info["node_rank"]),
        MASTER_ADDR=str(info["master_addr"]),
        MASTER_PORT=str(info["master_port"]),
    )
    if info.get("threads"):
        os.environ["OMP_NUM_THREADS"] = str(info["threads"])
    import torch
    import torch.distributed as dist

    if info.get("threads"):
        torch.set_num_threads(int(info["threads"]))
    import thunder

    backend = info["backend"]
    if backend == "nccl":
        torch.cuda.set_device(info["local_rank"])
        device = torch.device("cuda", info["local_rank"])
    else:
        device = torch.device("cpu")
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(
        backend=backend,
        init_method=info["init_method"],
        rank=info["rank"],
        world_size=info["world_size"],
        timeout=timedelta(seconds=float(info["timeout_s"])),
    )
    ns.update(
        torch=torch,
        thunder=thunder,
        rank=info["rank"],
        local_rank=info["local_rank"],
        world_size=info["world_size"],
        device=device,
        fabric=None,
    )
    ns["_thunderviz_info"] = dict(info)
    ns["_thunderviz_fabric_spec"] = None


def _build_strategy(spec: dict[str, Any]) -> Any:
    kind = spec["kind"]
    options = dict(spec.get("options") or {})
    if kind == "thunder_fsdp":
        from thunderviz.strategies import ThunderFSDPStrategy

        return ThunderFSDPStrategy(**options)
    if kind == "thunder_ddp":
        from thunderviz.strategies import ThunderDDPStrategy

        return ThunderDDPStrategy(**options)
    if kind == "fabric":
        # One of Fabric's own registered strategies by name (e.g. "ddp"): used before ours exist, and in tests.
        return options.get("name", "ddp")
    raise ValueError(f"unknown strategy kind {kind!r}")


def configure_fabric(ns: dict[str, Any], spec: dict[str, Any] | None) -> None:
    """Put a launched ``Fabric`` for ``spec`` in the namespace; keep the existing one when the spec is unchanged,
    so objects set up in earlier cells stay attached to the same strategy."""
    if spec is None or ns.get("_thunderviz_fabric_spec") == spec:
        return
    import lightning.fabric.connector as connector
    from lightning.fabric import Fabric

    # An ipyparallel engine runs an IPython shell, so Fabric believes it is in a notebook and refuses "ddp"-style
    # strategies (it would fork workers from there). This process *is* a worker whose group was created
    # externally, which is exactly the case Fabric's check exists to allow.
    connector._IS_INTERACTIVE = False
    info = ns["_thunderviz_info"]
    fabric = Fabric(
        accelerator="cuda" if info["backend"] == "nccl" else "cpu",
        devices=info["local_world_size"],
        num_nodes=info["num_nodes"],
        strategy=_build_strategy(spec),
    )
    fabric.launch()
    ns["fabric"] = fabric
    ns["_thunderviz_fabric_spec"] = spec


def _jitted_objects(ns: dict[str, Any]) -> dict[str, Any]:
    try:
        import thunder
    except ImportError:
        return {}
    found = {}
    for name, obj in list(ns.items()):
        if name.startswith("_") or isinstance(obj, (int, float, str, bytes, type(None))):
            continue
        try:
            if thunder.compile_data(obj) is not None:
                found[name] = obj
        except Exception:
            continue
    return found


def _strategy_modules(ns: dict[str, Any]) -> list[tuple[str, Any]]:
    fabric = ns.get("fabric")
    strategy = getattr(fabric, "strategy", None) if fabric is not None else None
    return list(getattr(strategy, "thunder_modules", None) or [])


def _calls(obj: Any) -> int:
    import thunder

    try:
        stats = thunder.compile_stats(obj)
    except Exception:
        return 0
    return int(getattr(stats, "calls", 0) or 0) if stats is not None else 0


def snapshot_jitted_calls(ns: dict[str, Any]) -> dict[int, int]:
    """Call counts of every jitted object (namespace and strategy), so ``collect`` can tell what ran this cell."""
    fabric = ns.get("fabric")
    strategy = getattr(fabric, "strategy", None) if fabric is not None else None
    ns["_thunderviz_decisions_before"] = len(getattr(strategy, "decisions", None) or [])
    counts = {id(obj): _calls(obj) for obj in _jitted_objects(ns).values()}
    for _, module in _strategy_modules(ns):
        counts[id(module)] = _calls(module)
    return counts


def _memory(info: RankInfo) -> dict[str, Any]:
    import psutil

    memory: dict[str, Any] = {"rss_bytes": psutil.Process().memory_info().rss}
    if info.get("backend") == "nccl":
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
    import thunder

    targets: list[tuple[str, Any]] = []
    seen: set[int] = set()

    def key(obj: Any) -> int:
        data = thunder.compile_data(obj)
        return id(data) if data is not None else id(obj)

    for name, module in _strategy_modules(ns):
        if key(module) in seen:
            continue
        if id(module) not in calls_before or _calls(module) > calls_before[id(module)]:
            seen.add(key(module))
            targets.append((name, module))
    for name, obj in _jitted_objects(ns).items():
        if key(obj) in seen:
            continue
        stats = thunder.compile_stats(obj)
        if stats is None or stats.last_traces is None:
            continue
        if _calls(obj) > calls_before.get(id(obj), 0):
            seen.add(key(obj))
            targets.append((name, obj))
    return targets


def collect(ns: dict[str, Any], calls_before: dict[int, int], *, keep_bundles: bool) -> dict[str, Any]:
    """What the report needs from this rank, as picklable data: decisions, traces (rank 0), ledgers, memory.

    A part that cannot be gathered is named in ``problems`` instead of failing the cell that already ran.
    """
    info = ns.get("_thunderviz_info", {})
    result: dict[str, Any] = {
        "rank": info.get("rank"),
        "host": socket.gethostname(),
        "memory": _memory(info),
        "decisions": [],
        "bundles": {},
        "ledgers": {},
        "problems": [],
    }
    fabric = ns.get("fabric")
    strategy = getattr(fabric, "strategy", None) if fabric is not None else None
    # only this cell's decisions: the log of a Fabric reused across cells keeps growing
    for decision in list(getattr(strategy, "decisions", None) or [])[ns.get("_thunderviz_decisions_before", 0):]:
        try:
            result["decisions"].append(decision.to_dict())
        except Exception as exc:
            result["problems"].append(f"decision {decision!r} has no usable to_dict(): {exc}")
    try:
        targets = _targets(ns, calls_before)
    except Exception:
        result["problems"].append("could not list the traced objects:\n" + traceback.format_exc())
        return result
    if not targets:
        return result
    try:
        from thunderviz.core.collectives import ledger_from_bundle
        from thunderviz.core.traces import capture
    except ImportError as exc:
        result["problems"].append(f"the trace model is not available in this build ({exc}); traces were not captured")
        return result
    for name, obj in targets:
        try:
            bundle = capture(obj, name, rank=info.get("rank"))
            result["ledgers"][name] = ledger_from_bundle(bundle)
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


def _interactive(func: Any) -> Any:
    """Mark ``func`` to run with the rank's user namespace as its globals (ipyparallel's ``interactive``)."""
    func.__module__ = "__main__"
    return func


@_interactive
def prepare_cell(spec: Any, collect_report: bool = True) -> None:
    """Before a cell whose strategy (or collect flag) changed: configure ``fabric`` and snapshot call counts."""
    import thunderviz.ranks.bootstrap as bootstrap

    namespace = globals()
    bootstrap.configure_fabric(namespace, spec)
    namespace["_thunderviz_collect"] = bool(collect_report)
    namespace["_thunderviz_calls"] = bootstrap.snapshot_jitted_calls(namespace)


INTERNAL_MARK = "# thunderviz-internal\n"
DATA_KEY = "thunderviz_collected"
_hook: Any = None


def install_report_hook() -> None:
    """After every user cell on this rank, gather the report data and send it with the cell's own output.

    Why a ``post_run_cell`` hook: it runs inside the cell's execution, before the reply, so the data reaches the
    kernel with the reply (ipyparallel's data channel) and a warm cell costs one message per rank, not two.
    It also snapshots call counts for the next cell. Runs in the rank's IPython shell, never in the kernel's.
    """
    global _hook
    from IPython import get_ipython

    shell = get_ipython()
    if _hook is not None:
        try:
            shell.events.unregister("post_run_cell", _hook)
        except ValueError:
            pass

    def post_run_cell(result: Any) -> None:
        info = getattr(result, "info", None)
        raw = getattr(info, "raw_cell", "") or ""
        if raw.startswith(INTERNAL_MARK):
            return
        ns = shell.user_ns
        data = None
        try:
            if result.success and ns.get("_thunderviz_collect", True):
                data = collect(ns, ns.get("_thunderviz_calls", {}), keep_bundles=True)
            ns["_thunderviz_calls"] = snapshot_jitted_calls(ns)
        except Exception:
            data = {"rank": ns.get("rank"), "problems": ["collecting after the cell failed:\n" + traceback.format_exc()]}
        if data is not None:
            from ipyparallel.datapub import publish_data

            publish_data({DATA_KEY: data})

    shell.events.register("post_run_cell", post_run_cell)
    _hook = post_run_cell
