"""The one decision table: what a thunder strategy does with the object handed to ``fabric.setup``.

Both strategies, the notebook and the docs read this table; nothing else decides. ``thunder.jit.facts.inspect_object``
turns a live object into plain facts, ``decide`` maps facts + options to a ``Decision`` (pure, so every row is
unit-testable without processes or thunder), and the strategy carries the decision out.

Cases, as the design names them:
- case 1: a raw ``nn.Module`` and ``jit=True``: we ``thunder.jit`` it, then distribute it.
- case 2: a raw ``nn.Module`` and ``jit=False``: the user jits a *function* that takes the model; we distribute the
  module's parameters and thunder inserts the collectives when that function is traced.
- case 3: a module the user already jitted: distribute it in place and hand back the user's own object.

Beside *where* thunder.jit is called, the table decides *how* (``decide_executors``): which thunder executors the
strategy's own ``thunder.jit`` gets, from the device, what is installed and the user's request. It is logged as its
own row (``Action.CHOOSE_EXECUTORS``) just before the case's row.

The facts and rows are ``parallel.decision_types``; the words of each row (headlines, the communication and
checkpointing plans) are ``parallel.decision_reasons``. The facts and rows that callers import from here are
re-exported (``Action``, ``Case``, ``Decision``, ``ExecutorFacts``, ``MeshFacts``, ``ObjectFacts``, ``ObjectKind``,
``impossible``), so the table stays the one place to import a decision from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from thunderviz.errors import JitDecisionError
from thunderviz.parallel.decision_reasons import (
    case_headline,
    checkpointing_plan,
    communication_plan,
    distribute_verb,
    door_reason,
    keyword_list,
)
from thunderviz.parallel.decision_types import (
    Action,
    Case,
    Decision,
    ExecutorFacts,
    MeshFacts,
    ObjectFacts,
    ObjectKind,
    impossible,
    preparations,
)
from thunderviz.parallel.front_doors import PLUGIN_RULES, TRANSFORMERS_RANGE, PluginUse, transformers_in_range
from thunderviz.parallel.strategy_options import StrategyOptions, executor_names

__all__ = [
    "CUDA_NVFUSER",
    "CUDA_TORCHCOMPILE",
    "INDUCTOR_EXECUTORS",
    "Action",
    "Case",
    "Decision",
    "ExecutorFacts",
    "MeshFacts",
    "ObjectFacts",
    "ObjectKind",
    "decide",
    "decide_executors",
    "decide_mesh",
    "impossible",
]


def _refuse_front_door(facts: ObjectFacts, options: StrategyOptions) -> None:
    """Raise ``JitDecisionError`` for a front door the strategy cannot take, before anything runs: Dynamo objects it
    cannot adopt, thunder plugins that distribute or capture what it distributes, transformers outside the range."""
    name, door = options.strategy_name, facts.door
    if facts.kind is ObjectKind.DYNAMO:
        if door.call.startswith("thunderfx"):
            raise JitDecisionError(
                f"`fabric.setup` received `{door.call}` (thunder's Dynamo front end), but {name} needs the module"
                " itself: thunderfx splits the forward into Dynamo graphs that thunder compiles one by one, where the"
                " strategy's collectives and communication plan need the whole forward in one thunder trace, and"
                " Fabric would keep the thunderfx object, which is no module, for state_dict and attribute access."
                f" Hand `fabric.setup` the module you passed to thunderfx (`fabric.setup({facts.type_name.lower()})`):"
                f" {name} jits it with thunder itself."
            )
        raise JitDecisionError(
            f"{name}.setup_module received a module compiled with `{door.call}`. Hand it the plain module (the"
            " module you passed to torch.compile), or pass the compiled module to `fabric.setup`, which unwraps it."
        )
    if door.fabric_recompiles:
        if door.dynamo_backend != "ThunderCompiler":
            raise JitDecisionError(
                f"You compiled the module with `{door.call}`. Fabric compiles what {name} returns again, and Dynamo"
                " cannot trace into thunder's compiled module. Hand `fabric.setup` the plain module; for"
                " torch.compile's fusion inside thunder, pass"
                f" `{name}(executors=['sdpa', 'torchcompile', 'torch'])`."
            )
        if door.dynamo_options:
            given = ", ".join(f"{o}=..." for o in door.dynamo_options)
            raise JitDecisionError(
                f"You compiled the module with `torch.compile(model, backend=ThunderCompiler({given}))`. {name} jits"
                " the module with thunder.jit itself (its collectives need the whole forward in one thunder trace),"
                f" so those thunder.jit options would be ignored. Pass them to the strategy instead (`{name}({given})`)"
                " and hand `fabric.setup` the plain module."
            )
        if facts.kind is not ObjectKind.MODULE or not options.jit:
            what = (
                "`jit=False` leaves thunder.jit to your own function"
                if facts.kind is ObjectKind.MODULE
                else ("the module is already jitted")
            )
            raise JitDecisionError(
                f"You compiled the module with `{door.call}`, and {what}, so Fabric's torch.compile of the set-up"
                f" module would trace thunder's code. Hand `fabric.setup` the plain module (without torch.compile)."
            )
    for plugin in door.plugins:
        rule = PLUGIN_RULES.get(plugin)
        if rule is None or rule.use is PluginUse.KEEP:
            continue
        short = rule.spelled.rsplit(".", 1)[-1]
        distributes = plugin in ("fsdp", "ddp")
        clash = f"{name} would distribute it a second time" if distributes else f"{name} cannot distribute it so"
        alone = (
            "use thunder's plugin alone, without the strategy"
            if distributes
            else "use the plugin without the strategy (one process)"
        )
        raise JitDecisionError(
            f"This {facts.type_name} was compiled with thunder's {short} plugin (`thunder.compile(model, ...,"
            f" plugins=[{rule.spelled}(...)])`): {rule.why}. {clash}. Either compile it without that plugin"
            f" (`thunder.compile(model, recipe=..., plugins=[...])` without {short}) and let {name} distribute it,"
            f" or {alone}."
        )
    hf = facts.transformers
    if hf is not None and not transformers_in_range(hf.version):
        low, high = TRANSFORMERS_RANGE
        raise JitDecisionError(
            f"This {hf.model_class} comes from transformers {hf.version}, but thunderviz traces transformers models"
            f" with thunder 0.2.6 for transformers {low} to {high} only (outside it thunder's interpreter meets code"
            f" it cannot trace). Install a version in that range (`pip install 'thunderviz[hf]'` installs one)."
        )


def decide(facts: ObjectFacts, options: StrategyOptions) -> Decision:
    """The decision table: an object no strategy can set up is refused, a plain module is case 1 (``jit=True``) or
    case 2 (``jit=False``), a module the user jitted is case 3. Raises ``JitDecisionError`` where no choice would be
    correct."""
    _refuse_what_cannot_be_set_up(facts, options)
    if facts.kind is ObjectKind.MODULE:
        return _plain_module_row(facts, options)
    return _user_jitted_row(facts, options)


def _row(
    facts: ObjectFacts, options: StrategyOptions, case: Case, action: Action, reason: str, clear_cache: bool = False
) -> Decision:
    """A case's row: its reason, then what the front door adds, checkpointing, and the communication plan."""
    checkpointing = checkpointing_plan(options, facts, case)
    tail = door_reason(facts, options) + (f"; {checkpointing}" if checkpointing else "")
    return Decision(
        target=facts.type_name,
        case=case,
        action=action,
        options=options,
        headline=case_headline(case, options, facts),
        reason=f"{reason}{tail}; {communication_plan(options, facts)}",
        clear_cache=clear_cache,
        prepare=preparations(facts, options),
        dynamo_passthrough=facts.door.fabric_recompiles,
    )


def _refuse_what_cannot_be_set_up(facts: ObjectFacts, options: StrategyOptions) -> None:
    """Raise ``JitDecisionError`` for what no case covers: a function, a non-module, a front door the strategy cannot
    take, a module already distributed (by a thunderviz strategy or by thunder's own ``fsdp``/``ddp``)."""
    name = options.strategy_name
    if facts.kind is ObjectKind.JITTED_FUNCTION:
        raise JitDecisionError(
            f"`fabric.setup` received the jitted function {facts.type_name!r}, but {name} distributes modules. Set up"
            f" the model instead (`{name}(jit=False)`, then `model = fabric.setup(model)`) and call your jitted"
            " function with it: thunder inserts the collectives when the function is traced."
        )
    if facts.kind is ObjectKind.OTHER:
        raise JitDecisionError(
            f"`fabric.setup` received a {facts.type_name!r}, but {name} can only set up a `torch.nn.Module` or a"
            " module returned by `thunder.jit(module)`."
        )
    _refuse_front_door(facts, options)
    if facts.distributed_by_us:
        raise JitDecisionError(
            f"This {facts.type_name} was already set up by a thunderviz strategy: its parameters are already"
            " distributed. Call `fabric.setup` once per model and keep using the object it returned."
        )
    if facts.distributed_by_thunder:
        fn = f"thunder.distributed.{facts.distributed_by_thunder}"
        raise JitDecisionError(
            f"This ThunderModule was already distributed with `{fn}(...)`, so {name} would distribute it a second"
            f" time. Either hand `fabric.setup` the module before calling `{fn}`, or drop the strategy and keep"
            f" using `{fn}` yourself."
        )


def _plain_module_row(facts: ObjectFacts, options: StrategyOptions) -> Decision:
    """Case 1 (the strategy jits the module, then distributes it) or case 2 (the user's jitted function will)."""
    if options.jit:
        given = ([f"executors={list(options.executors)}"] if options.executors else []) + (
            [keyword_list(options.jit_keyword_names)] if options.jit_kwargs else []
        )
        executors = f" with {', '.join(given)}" if given else ""
        return _row(
            facts,
            options,
            Case.RAW_MODULE,
            Action.JIT_AND_DISTRIBUTE,
            f"a plain nn.Module and jit=True: call thunder.jit{executors} once, then {distribute_verb(options)} in"
            " place so model.parameters() are what the optimizer must update",
        )
    return _row(
        facts,
        options,
        Case.FUNCTION_JIT,
        Action.DISTRIBUTE_FOR_FUNCTION_JIT,
        f"jit=False: the module is not jitted here; {distribute_verb(options)} in place and tag them, so thunder"
        " inserts the collectives when the user's jitted function is traced; cached traces of jitted functions"
        " that already ran are cleared so none runs without collectives",
        clear_cache=True,
    )


def _user_jitted_row(facts: ObjectFacts, options: StrategyOptions) -> Decision:
    """Case 3, a ThunderModule the user made (thunder.jit or thunder.compile): distributed in place, never jitted
    again, so jit options given to the strategy are refused rather than ignored."""
    name = options.strategy_name

    def made_by(keyword: str = "") -> str:
        return f"`{facts.door.call}`" if facts.door.call else f"your own `thunder.jit(model, {keyword}...)` call"

    if options.executors is not None:
        raise JitDecisionError(
            f"You passed `executors=` to {name}, but the {facts.type_name} you set up is already jitted, and jitting"
            f" it a second time is never right. Pass the executors to {made_by('executors=')}, or hand"
            " `fabric.setup` the plain module."
        )
    if options.jit_kwargs:
        raise JitDecisionError(
            f"You passed thunder.jit arguments ({keyword_list(options.jit_keyword_names)}) to {name}, but the"
            f" {facts.type_name} you set up is already jitted, so the strategy never calls `thunder.jit` and they"
            f" would be silently ignored. Pass them to {made_by()}, or hand `fabric.setup` the plain module."
        )
    jit_note = "; jit=False changes nothing here: the module is already jitted" if not options.jit else ""
    if facts.has_run:
        return _row(
            facts,
            options,
            Case.USER_JITTED,
            Action.DISTRIBUTE_IN_PLACE,
            f"already jitted (not jitting twice) and already run: {distribute_verb(options)} in place and clear its"
            f" {facts.cached_traces} cached trace(s), which were made without collectives and could still pass"
            f" thunder's checks; the next call retraces{jit_note}",
            clear_cache=True,
        )
    return _row(
        facts,
        options,
        Case.USER_JITTED,
        Action.DISTRIBUTE_IN_PLACE,
        f"already jitted (not jitting twice): {distribute_verb(options)} in place and return the user's own"
        f" ThunderModule, so no undistributed handle is left behind{jit_note}",
    )


# -- how to jit: the executors ---------------------------------------------------------------------------------------

#: Executors whose kernels torch.compile's inductor builds: they need a C++ compiler on CPU and triton on CUDA.
INDUCTOR_EXECUTORS = frozenset({"torchcompile", "torchcompile_cat", "torchcompile_xentropy"})

#: CUDA without nvFuser: litgpt's default list less nvFuser. Measured on one H200 (torch 2.11, thunder 0.2.6),
#: GPT d=1024 x 8 layers, bf16, batch 8x1024, fwd+bwd: eager 17.0 ms / 4289 MiB, thunder's defaults 51.6 ms / 8753 MiB
#: (no fusion region, 7.5 GiB saved for backward), this list 17.7 ms / 3507 MiB (1.5 GiB saved).
CUDA_TORCHCOMPILE = ("sdpa", "torchcompile", "torch")
#: CUDA with nvFuser: litgpt's README measured sdpa + torchcompile_cat + nvFuser fastest (TinyLlama 1.1B on 8xA100:
#: 322 ms/iter against 373 for sdpa + torchcompile and 448 eager); thunder's docs pair torchcompile_cat with nvFuser.
CUDA_NVFUSER = ("sdpa", "torchcompile_cat", "nvfuser", "torch")

#: Why thunder's own defaults on CPU (bench/jit_decisions.py, 2026-12-04, 2-core machine, TinyGPT 4x128, batch 8x64,
#: AdamW, gloo): the fusion executor steps faster and saves less for backward, but compiles longer, and the CPU memory
#: the reports measure (torch's MemTracker) cannot be measured inside inductor's kernels.
_CPU_MEASURED = (
    "on CPU they are chosen by measurement (bench/jit_decisions.py, TinyGPT 4x128, AdamW, 2 ranks on 2 cores): with"
    " executors=['sdpa', 'torchcompile', 'torch'] a step takes 0.83-0.95x as long (DDP 47.6 against 57.7 ms, ZERO2"
    " BLOCK 60.7 against 67.3) and forward saves half as much for backward (21.7 against 41.2 MiB), but the first step,"
    " which a notebook cell pays on every rank, takes 16-32 s against 7 s (18-28 s more with inductor's cache cold),"
    " and torch's MemTracker, which measures every CPU peak the reports show, cannot see inside inductor's kernels;"
    " pass that list for long CPU runs (it works in every case)"
)


def _listed(names: tuple[str, ...]) -> str:
    return ", ".join(names) if names else "none"


def _fusion_note(names: Iterable[str]) -> str:
    fusing = sorted(n for n in names if n in INDUCTOR_EXECUTORS or n == "nvfuser")
    if not fusing:
        return ""
    note = (
        f"; collectives and their waits stay outside {', '.join(fusing)}'s fusion regions (thunder's torchcompile"
        " executor would take them in, where torch.compile refuses async collectives), so the communication plan's"
        " buckets and overlap are unchanged"
    )
    if "torchcompile" in fusing:
        note += f"; {REGION_CALLS}"
    return note


#: How the torchcompile regions thunderviz builds are called (``thunder.jit.direct_regions``): a reason of its own,
#: since it is where our step's host time differs from thunder's own.
REGION_CALLS = (
    "torchcompile regions are called straight into inductor's compiled graph, not through Dynamo's frame and"
    " guards each call (thunder's prologue has checked every input's shape, dtype and device; inductor asserts the"
    " strides and hands a region with other strides back to Dynamo), and not through AOTAutograd's runtime wrapper"
    " where its metadata leaves it nothing to do: on the host-bound CPU proxy the first cut DDP's step from 1.13x"
    " to 1.07x of one-process thunder.jit's and FSDP ZERO2 BLOCK's from 2.27x to 2.00x, the second ZERO2 BLOCK's"
    " from 1.78x to 1.66x (bench/host_overhead.py)"
)


def _usable(requested: tuple[str, ...], facts: ExecutorFacts) -> tuple[tuple[str, ...], list[str]]:
    """The requested names this machine can run, in order, and a sentence per name left out."""
    kept: list[str] = []
    dropped: list[str] = []
    for name in requested:
        if name not in facts.installed:
            dropped.append(f"{name} is not installed here (thunder.jit would refuse the name)")
        elif name in INDUCTOR_EXECUTORS and not facts.inductor_ok:
            dropped.append(f"{name} cannot compile here: {facts.inductor_problem}")
        else:
            kept.append(name)
    return tuple(kept), dropped


def _fusion_defaults(facts: ExecutorFacts, options: StrategyOptions, row: Callable[..., Decision]) -> Decision:
    """CUDA, nothing requested: a fusion executor, which is what makes thunder as fast as eager there."""
    if not facts.inductor_ok:
        plain = tuple(n for n in facts.defaults if n not in INDUCTOR_EXECUTORS)
        return row(
            f"executors: {_listed(plain)} (no fusion executor can compile here)",
            f"on CUDA a fusion executor is what makes thunder as fast as eager, but {facts.inductor_problem};"
            " expect about 3x eager's step and twice its memory (measured on an H200) until it is installed",
            executors=plain,
            warning=f"{options.strategy_name}: no fusion executor can compile here ({facts.inductor_problem})."
            f" Compiling with {_listed(plain)}: expect about 3x eager's step time and twice its memory.",
        )
    if "nvfuser" in facts.installed:
        return row(
            f"executors: {_listed(CUDA_NVFUSER)} (nvFuser fuses, torch.compile takes the concatenations)",
            "on CUDA with nvFuser installed: litgpt's pairing, which its README measured fastest (TinyLlama 1.1B,"
            " 8xA100: 322 ms/iter against 373 with torchcompile alone and 448 eager); thunder's docs pair"
            f" torchcompile_cat with nvFuser{_fusion_note(CUDA_NVFUSER)}",
            executors=CUDA_NVFUSER,
        )
    return row(
        f"executors: {_listed(CUDA_TORCHCOMPILE)} (nvFuser not installed; torch.compile fuses the regions)",
        "on CUDA without nvFuser, thunder's docs name torchcompile as the fuser; without a fusion executor"
        " thunder fuses nothing and rematerializes nothing: measured on an H200 (GPT d=1024 x 8 layers, bf16,"
        " batch 8x1024) 51.6 ms and 8753 MiB per step against eager's 17.0 ms and 4289 MiB; with this list 17.7 ms"
        f" and 3507 MiB{_fusion_note(CUDA_TORCHCOMPILE)}",
        executors=CUDA_TORCHCOMPILE,
    )


def _choice_row(
    action: Action, target: str, case: Case, options: StrategyOptions, headline: str, reason: str, **kw: Any
) -> Decision:
    """A row for one of the choices made beside the case's own row (executors, mesh)."""
    return Decision(target=target, case=case, action=action, options=options, headline=headline, reason=reason, **kw)


def decide_executors(facts: ExecutorFacts, options: StrategyOptions, case: Case, target: str) -> Decision:
    """How thunder.jit compiles the model: which executors, in which order, and why.

    The user's explicit ``executors=`` wins, except names this machine cannot run (not installed, or an inductor
    executor without a compiler), which are left out with a warning so that a script written on a GPU machine runs
    on a laptop. Without a request the choice follows the device: on CUDA a fusion executor (thunder without one is
    about 3x slower than eager and holds twice its memory), on CPU thunder's own defaults (measured; see
    ``_CPU_MEASURED``). Cases 2 and 3 record the user's own choice: the strategy does not call thunder.jit there.
    """

    def row(headline: str, reason: str, **kw: Any) -> Decision:
        return _choice_row(Action.CHOOSE_EXECUTORS, target, case, options, headline, reason, **kw)

    if case is Case.FUNCTION_JIT:
        return row(
            "executors: your thunder.jit's (jit=False: the strategy does not compile)",
            "jit=False: your own thunder.jit(fn, executors=...) call chooses the executors; litgpt's list"
            " (sdpa, torchcompile, nvfuser, torch) works as long as nvFuser is installed"
            f"{_fusion_note(INDUCTOR_EXECUTORS)}",
        )
    if case is Case.USER_JITTED:
        names = facts.user_jitted
        call = facts.user_call or "thunder.jit(model, executors=...)"
        whose = f"your {facts.user_call}'s" if facts.user_call else "your thunder.jit's"
        return row(
            f"executors: {_listed(names)} ({whose})",
            f"the module is already jitted: its executors are the ones your {call} call"
            f" chose ({_listed(names)}); the strategy never compiles it again{_fusion_note(names)}",
            executors=names,
        )
    if options.executors is not None:
        requested = executor_names(options.executors)
        kept, dropped = _usable(requested, facts)
        if not kept:
            kept = facts.defaults
            dropped.append(f"none of them is usable, so thunder's defaults ({_listed(kept)}) are used")
        left_out = "; ".join(dropped)
        return row(
            f"executors: {_listed(kept)} (yours" + (", some left out)" if dropped else ")"),
            f"your executors=[{_listed(requested)}], in your order"
            + (f"; left out: {left_out}" if dropped else "")
            + _fusion_note(kept),
            executors=kept,
            warning=f"{options.strategy_name}(executors={list(requested)}): {left_out}. Compiling with {_listed(kept)}."
            if dropped
            else "",
        )
    if facts.device == "cuda":
        return _fusion_defaults(facts, options, row)
    return row(
        f"executors: {_listed(facts.defaults)} (thunder's defaults on CPU: they compile fastest)",
        f"thunder's defaults ({_listed(facts.defaults)}; the torch executor runs the rest); {_CPU_MEASURED}"
        f"{_fusion_note(facts.defaults)}",
        executors=facts.defaults,
    )


# -- hybrid sharding: which ranks shard together ----------------------------------------------------------------------


def _spans(facts: MeshFacts, shard: int) -> list[int]:
    """The shard groups (by index) whose ranks sit on more than one host."""
    return [g for g in range(facts.world // shard) if len(set(facts.hosts[g * shard : (g + 1) * shard])) > 1]


def decide_mesh(facts: MeshFacts, options: StrategyOptions, target: str, case: Case) -> Decision:
    """Hybrid sharding's ``(replicas, shard_size)``: the user's ``device_mesh``, or one shard group per host.

    Why per host by default: the shard group carries every all_gather and reduce_scatter (the parameters' whole
    size, every step, several times), the replica group one all_reduce of the already reduced shards (1/shard_size
    of the gradients), so the fast intra-host link should carry the former. Ranks are laid out as
    ``init_device_mesh(device, (replicas, shard_size))`` lays them out: shard group g is ranks g*S ... g*S+S-1.

    Raises ``JitDecisionError`` when no mesh is correct: a mesh that does not multiply to the world size, or (by
    default) hosts with different numbers of ranks or with ranks that are not consecutive.
    """

    def row(headline: str, reason: str, mesh: tuple[int, int], warning: str = "") -> Decision:
        return _choice_row(Action.CHOOSE_MESH, target, case, options, headline, reason, mesh=mesh, warning=warning)

    world = facts.world
    blocks = facts.host_blocks()
    n_hosts = len(set(facts.hosts))
    where = f"{world} rank{'s' if world != 1 else ''} on {n_hosts} host{'s' if n_hosts != 1 else ''}"
    if options.device_mesh is not None:
        replicas, shard = options.device_mesh
        if replicas * shard != world:
            raise JitDecisionError(
                f"You set `{options.strategy_name}(device_mesh=({replicas}, {shard}))`: {replicas} x {shard} ="
                f" {replicas * shard} ranks, but this run has {world}. Give (replicas, shard_size) with replicas *"
                f" shard_size == {world}, or leave device_mesh out to shard within each host."
            )
        spanning = _spans(facts, shard)
        headline = f"mesh {replicas} x {shard}: shard over {shard} rank(s), replicate {replicas}x (your device_mesh)"
        if spanning:
            return row(
                headline + f" - {len(spanning)} shard group(s) span hosts",
                f"your device_mesh=({replicas}, {shard}) on {where}: shard group(s) {spanning} have ranks on more"
                " than one host, so their all_gathers and reduce_scatters cross the inter-host link; leave"
                " device_mesh out to shard within each host",
                (replicas, shard),
                warning=f"{options.strategy_name}(device_mesh=({replicas}, {shard})): shard groups {spanning} span"
                " hosts; every all_gather and reduce_scatter of theirs crosses the slower inter-host link.",
            )
        crossing = (
            "each shard group is on one host, so only the all_reduce of the reduced gradient shards crosses hosts"
            if n_hosts > 1
            else "all on one host: nothing crosses hosts (on several hosts, the shard groups should each be one host's"
            " ranks)"
        )
        return row(headline, f"your device_mesh=({replicas}, {shard}) on {where}; {crossing}", (replicas, shard))
    if blocks is None or len({n for _, n in blocks}) != 1:
        layout = ", ".join(f"rank {r}: {h}" for r, h in enumerate(facts.hosts))
        why = "their ranks are not consecutive" if blocks is None else "they run different numbers of ranks"
        raise JitDecisionError(
            f"{options.strategy_name}(sharding_strategy='{options.sharding_strategy}') shards within each host by"
            f" default, but the hosts cannot form equal shard groups: {why} ({layout}). Start the same number of"
            " consecutive ranks on each host (torchrun and ipcluster do), or give device_mesh=(replicas,"
            " shard_size) to choose the groups yourself."
        )
    shard = blocks[0][1]
    replicas = world // shard
    if replicas == 1:
        return row(
            f"mesh 1 x {shard}: one host, so hybrid sharding is FSDP over all {shard} ranks",
            f"{where}: one shard group per host means one group of every rank and no replicas; the replica"
            " all_reduce is left out (give device_mesh=(replicas, shard_size) to replicate within a host)",
            (1, shard),
        )
    return row(
        f"mesh {replicas} x {shard}: shard within each host ({shard} ranks), replicate across {replicas} hosts",
        f"{where}, {shard} per host: the shard group, which carries every all_gather and reduce_scatter, stays on"
        " each host's fast link; across hosts goes one all_reduce of each reduced gradient shard (1/"
        f"{shard} of the gradients)",
        (replicas, shard),
    )
