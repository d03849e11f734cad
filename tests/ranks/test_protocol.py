"""The kernel <-> rank protocol: names come from the strategy registry, and messages survive pickling."""

from __future__ import annotations

import pickle

import pytest

from thunderviz.ranks.failures import RankUsageError
from thunderviz.ranks.protocol import CellConfig, RankSetup, StrategySpec
from thunderviz.strategies.registry import STRATEGY_NAMES


@pytest.mark.parametrize("kind", [*STRATEGY_NAMES, "fabric"])
def test_every_registered_strategy_name_is_a_valid_spec(kind: str) -> None:
    assert StrategySpec(kind).to_dict() == {"kind": kind, "options": {}}


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
    config = CellConfig(strategy=StrategySpec("thunder_ddp", {"jit": False}).to_dict(), collect=False)
    assert pickle.loads(pickle.dumps(setup)) == setup
    assert pickle.loads(pickle.dumps(config)) == config


def test_rank_side_module_is_cheap_to_import_in_the_kernel() -> None:
    import subprocess
    import sys

    code = "import sys, thunderviz.ranks.inside_rank; print([m for m in ('IPython', 'thunder') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_rendezvous_socket_is_bound_to_one_address_and_kept() -> None:
    from thunderviz.ranks.rendezvous import bind_listener, interface_of, route_to

    sock = bind_listener("127.0.0.1")
    try:
        address, port = sock.getsockname()
        assert address == "127.0.0.1" and port > 0
    finally:
        sock.close()
    assert route_to("127.0.0.1", 9) == ("127.0.0.1", interface_of("127.0.0.1"))
    assert interface_of("127.0.0.1") == "lo"
