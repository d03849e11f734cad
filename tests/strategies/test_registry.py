"""``Fabric(strategy="thunder_fsdp")`` works after ``import thunderviz``, which itself never imports lightning.

Each case runs in a fresh interpreter: the registration happens when lightning's registry module is imported, and
this test process imported it long ago.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(code: str) -> list[str]:
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_names_work_when_lightning_is_imported_after_thunderviz() -> None:
    out = _run(
        "import sys, thunderviz\n"
        "print('lightning' in sys.modules, 'lightning_fabric' in sys.modules)\n"
        "from lightning.fabric import Fabric\n"
        "from lightning.fabric.strategies import STRATEGY_REGISTRY\n"
        "print(sorted(n for n in STRATEGY_REGISTRY if n.startswith('thunder')))\n"
        "fsdp = Fabric(accelerator='cpu', devices=1, strategy='thunder_fsdp').strategy\n"
        "zero3 = Fabric(accelerator='cpu', devices=1, strategy='thunder_fsdp_zero3').strategy\n"
        "auto = Fabric(accelerator='cpu', devices=1, strategy='thunder_auto').strategy\n"
        "print(type(fsdp).__name__, type(zero3).__name__, zero3.options.sharding_strategy, type(auto).__name__)\n"
    )
    imported_early, names, built = out[:2], " ".join(out[2:6]), out[6:]
    assert imported_early == ["False", "False"]
    assert names == "['thunder_auto', 'thunder_ddp', 'thunder_fsdp', 'thunder_fsdp_zero3']"
    assert built == ["ThunderFSDPStrategy", "ThunderFSDPStrategy", "ZERO3", "ThunderAutoStrategy"]


def test_names_work_when_lightning_was_imported_before_thunderviz() -> None:
    out = _run(
        "from lightning.fabric import Fabric\n"
        "import thunderviz\n"
        "print(type(Fabric(accelerator='cpu', devices=1, strategy='thunder_ddp').strategy).__name__)\n"
    )
    assert out == ["ThunderDDPStrategy"]


def test_the_standalone_lightning_fabric_package_gets_the_names_too() -> None:
    pytest.importorskip("lightning_fabric")
    out = _run(
        "import thunderviz\n"
        "import lightning_fabric\n"
        "print(type(lightning_fabric.Fabric(accelerator='cpu', devices=1, strategy='thunder_ddp').strategy).__name__)\n"
    )
    assert out == ["ThunderDDPStrategy"]


def test_registration_is_idempotent_and_installs_one_finder() -> None:
    out = _run(
        "import sys, thunderviz\n"
        "from thunderviz.strategies.registry import _RegisterOnImport, register_when_lightning_loads\n"
        "register_when_lightning_loads(); register_when_lightning_loads()\n"
        "print(sum(isinstance(f, _RegisterOnImport) for f in sys.meta_path))\n"
        "import lightning.fabric.strategies as s\n"
        "register_when_lightning_loads()\n"
        "print(s.STRATEGY_REGISTRY['thunder_ddp']['description'])\n"
    )
    assert out[0] == "1" and " ".join(out[1:]) == "Lightning Thunder DDP with thunderviz's jit decisions"
