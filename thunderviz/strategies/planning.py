"""``thunderviz.plan``: per-rank peak memory and communication of every candidate strategy, before a run.

Each candidate (``parallel.plan``: DDP and FSDP ZERO2/ZERO3 x BLOCK/LAYER, each also with every repeated block
checkpointed, ``+ac``, at each world size asked) is predicted by rehearsal on the meta device
(``strategies.candidates``: nothing is allocated, no process group is needed), which gives its peak with a breakdown,
what it communicates per step, and its traces. With a budget, each candidate that fits also gets the largest
micro-batch that does (``plan``).

The result, ``Plan``, is what the auto strategy (``strategies.auto``) chooses from and what the Memory views draw
(``render.memory_view``; in a notebook, ``%load_ext thunderviz`` registers it as a Plan's HTML picture).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from thunderviz.errors import PlanError
from thunderviz.parallel.option_values import CheckpointPolicy
from thunderviz.parallel.plan import (
    HYBRID_PREFERENCE,
    PREFERENCE,
    CandidateSpec,
    LinkCost,
    candidate_specs,
    choose,
    parse_memory,
    smallest_fitting,
)
from thunderviz.strategies.candidates import Candidate, predict_candidates, target_executors
from thunderviz.trace.units import format_bytes
from thunderviz.trace.workload import Workload, tensor_text

__all__ = ["Plan", "block_checkpoint_policy", "default_device", "plan"]


@dataclass
class Plan:
    """Every candidate predicted (``candidates``, world sizes in the order asked, each in ``PREFERENCE`` order), the
    budget they were checked against, and how the numbers were obtained. ``parameters``, ``batch`` and
    ``optimizer`` say what was planned (``workload``: which runs the candidates are compared with)."""

    candidates: list[Candidate]
    memory_per_rank: int | None
    device: str
    model: str
    how: str
    seconds: float
    parameters: int = 0
    batch: tuple[str, ...] = ()
    optimizer: str = ""
    #: the executors the candidates were rehearsed with, and why (the executor rule's headline and what was assumed)
    executors: str = ""

    def workload(self, world_size: int) -> Workload:
        """What the candidates at ``world_size`` would train (``trace.workload``), as a run reports its own."""
        return Workload(self.model, self.parameters, self.batch, self.optimizer, world_size)

    @property
    def world_sizes(self) -> list[int]:
        return list(dict.fromkeys(c.world_size for c in self.candidates))

    @property
    def recommended(self) -> Candidate | None:
        """What the auto strategy picks: the first world size (in the order asked) at which a candidate fits, and
        there DDP if it fits, else the one that fits with the least predicted communication time
        (``parallel.plan.choose``); None when nothing fits."""
        i = _recommended_index(self.candidates, self.memory_per_rank)
        return self.candidates[i] if i is not None else None

    def recommended_for(self, world_size: int) -> Candidate | None:
        rows = [c.row() for c in self.candidates]
        i = choose(rows, self.memory_per_rank, world_size)
        return self.candidates[i] if i is not None else None

    def candidate(self, name: str, world_size: int | None = None) -> Candidate:
        """The candidate called ``name`` (at ``world_size``; may be omitted for a plan of one world size)."""
        found = [c for c in self.candidates if c.name == name and (world_size is None or c.world_size == world_size)]
        if len(found) != 1:
            have = ", ".join(sorted({f"{c.name} x{c.world_size}" for c in self.candidates}))
            raise KeyError(f"plan.candidate({name!r}, world_size={world_size}): the plan has {have}")
        return found[0]

    def smallest_budget(self, world_size: int) -> Candidate:
        """The candidate with the smallest predicted peak at ``world_size``: the least memory per rank that works."""
        rows = [c.row() for c in self.candidates]
        i = smallest_fitting(rows, world_size)
        if i is None:
            raise KeyError(f"the plan has no candidate at world size {world_size}")
        return self.candidates[i]

    def with_budget(self, memory_per_rank: int | str | None) -> Plan:
        """The same predictions checked against another budget (bytes or ``"40GiB"``; None: no budget); the
        candidates' ``max_micro_batch`` is None unless the budget is the plan's own (plan again to find it)."""
        try:
            budget = parse_memory(memory_per_rank) if memory_per_rank is not None else None
        except ValueError as exc:
            raise PlanError(str(exc)) from None
        # the largest micro-batch was found for the plan's own budget: checking it for another takes rehearsals
        candidates = [
            dataclasses.replace(
                c,
                fits=budget is None or c.peak_bytes <= budget,
                max_micro_batch=c.max_micro_batch if budget == self.memory_per_rank else None,
                max_micro_batch_peak=c.max_micro_batch_peak if budget == self.memory_per_rank else None,
            )
            for c in self.candidates
        ]
        return dataclasses.replace(self, candidates=candidates, memory_per_rank=budget)

    def table(self) -> str:
        """The plan as text: one line per candidate, the recommended one marked."""
        pick = self.recommended
        budget = format_bytes(self.memory_per_rank) if self.memory_per_rank else "none"
        lines = [f"plan for {self.model} on {self.device} (budget per rank: {budget}; {self.how}):"]
        if self.executors:
            lines.append(f"   {self.executors}")
        groups = [("", [c for c in self.candidates if not c.checkpointing])]
        groups.append(("activation checkpointing per block:", [c for c in self.candidates if c.checkpointing]))
        for title, members in groups:
            if members and title:
                lines.append(f"   {title}")
            for c in members:
                mark = "->" if c is pick else "  "
                lines.append(f"{mark} {c.describe()}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        pick = self.recommended
        return (
            f"<Plan {self.model}: {len(self.candidates)} candidates at world sizes {self.world_sizes}, recommended"
            f" {pick.name + ' x' + str(pick.world_size) if pick else 'none (nothing fits)'}>"
        )


# -- building one ------------------------------------------------------------------------------------------------


def default_device() -> str:
    """``"cuda"`` where CUDA is available, else ``"cpu"``: the device the ranks will train on."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _device_budget(device: str) -> int | None:
    import torch

    if device == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    return None


def _template(model: Any) -> Any:
    """The model as a module (a factory is called on the meta device, so building it allocates nothing)."""
    import torch
    from torch import nn

    if isinstance(model, nn.Module):
        return model
    if callable(model):
        with torch.device("meta"):
            built = model()
        if not isinstance(built, nn.Module):
            raise PlanError(f"plan(model=...): the factory returned a {type(built).__name__}, not an nn.Module")
        return built
    raise PlanError(
        f"plan(model=...): expected an nn.Module (built on the meta device is fine) or a zero-argument factory,"
        f" got {type(model).__name__}"
    )


def plan(
    model: Any,
    example_input: Any,
    *,
    loss_fn: Callable[[Any], Any] | None = None,
    optimizer: Any = "adamw",
    precision: str = "32-true",
    world_sizes: Iterable[int] = (2,),
    memory_per_rank: int | str | None = None,
    device: str | None = None,
    candidates: Sequence[str] | None = None,
    link: LinkCost | None = None,
    progress: bool | Callable[[int, int, str], None] | None = None,
    ranks_per_host: int | None = None,
    activation_checkpointing: bool = True,
    executors: Sequence[Any] | None = None,
) -> Plan:
    """Predict, before running, every candidate strategy's per-rank peak memory and communication.

    Args:
        model: an ``nn.Module`` (built on the meta device is fine: nothing is allocated either way) or a
            zero-argument factory returning one (called on the meta device).
        example_input: what one rank's ``model(...)`` takes per step: a tensor or a tuple of arguments (meta
            tensors are fine: only shapes and dtypes are read).
        loss_fn: ``loss_fn(output) -> scalar``; default ``output.sum()`` for a tensor output.
        optimizer: ``"adamw"``, ``"sgd"`` (torch's defaults), an optimizer class, or a callable taking the
            parameters (``functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)``).
        precision: ``Fabric(precision=...)``: ``"32-true"``, ``"bf16-true"`` or ``"16-true"``.
        world_sizes: the world sizes to plan for.
        memory_per_rank: the budget per rank, in bytes or as ``"80GiB"``; default: the GPU's memory when planning
            for CUDA on a machine with one, otherwise no budget (every candidate fits).
        device: ``"cpu"`` or ``"cuda"``, the ranks' device; default CUDA where available.
        candidates: which candidates (default all of ``parallel.plan.PREFERENCE``, and ``HYBRID_PREFERENCE`` with
            ``ranks_per_host``).
        link: what a collective costs on the ranks' link (``LinkCost(latency_s, bytes_per_s)``), which prices
            communication time and so decides between candidates that trade bytes for collectives; default
            ``parallel.plan.LINK_COSTS[device]`` (measured for gloo on CPU, assumed for NCCL).
        progress: a planning takes tens of seconds (thunder traces each candidate): a text progress bar on stderr
            with one tick per traced rehearsal, naming the candidates it covers (default: in a notebook or on a
            terminal); ``False`` for none; or a callable ``(done, total, what)`` called after each one.
        ranks_per_host: how many ranks each host runs: world sizes beyond it span hosts, every candidate then says
            what each host sends to the others per step, hybrid candidates (shard within each host, replicate
            across) join, and the recommendation is the fitting candidate sending the least between hosts.
        activation_checkpointing: also plan every candidate with each repeated block's forward under activation
            checkpointing (``fsdp-zero3-block+ac``; a model without repeated blocks has none); its recomputation is
            priced as time (``parallel.plan.recompute_seconds``) beside the communication.
        executors: the executors the ranks' ``thunder.jit`` gets (names, as the strategies take them); default what
            the executor rule decides for ``device``. Planning for CUDA on a machine without it, the rule is asked
            as the CUDA ranks will ask it: triton present (a CUDA torch wheel brings it), so a fusion executor; the
            table's header says which, and why.

    Every candidate that fits reports ``max_micro_batch``: the largest multiple ``k`` of the example's batch whose
    peak fits the budget, estimated from the rehearsal's per-sample bytes (what grows with the batch: saved
    activations, temporaries, inputs). The recommended candidate's is checked by one rehearsal at ``k`` times the
    batch (every tensor input's first dimension; a ``loss_fn`` must take that batch's output); the estimate is then
    redone from the slope the two rehearsals measured (not all temporaries grow with the batch, so the first
    estimate is low) and checked again, down when the check exceeded the budget, up when it left room
    (``MICRO_BATCH_TRIES`` checks at most; the largest checked batch that fits is reported, with its peak in
    ``max_micro_batch_peak``). The other candidates keep the first estimate, unchecked (``max_micro_batch_peak`` is
    None; a lower bound in the usual case above): checking each one cost two or more rehearsals of the model, most
    of a frontier plan's time, for numbers nobody acts on but the recommended candidate's.

    Raises:
        PlanError: the model, input, loss, optimizer or precision cannot be planned (the message says why).
    """
    t0 = time.perf_counter()
    device = device or default_device()
    if device not in ("cpu", "cuda"):
        raise PlanError(f"plan(device={device!r}): plan for 'cpu' or 'cuda' ranks")
    template = _template(model)
    budget, specs = _budget_and_specs(
        template, device, memory_per_rank, world_sizes, candidates, ranks_per_host, activation_checkpointing, executors
    )
    rehearsal = {"loss_fn": loss_fn, "optimizer": optimizer, "precision": precision, "device": device}
    out, how = _predict_with_micro_batches(
        template, specs, example_input, budget, link, progress, ranks_per_host, rehearsal
    )
    decision, assumed = target_executors(specs[0].options, device)
    return Plan(
        candidates=out,
        memory_per_rank=budget,
        device=device,
        model=type(template).__name__,
        how=how,
        seconds=time.perf_counter() - t0,
        parameters=sum(p.numel() for p in template.parameters()),
        batch=_batch_text(example_input),
        optimizer=_optimizer_name(optimizer, device),
        executors=decision.headline + (f" ({assumed})" if assumed else ""),
    )


def _budget_and_specs(
    template: Any,
    device: str,
    memory_per_rank: int | str | None,
    world_sizes: Iterable[int],
    candidates: Sequence[str] | None,
    ranks_per_host: int | None,
    activation_checkpointing: bool,
    executors: Sequence[Any] | None,
) -> tuple[int | None, list[CandidateSpec]]:
    """``plan``'s budget per rank and the candidates it predicts, as its arguments ask (a bad size, world size or
    candidate name is a ``PlanError`` saying what to use)."""
    policy = block_checkpoint_policy(template)
    try:
        budget = parse_memory(memory_per_rank) if memory_per_rank is not None else _device_budget(device)
        if candidates is None and not activation_checkpointing:
            candidates = PREFERENCE + (HYBRID_PREFERENCE if ranks_per_host else ())
        specs = candidate_specs(world_sizes, candidates, ranks_per_host, policy)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    if executors is not None:
        chosen = tuple(executors)
        specs = [dataclasses.replace(s, options=dataclasses.replace(s.options, executors=chosen)) for s in specs]
    return budget, specs


def _predict_with_micro_batches(
    template: Any,
    specs: Sequence[CandidateSpec],
    example_input: Any,
    budget: int | None,
    link: LinkCost | None,
    progress: bool | Callable[[int, int, str], None] | None,
    ranks_per_host: int | None,
    rehearsal: dict[str, Any],
) -> tuple[list[Candidate], str]:
    """Every candidate predicted, with its largest micro-batch under ``budget``, and how; the progress bar ticks
    through both. What the rehearsal refuses as a ``ValueError`` becomes a ``PlanError``."""
    with _progress(progress) as tick:
        try:
            out, how = predict_candidates(
                template,
                specs,
                example_input,
                budget=budget,
                link=link,
                on_run=tick,
                ranks_per_host=ranks_per_host,
                **rehearsal,
            )
            out = _max_micro_batches(template, specs, out, example_input, budget, link, ranks_per_host, rehearsal)
        except PlanError:
            raise
        except ValueError as exc:
            raise PlanError(f"plan: {exc}") from exc
    return out, how


def block_checkpoint_policy(template: Any) -> CheckpointPolicy | None:
    """Checkpointing per block: the classes of the model's repeated blocks (None: it has none)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="transformer_engine module not found")
        from thunderviz.thunder.memory.meta_model import block_container

    found = block_container(template)
    if found is None:
        return None
    container = template.get_submodule(found[0])
    return CheckpointPolicy(classes=tuple(dict.fromkeys(type(b) for b in container.children())))


#: The categories that grow with the batch (the per-sample slope ``max_micro_batch`` starts from).
PER_SAMPLE = ("saved activations", "temporaries", "inputs")
#: How many micro-batch checks a candidate gets at most; and the largest multiple looked at.
MICRO_BATCH_TRIES = 3
MAX_MICRO_BATCH = 256


def _scaled_input(example_input: Any, k: int) -> Any:
    """The example with every tensor's first dimension ``k`` times as long (meta: only shapes are read)."""
    import torch

    def scale(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return t
        return torch.empty((t.shape[0] * k, *t.shape[1:]), dtype=t.dtype, device="meta")

    if isinstance(example_input, (tuple, list)):
        return type(example_input)(scale(t) for t in example_input)
    return scale(example_input)


def _micro_batch_estimate(peak: int, per_batch: float, budget: int) -> int:
    """The largest ``k`` with ``peak + (k - 1) * per_batch <= budget`` (at least 1, at most ``MAX_MICRO_BATCH``)."""
    if per_batch <= 0:
        return MAX_MICRO_BATCH
    return int(max(1, min(MAX_MICRO_BATCH, 1 + (budget - peak) // per_batch)))


def _max_micro_batches(
    template: Any,
    specs: Sequence[CandidateSpec],
    out: list[Candidate],
    example_input: Any,
    budget: int | None,
    link: LinkCost | None,
    ranks_per_host: int | None,
    rehearsal: dict[str, Any],
) -> list[Candidate]:
    """Each candidate with its ``max_micro_batch`` (``plan``'s docstring says how)."""
    if budget is None:
        return out
    fitting = [i for i, c in enumerate(out) if c.fits]
    slope = {i: float(sum(out[i].breakdown.get(k, 0) for k in PER_SAMPLE)) for i in fitting}
    estimate = {i: _micro_batch_estimate(out[i].peak_bytes, slope[i], budget) for i in fitting}
    recommended = _recommended_index(out, budget)
    found: dict[int, tuple[int, int]] = {}
    if recommended is not None:
        found[recommended] = (1, out[recommended].peak_bytes)
    pending = {i: estimate[i] for i in found if estimate[i] > 1}
    for _ in range(MICRO_BATCH_TRIES):
        if not pending:
            break
        by_k: dict[int, list[int]] = {}
        for i, k in pending.items():
            by_k.setdefault(k, []).append(i)
        pending = {}
        for k, members in sorted(by_k.items()):
            try:
                got, _ = predict_candidates(
                    template,
                    [specs[i] for i in members],
                    _scaled_input(example_input, k),
                    budget=budget,
                    link=link,
                    ranks_per_host=ranks_per_host,
                    **rehearsal,
                )
            except Exception as exc:  # a loss_fn bound to the example's targets, say: no larger batch is checked
                raise PlanError(
                    f"plan: the largest micro-batch was checked by rehearsing {k} x the example's batch, which"
                    f" failed ({type(exc).__name__}: {exc}). Give a loss_fn that takes any batch (the default"
                    " sums the output), or memory_per_rank=None to plan without a budget"
                ) from exc
            for i, c in zip(members, got, strict=True):
                # the slope the two rehearsals measured (what does not grow with the batch drops out), both ways
                per_batch = (c.peak_bytes - out[i].peak_bytes) / (k - 1)
                again = _micro_batch_estimate(out[i].peak_bytes, per_batch, budget)
                if c.peak_bytes <= budget:
                    found[i] = (k, c.peak_bytes)
                    if again > k:
                        pending[i] = again
                    continue
                again = min(again, k - 1)
                if again > found[i][0]:
                    pending[i] = again
    return [
        dataclasses.replace(c, max_micro_batch=found[i][0], max_micro_batch_peak=found[i][1])
        if i in found
        else dataclasses.replace(c, max_micro_batch=estimate[i])
        if i in estimate
        else c
        for i, c in enumerate(out)
    ]


def _recommended_index(candidates: Sequence[Candidate], budget: int | None) -> int | None:
    """Which candidate ``Plan.recommended`` names (the first world size, in the order asked, where one fits)."""
    rows = [c.row() for c in candidates]
    for w in dict.fromkeys(c.world_size for c in candidates):
        i = choose(rows, budget, w)
        if i is not None:
            return i
    return None


def _batch_text(example_input: Any) -> tuple[str, ...]:
    """One rank's tensor inputs as a workload spells them (``int64[2, 16]``)."""
    import torch

    inputs = example_input if isinstance(example_input, (tuple, list)) else (example_input,)
    return tuple(tensor_text(str(t.dtype), t.shape) for t in inputs if isinstance(t, torch.Tensor))


def _optimizer_name(optimizer: Any, device: str) -> str:
    """The class of the optimizer the plan rehearsed (``"adamw"`` -> ``AdamW``), built once on a meta parameter."""
    import torch

    from thunderviz.thunder.memory.meta_model import make_optimizer

    return type(make_optimizer(optimizer, [torch.nn.Parameter(torch.empty(1, device="meta"))], device)).__name__


@contextlib.contextmanager
def _progress(
    progress: bool | Callable[[int, int, str], None] | None,
) -> Iterator[Callable[[int, int, str], None] | None]:
    """``plan(progress=...)``: a callable as given; True (or None where someone watches: a notebook or a terminal) a
    tqdm text bar on stderr, closed however planning ends."""
    if callable(progress):
        yield progress
        return
    if progress is None:
        progress = "ipykernel" in sys.modules or sys.stderr.isatty()
    if not progress:
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(total=0, desc="thunderviz.plan", unit="rehearsal", file=sys.stderr, leave=True)

    def tick(done: int, total: int, what: str) -> None:
        bar.total = total
        bar.set_postfix_str(what, refresh=False)
        bar.update(done - bar.n)

    try:
        yield tick
    finally:
        bar.close()
        # Send the bar's closing newline now: left in the kernel's stderr buffer it was sent after what the cell
        # printed next (the plan's table), and the notebook showed it as an empty stderr block ending the cell.
        sys.stderr.flush()
