"""The kernel <-> rank protocol: names come from the strategy registry, and messages survive pickling."""

from __future__ import annotations

import pickle

import pytest

from thunderviz.cell.failures import RankUsageError
from thunderviz.cell.protocol import CellConfig, RankSetup, StrategySpec
from thunderviz.parallel.option_values import Sharding
from thunderviz.parallel.strategy_options import REGISTERED_STRATEGIES, StrategyOptions


@pytest.mark.parametrize("kind", list(REGISTERED_STRATEGIES))
def test_every_registered_strategy_name_is_a_valid_spec(kind: str) -> None:
    spec = StrategySpec(kind)
    entry = REGISTERED_STRATEGIES[kind]
    assert isinstance(spec.options, StrategyOptions) and spec.options.parallelism is entry.parallelism
    assert spec.kind == kind and spec.fabric_name is None
    assert spec.describe() == f"{kind} ({spec.options.summary()})"
    assert StrategySpec("thunder_fsdp_zero3").options.sharding_strategy is Sharding.ZERO3


def test_fabric_own_strategies_are_named_not_parsed() -> None:
    spec = StrategySpec("fabric", {"name": "ddp"})
    assert spec.options is None and spec.fabric_name == "ddp" and spec.describe() == "fabric ddp"


def test_bad_options_fail_in_the_kernel_naming_the_fix() -> None:
    """Parsed where the spec is made, before anything is sent to a rank; never forwarded to thunder.jit."""
    with pytest.raises(RankUsageError, match=r"choose one of 'ZERO2', 'ZERO3'"):
        StrategySpec("thunder_fsdp", {"sharding_strategy": "zero9"})
    with pytest.raises(RankUsageError, match=r"Did you mean `bucket_size_in_mb`"):
        StrategySpec("thunder_ddp", {"bucket_size_mb": 5})
    with pytest.raises(RankUsageError, match="is not an option of ThunderFSDPStrategy"):
        StrategySpec("thunder_fsdp", {"disable_torch_autograd": True})


def test_an_unknown_strategy_names_the_choices() -> None:
    with pytest.raises(RankUsageError, match=r"use one of thunder_fsdp, .*fabric"):
        StrategySpec("thunder_zero")


def test_messages_pickle_as_they_cross_to_the_ranks() -> None:
    setup = RankSetup(
        rank=1,
        local_rank=1,
        world_size=2,
        local_world_size=2,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=29500,
        backend="gloo",
        timeout_s=5.0,
        threads=1,
        socket_ifname="lo",
    )
    config = CellConfig(strategy=StrategySpec("thunder_ddp", {"jit": False}), collect=False)
    assert pickle.loads(pickle.dumps(setup)) == setup
    assert pickle.loads(pickle.dumps(config)) == config
    assert pickle.loads(pickle.dumps(config)).strategy.options.jit is False


RANK_SIDE_MODULES = (
    "thunderviz.rank.calls",
    "thunderviz.rank.identity",
    "thunderviz.rank.setup",
    "thunderviz.rank.fabric",
    "thunderviz.rank.cell_hooks",
    "thunderviz.rank.cell_targets",
    "thunderviz.rank.collect",
    "thunderviz.rank.state",
)


def test_rank_side_module_is_cheap_to_import_in_the_kernel() -> None:
    """The kernel imports the rank-side modules to name the calls it sends: none may load IPython, thunder or
    lightning (they load inside the calls, in the rank)."""
    import subprocess
    import sys

    modules = ", ".join(RANK_SIDE_MODULES)
    heavy = ("IPython", "thunder", "lightning", "ipyparallel")
    code = f"import sys, {modules}; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_calls_the_kernel_sends_keep_their_names() -> None:
    """``engine.py`` and ``warm_pool.py`` name these through ``rank.calls``; each crosses by reference to the
    module of its job."""
    from thunderviz.rank import calls as inside_rank

    homes = {name: getattr(inside_rank, name).__module__ for name in inside_rank.__all__}
    assert homes == {
        "identify": "thunderviz.rank.identity",
        "bind_rendezvous": "thunderviz.rank.setup",
        "set_up": "thunderviz.rank.setup",
        "check_process_group": "thunderviz.rank.setup",
        "reset": "thunderviz.rank.setup",
        "warm_up": "thunderviz.rank.setup",
        "prepare_cell": "thunderviz.rank.cell_hooks",
    }


def test_an_engine_identifies_itself_typed_and_the_answer_pickles() -> None:
    import os

    from thunderviz.pool.topology import EngineIdentity
    from thunderviz.rank.calls import identify

    identity = identify(7, "127.0.0.1", 9)
    assert isinstance(identity, EngineIdentity)
    where = (identity.engine_id, identity.pid, identity.address, identity.interface)
    assert where == (7, os.getpid(), "127.0.0.1", "lo")
    assert identity.cpus >= 1 and identity.cuda_devices >= 0
    assert pickle.loads(pickle.dumps(identity)) == identity


def test_report_data_is_typed_on_both_sides() -> None:
    from thunderviz.cell.protocol import ReportData, TimelinePart, missing_report

    assert missing_report(3, "sent nothing") == ReportData(rank=3, problems=["sent nothing"])
    assert set(TimelinePart.__annotations__) <= set(ReportData.__annotations__)
    assert {"rank", "host", "memory", "decisions", "bundles", "ledgers", "problems"} <= set(ReportData.__annotations__)


def test_the_rendezvous_socket_is_bound_to_one_address_and_kept() -> None:
    from thunderviz.pool.rendezvous import bind_listener, interface_of, route_to

    sock = bind_listener("127.0.0.1")
    try:
        address, port = sock.getsockname()
        assert address == "127.0.0.1" and port > 0
    finally:
        sock.close()
    assert route_to("127.0.0.1", 9) == ("127.0.0.1", interface_of("127.0.0.1"))
    assert interface_of("127.0.0.1") == "lo"
