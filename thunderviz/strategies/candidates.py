"""``Candidate``: one strategy at one world size, its per-rank peak memory and communication predicted by rehearsal.

Why its own module: ``predict_candidates`` is how both ``thunderviz.plan`` (``strategies.planning``) and the auto
strategy (``strategies.auto``, at ``fabric.setup``) price a candidate, so they cannot disagree. Each candidate is
rehearsed on the meta device through the strategies' own path (``thunder.memory.rehearsal``: nothing is allocated, no
process group is needed) with the executors the ranks will use; a model whose repeated blocks number more than four is
rehearsed cut to 3 and 4 blocks and its step extrapolated moment by moment (``parallel.extrapolation`` says why that
is exact; ``tests/thunder/test_rehearsal.py`` proves it on a model rehearsed whole).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from thunderviz.parallel.extrapolation import CUTS, extrapolate_peak
from thunderviz.parallel.option_values import Parallelism
from thunderviz.parallel.plan import (
    CandidateSpec,
    ChoiceRow,
    LinkCost,
    candidate_name,
    extrapolate,
    hybrid_communication,
    inter_host_bytes,
    link_cost,
    recompute_seconds,
)
from thunderviz.parallel.strategy_options import StrategyOptions
from thunderviz.trace.memory import MemoryEstimate
from thunderviz.trace.model import TraceBundle
from thunderviz.trace.units import format_bytes

__all__ = ["CUT_BLOCKS", "WHOLE_UP_TO_BLOCKS", "Candidate", "predict_candidates", "target_executors"]

#: Models with more repeated blocks than this are rehearsed cut to ``CUT_BLOCKS`` and extrapolated.
WHOLE_UP_TO_BLOCKS = CUTS[-1]
CUT_BLOCKS = CUTS


@dataclass
class Candidate:
    """One strategy at one world size, predicted.

    ``peak_bytes`` is the predicted per-rank peak of a steady-state step, ``breakdown`` its split
    (``trace.memory.CATEGORIES``), ``comm_bytes`` what each rank sends per step (ring algorithms), ``collectives``
    how many per step, ``comm_seconds`` the time they take on the plan's link (``parallel.plan.LinkCost``), ``fits``
    whether ``peak_bytes`` is within the plan's budget (True without one). ``bundle`` holds the rehearsal's traces
    (for a model extrapolated over blocks: the cut model's).
    """

    name: str
    world_size: int
    options: StrategyOptions
    memory: MemoryEstimate
    comm_bytes: int
    collectives: int
    comm_seconds: float
    fits: bool
    checkpointing: bool = False
    bundle: TraceBundle | None = field(default=None, repr=False)
    #: what one host sends to the others per step (``parallel.plan.inter_host_bytes``); None when the plan was not
    #: told the hosts (``ranks_per_host``)
    inter_host_bytes: int | None = None
    #: the input bytes and number of the reduce_scatters per step (what a hybrid mesh all-reduces across hosts)
    reduced_bytes: int = 0
    reductions: int = 0
    #: what checkpointing adds to a step: the checkpointed blocks' forward again (``parallel.plan.recompute_seconds``)
    recompute_seconds: float = 0.0
    #: the executors the ranks' ``thunder.jit`` gets (the executor rule's choice for the plan's device)
    executors: tuple[str, ...] = ()
    #: the largest multiple of the example's batch whose peak fits the budget (``plan`` says how it is found); None
    #: when even one does not fit, or without a budget
    max_micro_batch: int | None = None
    #: the predicted peak at ``max_micro_batch`` times the example's batch (the rehearsal that checked it); None when
    #: ``max_micro_batch`` is the estimate from the per-sample bytes, not rehearsed (``plan`` checks the recommended
    #: candidate's only)
    max_micro_batch_peak: int | None = None

    @property
    def activation_checkpointing(self) -> bool:
        """Whether every repeated block's forward runs under activation checkpointing (``+ac``)."""
        return self.checkpointing

    @property
    def peak_bytes(self) -> int:
        return self.memory.peak_bytes

    @property
    def breakdown(self) -> dict[str, int]:
        return dict(self.memory.breakdown)

    def strategy(self) -> Any:
        """A new Fabric strategy with exactly these options (``ThunderFSDPStrategy`` / ``ThunderDDPStrategy``)."""
        from thunderviz.strategies.ddp import ThunderDDPStrategy
        from thunderviz.strategies.fsdp import ThunderFSDPStrategy

        cls = ThunderFSDPStrategy if self.options.parallelism is Parallelism.FSDP else ThunderDDPStrategy
        return cls.from_options(self.options)

    def row(self) -> ChoiceRow:
        return ChoiceRow(
            self.name,
            self.world_size,
            self.peak_bytes,
            self.comm_bytes,
            self.collectives,
            self.comm_seconds,
            self.checkpointing,
            self.inter_host_bytes or 0,
            self.recompute_seconds,
        )

    def describe(self) -> str:
        """``fsdp-zero2-block x8: peak 12.1 GiB (fits), sends 3.1 GiB in 66 collectives per step (~32.3 ms)``, and
        ``; 1.5 GiB per host across hosts`` when the plan knows the hosts."""
        fit = "fits" if self.fits else "does not fit"
        collectives = f"{self.collectives} collective{'' if self.collectives == 1 else 's'}"
        mesh = f" (mesh {self.options.device_mesh[0]}x{self.options.device_mesh[1]})" if self.options.hybrid else ""
        if self.inter_host_bytes is None:
            across = ""
        elif self.inter_host_bytes == 0 and not self.options.hybrid:
            across = "; one host"
        else:
            across = f"; {format_bytes(self.inter_host_bytes)} per host across hosts"
        recompute = f", recomputes ~{self.recompute_seconds * 1000:.1f} ms" if self.checkpointing else ""
        micro = ""
        if self.max_micro_batch and self.max_micro_batch_peak is not None:
            micro = f"; max micro-batch x{self.max_micro_batch}"
        elif self.max_micro_batch:
            micro = f"; max micro-batch >= x{self.max_micro_batch} (estimated, not rehearsed)"
        return (
            f"{self.name} x{self.world_size}{mesh}: peak {format_bytes(self.peak_bytes)} ({fit}), sends"
            f" {format_bytes(self.comm_bytes)} in {collectives} per step (~{self.comm_seconds * 1000:.1f} ms)"
            f"{recompute}{across}{micro}"
        )

    def __repr__(self) -> str:
        return f"<Candidate {self.describe()}>"


def predict_candidates(
    template: Any,
    specs: Sequence[CandidateSpec],
    example_input: Any,
    *,
    loss_fn: Callable[[Any], Any] | None,
    optimizer: Any,
    precision: str,
    device: str,
    budget: int | None,
    link: LinkCost | None = None,
    on_run: Callable[[int, int, str], None] | None = None,
    ranks_per_host: int | None = None,
) -> tuple[list[Candidate], str]:
    """Predict ``specs`` (in their order): rehearsed whole, or cut to ``CUT_BLOCKS`` blocks and extrapolated; and how.

    Communication is priced on ``link`` (default: ``parallel.plan.LINK_COSTS`` for ``device``). ``on_run(done,
    total, what)`` is called after each traced rehearsal. With ``ranks_per_host``, every candidate says what each
    host sends to the others; a hybrid candidate is FSDP of its level on one host's ranks (its memory exactly: the
    replica all_reduce works in place on the reduced shard) plus that all_reduce
    (``parallel.plan.hybrid_communication``).

    All of them together, so thunder traces as little as is exact (``thunder.memory.rehearsal.rehearse_all``: one trace
    per
    sharding for every bucketing and world size).
    """
    with warnings.catch_warnings():
        # thunder's import says an optional executor (TransformerEngine) is missing: nothing a plan uses or depends on,
        # and it would be the only output of a notebook cell that plans.
        warnings.filterwarnings("ignore", message="transformer_engine module not found")
        from thunderviz.thunder.compat import ensure_supported_thunder

        ensure_supported_thunder()  # imports thunder, here

    bases = {(s.name, s.world_size): _hybrid_base(s) for s in specs if s.mesh is not None}
    unique = {(s.name, s.world_size): s for s in [*(s for s in specs if s.mesh is None), *bases.values()]}
    priced = link or link_cost(device)
    rehearsal = {"loss_fn": loss_fn, "optimizer": optimizer, "precision": precision, "device": device}
    done, how = _predict_rehearsed(template, list(unique.values()), example_input, rehearsal, budget, priced, on_run)
    out = []
    for s in specs:
        if s.mesh is None:
            c = done[s.name, s.world_size]
            if ranks_per_host:
                c = dataclasses.replace(
                    c, inter_host_bytes=inter_host_bytes(c.comm_bytes, s.world_size, ranks_per_host)
                )
            out.append(c)
            continue
        base = done[bases[s.name, s.world_size].name, s.mesh[1]]
        comm, collectives, across = hybrid_communication(
            base.comm_bytes, base.collectives, base.reduced_bytes, base.reductions, *s.mesh
        )
        c = _candidate(
            s, base.memory, comm, collectives, budget, priced, base.bundle, base.reduced_bytes, base.reductions
        )
        out.append(dataclasses.replace(c, inter_host_bytes=across))
    positions = _positions(example_input)
    executors: dict[Any, tuple[str, ...]] = {}
    for i, (s, c) in enumerate(zip(specs, out, strict=True)):
        key = s.options.executors
        if key not in executors:
            executors[key] = tuple(target_executors(s.options, device)[0].executors)
        recompute = recompute_seconds(_checkpointed_parameters(template, s.options), positions, device)
        out[i] = dataclasses.replace(c, recompute_seconds=recompute, executors=executors[key])
    return out, how


def target_executors(options: StrategyOptions, device: str) -> tuple[Any, str]:
    """The executor rule's decision for the ranks' ``device`` (``thunder.executors.decided_executors``), and what it
    assumed about their machine ("" when nothing)."""
    from thunderviz.thunder.jit.executors import decided_executors

    _, how, assumed = decided_executors(options, device)
    return how, assumed


def _checkpointed_parameters(template: Any, options: StrategyOptions) -> int:
    """How many parameters the modules ``options`` checkpoint hold (0 without checkpointing)."""
    from thunderviz.parallel.checkpointing import select_checkpointed

    policy = options.activation_checkpointing_policy
    if policy is None:
        return 0
    params = {}
    for name in select_checkpointed(template, policy):
        for p in (template.get_submodule(name) if name else template).parameters():
            params[id(p)] = p.numel()
    return sum(params.values())


def _positions(example_input: Any) -> int:
    """How many positions one rank's forward computes, for pricing recomputation: an integer tensor holds token ids
    (one position each), a float tensor rows of features (every dimension but the last); the first tensor counts."""
    import torch

    inputs = example_input if isinstance(example_input, (tuple, list)) else (example_input,)
    for t in inputs:
        if isinstance(t, torch.Tensor):
            if t.dtype.is_floating_point and t.dim() >= 2:
                return t.numel() // t.shape[-1]
            return max(t.numel(), 1)
    return 1


def _hybrid_base(spec: CandidateSpec) -> CandidateSpec:
    """FSDP of a hybrid candidate's level and bucketing on its shard group's ranks: what one host runs."""
    level = spec.options.sharding_strategy.level
    options = dataclasses.replace(spec.options, sharding_strategy=level, device_mesh=None)
    return CandidateSpec(candidate_name(options), options, spec.mesh[1], spec.checkpointing)  # type: ignore[index]


def _predict_rehearsed(
    template: Any,
    specs: Sequence[CandidateSpec],
    example_input: Any,
    rehearsal: dict[str, Any],
    budget: int | None,
    priced: LinkCost,
    on_run: Callable[[int, int, str], None] | None,
) -> tuple[dict[tuple[str, int], Candidate], str]:
    """``predict_candidates`` for candidates that rehearse as they are (no hybrid): by (name, world size).
    ``rehearsal``: ``rehearse_all``'s loss_fn, optimizer, precision and device."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="transformer_engine module not found")
        from thunderviz.thunder.memory.meta_model import block_container, cut_blocks
        from thunderviz.thunder.memory.rehearsal import rehearsal_runs, rehearse_all

    names = list(dict.fromkeys(s.name for s in specs))
    by_name = {s.name: s.options for s in specs}
    sizes = sorted({s.world_size for s in specs})

    options = [by_name[n] for n in names]
    count = {"done": 0, "total": 0}

    def run(
        model: Any, capture: bool = True, what: str = "", counted: bool = False, only: Sequence[str] | None = None
    ) -> dict[tuple[str, int], Any]:
        chosen = [n for n in names if only is None or n in only]
        layouts_of = [by_name[n] for n in chosen]

        def tick(layouts: Sequence[Any], world: int) -> None:
            count["done"] += 1
            if on_run is not None:
                covered = ", ".join(n for n, o in zip(chosen, layouts_of, strict=True) if any(o is x for x in layouts))
                on_run(count["done"], count["total"], f"{covered} x{world}{what}")

        if not counted:
            count["total"] += len(rehearsal_runs(model, layouts_of, sizes))
        got = rehearse_all(
            model,
            example_input,
            options=layouts_of,
            world_sizes=sizes,
            capture_traces=capture,
            progress=tick,
            **rehearsal,
        )
        return {(n, w): r for n, per_world in zip(chosen, got, strict=True) for w, r in per_world.items()}

    found = block_container(template)
    if found is None or found[1] <= WHOLE_UP_TO_BLOCKS:
        whole = run(template)
        out = [_whole(s, whole[s.name, s.world_size], budget, priced, "rehearsed") for s in specs]
        return {(s.name, s.world_size): c for s, c in zip(specs, out, strict=True)}, "rehearsed whole"
    path, n = found
    # the traces kept for the memory view are the larger cut's: capturing the other would cost time for nothing
    cuts = {k: cut_blocks(template, k) for k in CUT_BLOCKS}
    count["total"] += sum(len(rehearsal_runs(m, options, sizes)) for m in cuts.values())  # known before the first
    cut = {k: run(m, capture=k == CUT_BLOCKS[-1], what=f" ({k} of {n} blocks)", counted=True) for k, m in cuts.items()}
    how = f"extrapolated from {path} cut to {' and '.join(map(str, CUT_BLOCKS))} of its {n} blocks"
    peaks = {
        (s.name, s.world_size): extrapolate_peak({k: cut[k][s.name, s.world_size].timeline for k in CUT_BLOCKS}, n)
        for s in specs
    }
    # the whole model only for the candidates whose cuts' steps cannot be paired moment by moment
    # (parallel.extrapolation): a whole rehearsal of a 7B model costs minutes, as much as all the cuts
    unpaired = [s.name for s in specs if peaks[s.name, s.world_size] is None]
    whole = run(template, what=" (whole model: the cuts' steps differ in shape)", only=unpaired) if unpaired else {}
    out = []
    for s in specs:
        points = {k: cut[k][s.name, s.world_size] for k in CUT_BLOCKS}
        peak = peaks[s.name, s.world_size]
        if peak is None:
            out.append(_whole(s, whole[s.name, s.world_size], budget, priced, "rehearsed whole (cuts not alike)"))
            continue
        at = extrapolate({k: _communication(r) for k, r in points.items()}, n)
        said = how + ("; some runs aligned by their ops" if peak.aligned else "")
        memory = MemoryEstimate(peak.peak_bytes, peak.breakdown, peak.groups, peak.phase, said)
        bundle = points[CUT_BLOCKS[-1]].bundle
        out.append(_candidate(s, memory, at["comm"], at["collectives"], budget, priced, bundle, at["rs"], at["rs_n"]))
    return {(s.name, s.world_size): c for s, c in zip(specs, out, strict=True)}, how


def _communication(r: Any) -> dict[str, int]:
    return {
        "comm": r.comm_bytes,
        "collectives": r.collectives,
        "rs": r.reduced_bytes,
        "rs_n": r.reductions,
    }


def _whole(spec: CandidateSpec, r: Any, budget: int | None, link: LinkCost, how: str) -> Candidate:
    memory = MemoryEstimate(r.memory.peak_bytes, r.memory.breakdown, r.memory.groups, r.memory.phase, how)
    return _candidate(spec, memory, r.comm_bytes, r.collectives, budget, link, r.bundle, r.reduced_bytes, r.reductions)


def _candidate(
    spec: CandidateSpec,
    memory: MemoryEstimate,
    comm: int,
    collectives: int,
    budget: int | None,
    link: LinkCost,
    bundle: TraceBundle | None,
    reduced_bytes: int = 0,
    reductions: int = 0,
) -> Candidate:
    fits = budget is None or memory.peak_bytes <= budget
    seconds = link.seconds(comm, collectives)
    return Candidate(
        spec.name,
        spec.world_size,
        spec.options,
        memory,
        comm,
        collectives,
        seconds,
        fits,
        spec.checkpointing,
        bundle,
        reduced_bytes=reduced_bytes,
        reductions=reductions,
    )
