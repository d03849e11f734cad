"""The words of the decision log: a row's headline and the clauses of its reason (communication, checkpointing, the
front door), built from the facts and the options.

Why apart from the table (``parallel.decisions``): the table says which case an object is and what the strategy does;
these say it to a person, and they are long (each clause carries its mechanism and the numbers that chose the
default). ``checkpointing_plan`` also refuses a policy that selects nothing, since that is when its words would be
empty. Plain Python: no thunder.
"""

from __future__ import annotations

from thunderviz.errors import JitDecisionError
from thunderviz.parallel.checkpointing import span
from thunderviz.parallel.decision_types import Case, ObjectFacts, preparations
from thunderviz.parallel.front_doors import PLUGIN_RULES, PluginUse, Preparation
from thunderviz.parallel.option_values import (
    DEFAULT_BUCKETING,
    FIRST_BUCKET_SIZE_IN_MB,
    Bucketing,
    Parallelism,
    Sharding,
)
from thunderviz.parallel.strategy_options import StrategyOptions

__all__ = [
    "case_headline",
    "checkpointing_plan",
    "communication_plan",
    "distribute_verb",
    "door_reason",
    "keyword_list",
    "plan_headline",
]

_BLOCK_MEASURED = (
    "BLOCK is the default because it measured cheapest: on a 4-block GPT on 2 CPU ranks, about 10-12 ms of CPU per"
    " step beyond one-process thunder.jit, against 29 ms for LAYER, 36-44 ms for NONE and 21-25 ms for torch's FSDP2"
)


def plan_headline(options: StrategyOptions, facts: ObjectFacts | None = None) -> str:
    """The communication plan in a few words: ``ZERO3, 4 block buckets + root`` / ``25 MB gradient buckets``."""
    if options.parallelism is Parallelism.DDP:
        if options.bucket_size_in_mb <= 0:
            return "an all_reduce per gradient"
        return f"{options.bucket_size_in_mb:g} MB gradient buckets"
    blocks = facts.blocks if facts is not None else ()
    bucketing = options.bucketing_strategy
    if bucketing is Bucketing.BLOCK:
        n = len(blocks)
        what = f"{n} block bucket{'s' if n != 1 else ''} + root" if blocks else "1 root bucket"
    elif bucketing is Bucketing.LAYER:
        what = "a bucket per layer"
    else:
        what = "a collective per parameter"
    return f"{options.sharding_strategy}, {what}"


def case_headline(case: Case, options: StrategyOptions, facts: ObjectFacts) -> str:
    verb = "shard" if options.parallelism is Parallelism.FSDP else "replicate"
    plan = plan_headline(options, facts) + _door_headline(facts, options)
    if case is Case.RAW_MODULE:
        through = " (Dynamo passes through)" if facts.door.fabric_recompiles else ""
        return f"case 1: jit once{through}, then {verb} - {plan}"
    if case is Case.FUNCTION_JIT:
        return f"case 2: {verb} in place for your jitted function - {plan}"
    cleared = f", {facts.cached_traces} cached trace(s) cleared" if facts.has_run else ""
    what = "thunder.compile'd" if facts.door.recipe else "jitted"
    return f"case 3: {verb} your {what} module in place{cleared} - {plan}"


def _door_headline(facts: ObjectFacts, options: StrategyOptions) -> str:
    """``; transformers: masks by broadcasting, use_cache off``: what a front door added, in a few words."""
    done = [str(p) for p in preparations(facts, options)]
    return f"; transformers: {', '.join(done)}" if done else ""


def communication_plan(options: StrategyOptions, facts: ObjectFacts | None = None) -> str:
    """What the strategy does with the collectives (``thunder.comm.setup``), in the words of the decision log."""
    return _collectives_plan(options, facts) + _reduce_dtype_plan(options)


def _reduce_dtype_plan(options: StrategyOptions) -> str:
    if options.reduce_dtype is None:
        return ""
    what = "reduce_scatter" if options.parallelism is Parallelism.FSDP else "all_reduce"
    return (
        f"; gradients are reduced in {options.reduce_dtype} (reduce_dtype): each bucket is cast to it before its"
        f" {what} and the result back to the gradient's dtype"
    )


def checkpointing_plan(options: StrategyOptions, facts: ObjectFacts, case: Case) -> str:
    """What ``activation_checkpointing_policy`` does to this object, in the words of the decision log ("" if unset).

    Raises ``JitDecisionError`` when the policy selects no module: a policy that silently does nothing is the bug
    this option replaced.
    """
    policy = options.activation_checkpointing_policy
    if policy is None:
        return ""
    if not facts.checkpointed:
        classes = ", ".join(facts.module_classes) or "none"
        raise JitDecisionError(
            f"You set `{options.strategy_name}(activation_checkpointing_policy={policy.describe()})`, but it selects"
            f" no module of the {facts.type_name} you set up, so nothing would be checkpointed. Its module classes"
            f" are: {classes}. Name one of them (a class, its name, or a callable `module -> bool`)."
        )
    n = len(facts.checkpointed)
    what = (
        f"activation checkpointing: {n} module{'s' if n != 1 else ''} selected by {policy.describe()}"
        f" ({span(facts.checkpointed)}) run their forward under torch.utils.checkpoint.checkpoint(...,"
        " use_reentrant=False), which thunder traces into its recompute-in-backward: forward saves their inputs only"
        " and backward recomputes the rest"
    )
    if case is Case.FUNCTION_JIT:
        return what + "; your jitted function sees the checkpointed forwards when it traces the module"
    if case is Case.USER_JITTED and facts.has_run:
        return what + (
            "; the traces it already made had no checkpointing (they are the ones cleared): the next call"
            " traces the checkpointed forwards"
        )
    return what


def _collectives_plan(options: StrategyOptions, facts: ObjectFacts | None) -> str:
    if options.parallelism is Parallelism.DDP:
        if options.bucket_size_in_mb <= 0:
            return (
                "communication: one all_reduce per gradient (bucket_size_in_mb=0), each issued as soon as its"
                " gradient exists and waited for just before backward returns"
            )
        first = min(options.bucket_size_in_mb, FIRST_BUCKET_SIZE_IN_MB)
        return (
            f"communication: gradients packed, in the order backward produces them, into buckets of"
            f" {options.bucket_size_in_mb:g} MB (the first one {first:g} MB, as torch DDP does, so the first"
            " all_reduce starts early); one all_reduce per bucket, issued as soon as its last gradient exists and"
            " waited for just before backward returns, so it overlaps the rest of backward"
        )
    blocks = facts.blocks if facts is not None else ()
    bucketing = options.bucketing_strategy
    if bucketing is Bucketing.BLOCK:
        if blocks:
            span = blocks[0] if len(blocks) == 1 else f"{blocks[0]} ... {blocks[-1]}"
            what = (
                f"one bucket per block ({len(blocks)}: {span}, the children of the model's repeated"
                " ModuleList/Sequential) and one root bucket for the parameters outside them"
            )
        else:
            what = (
                "one root bucket holding every parameter (no repeated ModuleList/Sequential of blocks was found;"
                " LAYER gives one bucket per layer instead)"
            )
    elif bucketing is Bucketing.LAYER:
        what = "one bucket per module that owns parameters (a Linear's weight and bias)"
    else:
        what = "one bucket per parameter"
    if options.sharding_strategy.level is Sharding.ZERO3:
        sharding = (
            "ZERO3: backward gathers each bucket again from its shards, so forward releases the unsharded weights"
            " after their last use and saves shards, not unsharded weights, for backward"
        )
    else:
        sharding = "ZERO2: the unsharded parameters gathered in forward are kept for backward"
    default = f"; {_BLOCK_MEASURED}" if bucketing is DEFAULT_BUCKETING else ""
    if options.hybrid:
        return (
            f"communication: {bucketing} bucketing, {what}; within each shard group, one all_gather per bucket in"
            " forward, issued one bucket ahead of its first use and waited for right before it, and one"
            " reduce_scatter per bucket in backward, issued as soon as its last gradient exists; across the replica"
            " groups, one all_reduce of each reduced bucket shard, issued when its reduce_scatter completes (so only"
            " 1/shard_size of the gradients crosses hosts) and waited for just before backward returns;"
            f" {sharding} within the shard group{default}"
        )
    return (
        f"communication: {bucketing} bucketing, {what}; one all_gather per bucket in forward, issued one bucket"
        " ahead of its first use and waited for right before it, and one reduce_scatter per bucket in backward,"
        " issued as soon as its last gradient exists and waited for when the next bucket is issued (its input, the"
        f" bucket's unsharded gradients, is freed then: one bucket in flight, as FSDP2); {sharding}{default}"
    )


def keyword_list(names: tuple[str, ...]) -> str:
    return ", ".join(f"{n}=..." for n in names)


def distribute_verb(options: StrategyOptions) -> str:
    return (
        "shard its parameters (FSDP)" if options.parallelism is Parallelism.FSDP else "replicate its parameters (DDP)"
    )


def door_reason(facts: ObjectFacts, options: StrategyOptions) -> str:
    """What the front door adds to the reason: the recipe and plugins kept, Dynamo passed through, the transformers
    registrations (each a clause starting with "; ")."""
    door, notes = facts.door, []
    if door.recipe:
        notes.append(
            f"made by {door.call or 'thunder.compile'}: the recipe's executors, transforms and lookasides are"
            " kept, the strategy only distributes the parameters"
        )
    for plugin in door.plugins:
        rule = PLUGIN_RULES.get(plugin)
        if rule is not None and rule.use is PluginUse.KEEP:
            notes.append(f"thunder's {rule.spelled.rsplit('.', 1)[-1]} plugin is kept: {rule.why}")
    if door.fabric_recompiles:
        notes.append(
            f"you compiled it with {door.call} (thunder's Dynamo front end): the strategy jits the module with"
            " thunder.jit itself, because its collectives and communication plan need the whole forward in one"
            " thunder trace where Dynamo would split it into graphs; Fabric re-applies that torch.compile to the"
            " module setup returns, whose forward the strategy hides from Dynamo (torch._dynamo.disable), so it"
            " passes through and thunder runs the whole forward"
        )
    hf = facts.transformers
    for step in preparations(facts, options):
        if step is Preparation.MASKS_BY_BROADCASTING:
            notes.append(
                f"transformers {hf.version if hf else ''} builds attention masks with torch.vmap, which thunder's"
                " interpreter cannot trace: transformers' masking_utils._vmap_for_bhqkv is traced as the same mask"
                " built by broadcasting the batch, head, query and key indices (thunder.jit.hf, registered once per"
                " process)"
            )
        elif step is Preparation.NO_GENERATION_CACHE:
            notes.append(
                "config.use_cache was True: a training forward would build a DynamicCache, which thunder's"
                " interpreter cannot hold and training never reads, so the strategy sets model.config.use_cache ="
                " False (the generation cache is for generate(), not for a training step)"
            )
        elif step is Preparation.OUTPUT_HOOKS_BY_LEAVES:
            notes.append(
                "your jitted function calls Fabric's wrapper, so thunder traces its forward, whose hook walk over the"
                " output (apply_to_collection) deep-copies transformers' ModelOutput, a copy thunder's interpreter"
                " cannot trace: that walk is traced over the output's tensors directly, the same hooks on the same"
                " tensors (thunder.jit.hf, registered once per process)"
            )
    return "".join(f"; {n}" for n in notes)
