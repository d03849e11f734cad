"""Which strategies a plan considers, how they are ordered and chosen, and the arithmetic a plan needs: plain Python.

A *candidate* is one way to run the model: a ``StrategyOptions`` (the one option model, ``parallel.options``) at one
world size. The candidates, in the order that breaks ties (``PREFERENCE``):

    ddp, fsdp-zero2-block, fsdp-zero2-layer, fsdp-zero3-block, fsdp-zero3-layer

``choose`` takes DDP whenever it fits: it moves each gradient once (an all_reduce: 2(W-1)/W of the model per rank
per step), as many bytes as ZERO2 moves, and nothing in forward, where ZERO2 must gather before it computes (how many
all_reduces DDP issues is its bucket size's choice, not a cost to weigh against sharding). Of the FSDP candidates
that fit it takes the one with the least predicted communication *time*: ``LinkCost``, the alpha-beta model of the
ranks' link (a fixed cost per collective plus bytes over bandwidth), prices each candidate's predicted bytes and
collectives. ZERO2 moves the model's bytes (all_gather + reduce_scatter, (W-1)/W each); ZERO3 gathers every bucket
a second time in backward (3(W-1)/W); BLOCK issues one collective per block where LAYER issues one per layer. So
ZERO2 before ZERO3 (same bucketing) and BLOCK before LAYER (same sharding) hold on every link: each later one moves
at least the bytes in at least the collectives. The link decides the one pair these leave open, ZERO2-LAYER against
ZERO3-BLOCK (fewer bytes in many more collectives): on a latency-bound link (gloo on CPU, a small model) ZERO3-BLOCK
is faster, on NCCL with a large model the bytes dominate and ZERO2-LAYER is. ``NONE`` bucketing is left out: it
costs LAYER's memory with more collectives.

Past one host (``ranks_per_host`` given and a world size larger than it), hybrid candidates join
(``HYBRID_PREFERENCE``: ZERO2/ZERO3 within each host, BLOCK buckets, replicated across hosts), and ``choose`` first
minimises the bytes each host sends to the others per step (``inter_host_bytes``), the slow link, before anything
else: there the DDP-first rule gives way, because DDP's all_reduce crosses hosts with every byte of the gradients,
while hybrid's crosses with the reduced shards only once per step (see ``hybrid_communication``).

Activation checkpointing is the plan's second dimension: every candidate above also comes checkpointed per block
(``fsdp-zero3-block+ac``: each repeated block's forward under checkpointing, ``CandidateSpec.checkpointing``) when
the model has repeated blocks. What it costs is priced as time beside the communication: the checkpointed blocks'
forward computed once more in backward (``recompute_seconds``: 2 FLOPs per parameter per position, over an assumed
``COMPUTE_RATES`` of the device; attention's own FLOPs are left out, under 10% of a Llama block's at 4096
positions). ``choose`` then orders by communication plus recomputation time, so a checkpointed candidate wins only
where it is the faster one that fits, which in practice is when nothing unchecked fits.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from thunderviz.parallel.option_values import Bucketing, CheckpointPolicy, Parallelism, Sharding
from thunderviz.parallel.strategy_options import StrategyOptions, parse_options
from thunderviz.trace.wire import ring_bytes

__all__ = [
    "AC_SUFFIX",
    "COMPUTE_RATES",
    "HYBRID_PREFERENCE",
    "LINK_COSTS",
    "PREFERENCE",
    "CandidateSpec",
    "ChoiceRow",
    "Extrapolation",
    "LinkCost",
    "candidate_name",
    "candidate_specs",
    "choose",
    "extrapolate",
    "hybrid_communication",
    "inter_host_bytes",
    "link_cost",
    "parse_memory",
    "recompute_seconds",
    "smallest_fitting",
    "strategy_of",
]

#: The candidates of one world size, in the order ties are broken (see the module docstring).
PREFERENCE: tuple[str, ...] = (
    "ddp",
    "fsdp-zero2-block",
    "fsdp-zero2-layer",
    "fsdp-zero3-block",
    "fsdp-zero3-layer",
)


def _fsdp(sharding: Sharding, bucketing: Bucketing) -> tuple[Parallelism, dict[str, object]]:
    return Parallelism.FSDP, {"sharding_strategy": sharding, "bucketing_strategy": bucketing}


#: The hybrid candidates of a world size spanning several hosts (``candidate_specs(ranks_per_host=...)``), after
#: ``PREFERENCE`` in tie-breaking order. BLOCK only: LAYER's extra collectives cost more across hosts, not less.
HYBRID_PREFERENCE: tuple[str, ...] = ("hybrid-zero2-block", "hybrid-zero3-block")

_PRESETS: dict[str, tuple[Parallelism, dict[str, object]]] = {
    "ddp": (Parallelism.DDP, {}),
    "fsdp-zero2-block": _fsdp(Sharding.ZERO2, Bucketing.BLOCK),
    "fsdp-zero2-layer": _fsdp(Sharding.ZERO2, Bucketing.LAYER),
    "fsdp-zero3-block": _fsdp(Sharding.ZERO3, Bucketing.BLOCK),
    "fsdp-zero3-layer": _fsdp(Sharding.ZERO3, Bucketing.LAYER),
    "hybrid-zero2-block": _fsdp(Sharding.HYBRID_SHARD_ZERO2, Bucketing.BLOCK),
    "hybrid-zero3-block": _fsdp(Sharding.HYBRID_SHARD, Bucketing.BLOCK),
}


#: A checkpointed candidate's name is its strategy's with this suffix (``fsdp-zero3-block+ac``).
AC_SUFFIX = "+ac"


def candidate_name(options: StrategyOptions) -> str:
    """``ddp`` / ``fsdp-zero3-block`` / ``fsdp-zero3-block+ac``: the name a candidate (and a run with these options)
    goes by; ``+ac`` when some modules run under activation checkpointing."""
    ac = AC_SUFFIX if options.activation_checkpointing_policy is not None else ""
    if options.parallelism is Parallelism.DDP:
        return f"ddp{ac}"
    family = "hybrid" if options.hybrid else "fsdp"
    level, bucketing = options.sharding_strategy.level.value.lower(), options.bucketing_strategy.value.lower()
    return f"{family}-{level}-{bucketing}{ac}"


def strategy_of(name: str) -> str:
    """A candidate's strategy without its checkpointing (``fsdp-zero3-block+ac`` -> ``fsdp-zero3-block``)."""
    return name.removesuffix(AC_SUFFIX)


@dataclass(frozen=True)
class CandidateSpec:
    """One candidate before it is predicted: its name, its options and its world size; ``checkpointing``: its
    options checkpoint every repeated block (the name ends in ``AC_SUFFIX``)."""

    name: str
    options: StrategyOptions
    world_size: int
    checkpointing: bool = False

    @property
    def preference(self) -> int:
        return _ORDER.index(strategy_of(self.name))

    @property
    def mesh(self) -> tuple[int, int] | None:
        """A hybrid candidate's ``(replicas, shard_size)``."""
        return self.options.device_mesh if self.options.hybrid else None


_ORDER = PREFERENCE + HYBRID_PREFERENCE


def candidate_specs(
    world_sizes: Iterable[int],
    names: Sequence[str] | None = None,
    ranks_per_host: int | None = None,
    checkpoint: CheckpointPolicy | None = None,
) -> list[CandidateSpec]:
    """Every candidate (``names``, default ``PREFERENCE``, plus ``HYBRID_PREFERENCE`` when ``ranks_per_host`` is
    given, and each of them again checkpointed, ``+ac``, when ``checkpoint`` says which modules are the blocks) at
    every world size, world sizes in the order given. A hybrid candidate exists at a world size that is a multiple
    (> 1) of ``ranks_per_host``: its mesh is ``(world // ranks_per_host, ranks_per_host)``.

    Raises:
        ValueError: a world size below 1, a name that is not a candidate, a hybrid name without ``ranks_per_host``,
            or a ``+ac`` name without ``checkpoint`` (a model without repeated blocks).
    """
    specs = []
    sizes = list(dict.fromkeys(int(w) for w in world_sizes))
    if not sizes:
        raise ValueError("plan(world_sizes=()): give at least one world size, e.g. world_sizes=(2, 8)")
    if ranks_per_host is not None and ranks_per_host < 1:
        raise ValueError(f"plan(ranks_per_host={ranks_per_host}): give the number of ranks on each host (>= 1)")
    if names is None:
        names = PREFERENCE + (HYBRID_PREFERENCE if ranks_per_host else ())
        if checkpoint is not None:
            names = names + tuple(n + AC_SUFFIX for n in names)
    for name in names:
        if strategy_of(name) not in _PRESETS:
            known = ", ".join(_ORDER)
            raise ValueError(f"{name!r} is not a candidate; the candidates are {known}, each also with {AC_SUFFIX}")
        if name.endswith(AC_SUFFIX) and checkpoint is None:
            raise ValueError(
                f"{name!r} checkpoints every repeated block, and this model has none the plan can find"
                " (a ModuleList of two or more blocks); plan it without the suffix"
            )
        if strategy_of(name) in HYBRID_PREFERENCE and not ranks_per_host:
            raise ValueError(
                f"{name!r} shards within each host: give plan(..., ranks_per_host=N) so the plan knows the hosts"
            )
    for w in sizes:
        if w < 1:
            raise ValueError(f"plan(world_sizes=...): a world size must be >= 1, got {w}")
        for name in names:
            parallelism, preset = _PRESETS[strategy_of(name)]
            if strategy_of(name) in HYBRID_PREFERENCE:
                if w <= ranks_per_host or w % ranks_per_host:  # type: ignore[operator]
                    continue  # one host (plain FSDP), or hosts that cannot hold equal shard groups
                preset = {**preset, "device_mesh": (w // ranks_per_host, ranks_per_host)}  # type: ignore[operator]
            ac = name.endswith(AC_SUFFIX)
            if ac:
                preset = {**preset, "activation_checkpointing_policy": checkpoint}
            specs.append(CandidateSpec(name, parse_options(parallelism, preset), w, ac))
    return specs


# -- communication ---------------------------------------------------------------------------------------------


def inter_host_bytes(comm_bytes: int, world_size: int, ranks_per_host: int | None) -> int:
    """What one host sends to the others per step for a candidate whose collectives all run over every rank.

    A ring over ranks laid out host by host leaves each host over exactly one link, which carries one chunk per
    ring step, so a host sends what one rank sends (``comm_bytes``); within one host nothing crosses.
    """
    if not ranks_per_host or world_size <= ranks_per_host:
        return 0
    return comm_bytes


def hybrid_communication(
    shard_comm_bytes: int, shard_collectives: int, reduced_bytes: int, reductions: int, replicas: int, shard: int
) -> tuple[int, int, int]:
    """(bytes one rank sends per step, collectives per step, bytes one host sends to the others per step) of
    hybrid sharding on a ``(replicas, shard)`` mesh, from FSDP of the same level on ``shard`` ranks (its bytes and
    collectives, and the input bytes and number of its reduce_scatters).

    Within the host everything is that FSDP's; then each reduced shard (``reduced_bytes / shard``) is all-reduced
    over the ``replicas`` ranks holding it: 2(R-1)/R of it per rank, and a host's ``shard`` ranks each lead one
    replica ring out of the host, so the host sends 2(R-1)/R of the reduced gradients: about the gradients once,
    where FSDP across hosts sends the model twice (ZERO2) or three times (ZERO3).
    """
    per_rank = ring_bytes("all_reduce", reduced_bytes // shard, replicas)
    return shard_comm_bytes + per_rank, shard_collectives + reductions, shard * per_rank


@dataclass(frozen=True)
class LinkCost:
    """The alpha-beta model of the ranks' link: each collective costs ``latency_s`` plus its bytes over
    ``bytes_per_s``.

    Communication is priced by time, not bytes, because per collective cost decides between candidates that trade
    bytes for collectives (ZERO2-LAYER sends less than ZERO3-BLOCK in three times the collectives). ``latency_s``
    is what one collective adds to a training step, the framework's work around it included, not the wire latency.
    """

    latency_s: float
    bytes_per_s: float

    def __post_init__(self) -> None:
        if not (self.latency_s >= 0 and self.bytes_per_s > 0):
            raise ValueError(
                f"LinkCost(latency_s={self.latency_s}, bytes_per_s={self.bytes_per_s}): the latency must be >= 0"
                " seconds and the bandwidth > 0 bytes per second"
            )

    def seconds(self, comm_bytes: int, collectives: int) -> float:
        """Predicted time one rank spends communicating per step: ``collectives`` x latency + bytes / bandwidth."""
        return collectives * self.latency_s + comm_bytes / self.bytes_per_s


#: The links a plan prices communication with, by the ranks' device.
#:
#: - ``cpu`` (gloo over loopback), measured on this project's 2-core machines: one more collective in a thunder
#:   step costs 0.25 to 0.43 ms at world 2 on an idle machine, 1 to 5 ms on a slow one (a LAYER step minus the
#:   BLOCK step of the same sharding, timed side by side, over the extra collectives; ``bench/memory_plan.py``),
#:   and a 16 MiB ``all_gather_into_tensor`` moves about 0.7 GB/s per rank. Only the ratio of the two decides a
#:   choice, and a costlier collective only favours ZERO3-BLOCK over ZERO2-LAYER more.
#: - ``cuda`` (NCCL) is assumed, not measured here (no GPU): 20 us per collective and 100 GB/s per rank, an
#:   NVLink node's order of magnitude; across hosts the bandwidth is lower (give ``plan(link=...)``).
LINK_COSTS: dict[str, LinkCost] = {
    "cpu": LinkCost(latency_s=300e-6, bytes_per_s=0.7e9),
    "cuda": LinkCost(latency_s=20e-6, bytes_per_s=100e9),
}


#: FLOPs per second a rank computes, assumed (not measured here) to price recomputation: on CUDA an A100's 312 TFLOP/s
#: dense bf16 at half utilisation (what large training runs report as model FLOPs utilisation); on CPU 50 GFLOP/s.
COMPUTE_RATES: dict[str, float] = {"cpu": 50e9, "cuda": 156e12}


def recompute_seconds(parameters: int, positions: int, device: str) -> float:
    """What activation checkpointing adds to a step: the checkpointed modules' forward once more, 2 FLOPs per
    parameter per position (``positions``: tokens, or rows, one rank computes per step), at ``COMPUTE_RATES``."""
    return 2 * parameters * positions / COMPUTE_RATES[device]


def link_cost(device: str) -> LinkCost:
    """The link ``LINK_COSTS`` assumes for ranks on ``device`` (``"cpu"`` or ``"cuda"``)."""
    try:
        return LINK_COSTS[device]
    except KeyError:
        raise ValueError(f"no link cost for device {device!r}; the devices are {', '.join(LINK_COSTS)}") from None


# -- choosing ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChoiceRow:
    """What ``choose`` reads of one predicted candidate (``comm_seconds``: ``LinkCost.seconds`` of its bytes and
    collectives)."""

    name: str
    world_size: int
    peak_bytes: int
    comm_bytes: int
    collectives: int
    comm_seconds: float
    checkpointing: bool = False
    #: what one host sends to the others per step (0 on one host; ``inter_host_bytes``, ``hybrid_communication``)
    inter_host_bytes: int = 0
    #: what checkpointing adds to a step (``recompute_seconds``; 0 without it)
    recompute_seconds: float = 0.0

    def fits(self, budget: int | None) -> bool:
        return budget is None or self.peak_bytes <= budget

    def sort_key(self) -> tuple[int, int, float, int, int, int]:
        sharded = int(self.name != "ddp")
        return (
            self.inter_host_bytes,
            sharded,
            self.comm_seconds + self.recompute_seconds,
            self.comm_bytes,
            _ORDER.index(strategy_of(self.name)),
            int(self.checkpointing),
        )


def choose(rows: Sequence[ChoiceRow], budget: int | None, world_size: int | None = None) -> int | None:
    """Index of the candidate to run: among those of ``world_size`` (default: every world size) that fit ``budget``,
    the one sending the fewest bytes between hosts (all equal on one host), then DDP, else the one with the least
    predicted communication time plus the recomputation checkpointing costs (ties: fewer bytes, then ``PREFERENCE``,
    then unchecked first; see the module docstring); None when none fits. Plain DDP alone comes before every sharded
    candidate; ``ddp+ac`` is weighed by its time like the sharded ones."""
    fitting = [i for i, r in enumerate(rows) if r.fits(budget) and (world_size is None or r.world_size == world_size)]
    if not fitting:
        return None
    return min(fitting, key=lambda i: rows[i].sort_key())


def smallest_fitting(rows: Sequence[ChoiceRow], world_size: int | None = None) -> int | None:
    """Index of the candidate with the smallest predicted peak (what the budget must be at least for any to fit)."""
    pool = [i for i, r in enumerate(rows) if world_size is None or r.world_size == world_size]
    return min(pool, key=lambda i: (rows[i].peak_bytes, rows[i].sort_key())) if pool else None


# -- a memory budget as people write it --------------------------------------------------------------------------

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_memory(value: int | float | str, what: str = "memory_per_rank") -> int:
    """Bytes from ``80 * 2**30``, ``"80GiB"``, ``"80 GB"`` (decimal) or ``"512MiB"``.

    Raises:
        ValueError: not a positive size, or an unknown unit (the message lists the units).
    """
    if isinstance(value, bool):
        raise ValueError(f"{what}={value!r}: give bytes (an int) or a size such as '80GiB'")
    if isinstance(value, (int, float)):
        n = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(
                f"{what}={value!r}: expected a number and a unit, e.g. '80GiB', '40 GB' or '512MiB'"
                f" (units: {', '.join(u for u in ('B', 'KB', 'MB', 'GB', 'TB', 'KiB', 'MiB', 'GiB', 'TiB'))})"
            )
        n = float(m.group(1)) * _UNITS[unit]
    else:
        raise ValueError(f"{what}={value!r}: give bytes (an int) or a size such as '80GiB'")
    if not math.isfinite(n) or n <= 0:
        raise ValueError(f"{what}={value!r}: a memory budget must be a positive size")
    return int(n)


# -- extrapolation over repeated blocks ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Extrapolation:
    """Affine extrapolation of per-rank quantities over the number of repeated blocks.

    ``values[k]`` are the quantities (category -> bytes, collectives...) measured on the model cut to its first ``k``
    blocks; with two counts ``k0 < k1`` every quantity is ``v(k0) + (n - k0) * (v(k1) - v(k0)) / (k1 - k0)``. Why
    that is exact for a transformer, and from which ``k0``: see ``thunder.memory.rehearsal`` (the proof is a test that
    rehearses a small model whole and compares byte for byte).
    """

    values: Mapping[int, Mapping[str, int]]

    def at(self, n: int) -> dict[str, int]:
        (k0, v0), (k1, v1) = sorted(self.values.items())[:2]
        keys = set(v0) | set(v1)
        out = {}
        for key in keys:
            a, b = v0.get(key, 0), v1.get(key, 0)
            step, rem = divmod((b - a) * (n - k0), k1 - k0)
            if rem:
                raise ValueError(f"extrapolating {key!r} from {k0} and {k1} blocks to {n} is not a whole number")
            out[key] = a + step
        return out


def extrapolate(values: Mapping[int, Mapping[str, int]], n: int) -> dict[str, int]:
    """``Extrapolation(values).at(n)``; ``values`` holds exactly two block counts."""
    if len(values) != 2:
        raise ValueError(f"extrapolate: needs quantities at exactly two block counts, got {sorted(values)}")
    return Extrapolation(values).at(n)
