"""Every row of the executor rule (``decide_executors``): how thunder.jit compiles, without processes or thunder."""

from __future__ import annotations

import pytest

from thunderviz.parallel.decisions import (
    CUDA_NVFUSER,
    CUDA_TORCHCOMPILE,
    Action,
    Case,
    Decision,
    ExecutorFacts,
    decide_executors,
)
from thunderviz.parallel.strategy_options import parse_options

CPU_DEFAULTS = ("sdpa", "torchcompile_xentropy")
REGISTERED = ("python", "torch", "sdpa", "torchcompile", "torchcompile_cat", "torchcompile_xentropy")
CPU = ExecutorFacts(device="cpu", installed=REGISTERED, defaults=CPU_DEFAULTS)
CUDA = ExecutorFacts(device="cuda", installed=REGISTERED, defaults=CPU_DEFAULTS)
CUDA_NVF = ExecutorFacts(device="cuda", installed=(*REGISTERED, "nvfuser"), defaults=("sdpa", "nvfuser"))
NO_CXX = ExecutorFacts(
    device="cpu", installed=REGISTERED, defaults=CPU_DEFAULTS, inductor_ok=False, inductor_problem="no C++ compiler"
)
CUDA_NO_TRITON = ExecutorFacts(
    device="cuda", installed=REGISTERED, defaults=CPU_DEFAULTS, inductor_ok=False, inductor_problem="no triton"
)
LITGPT = ("sdpa", "torchcompile", "nvfuser", "torch")


def opts(parallelism: str = "fsdp", **given):
    return parse_options(parallelism, given)


@pytest.mark.parametrize(
    ("facts", "options", "executors", "headline", "warns"),
    [
        pytest.param(CPU, opts(), CPU_DEFAULTS, "thunder's defaults on CPU", False, id="cpu-default"),
        pytest.param(CUDA, opts(), CUDA_TORCHCOMPILE, "nvFuser not installed", False, id="cuda-no-nvfuser"),
        pytest.param(CUDA_NVF, opts("ddp"), CUDA_NVFUSER, "nvFuser fuses", False, id="cuda-nvfuser"),
        pytest.param(CUDA_NO_TRITON, opts(), ("sdpa",), "no fusion executor can compile", True, id="cuda-no-triton"),
        pytest.param(CPU, opts(executors=["torch"]), ("torch",), "executors: torch (yours)", False, id="user-wins"),
        pytest.param(
            CPU,
            opts(executors=list(LITGPT)),
            ("sdpa", "torchcompile", "torch"),
            "(yours, some left out)",
            True,
            id="litgpt-list-without-nvfuser",
        ),
        pytest.param(CUDA_NVF, opts(executors=list(LITGPT)), LITGPT, "(yours)", False, id="litgpt-list-with-nvfuser"),
        pytest.param(
            NO_CXX, opts(executors=["torchcompile", "torch"]), ("torch",), "some left out", True, id="no-compiler"
        ),
        pytest.param(NO_CXX, opts(executors=["nvfuser"]), CPU_DEFAULTS, "some left out", True, id="nothing-usable"),
    ],
)
def test_case_1_executors(facts, options, executors, headline, warns):
    d = decide_executors(facts, options, Case.RAW_MODULE, "Net")
    assert d.action is Action.CHOOSE_EXECUTORS and d.case is Case.RAW_MODULE
    assert d.executors == executors
    assert d.headline.startswith("executors: ") and headline in d.headline
    assert bool(d.warning) is warns
    if warns:
        assert "Compiling with " + ", ".join(executors) in d.warning
    if any(e.startswith("torchcompile") or e == "nvfuser" for e in executors):
        assert "collectives and their waits stay outside" in d.reason
    assert ("called straight into inductor's compiled graph" in d.reason) is ("torchcompile" in executors)
    assert Decision.from_dict(d.to_dict()).executors == d.executors


def test_not_installed_names_the_executor_and_why():
    d = decide_executors(CPU, opts(executors=list(LITGPT)), Case.RAW_MODULE, "GPT")
    assert "nvfuser is not installed here" in d.warning and "nvfuser is not installed here" in d.reason
    assert d.warning.startswith("ThunderFSDPStrategy(executors=['sdpa', 'torchcompile', 'nvfuser', 'torch'])")


def test_no_compiler_says_what_to_install():
    d = decide_executors(NO_CXX, opts("ddp", executors=["torchcompile", "torch"]), Case.RAW_MODULE, "GPT")
    assert "torchcompile cannot compile here: no C++ compiler" in d.warning


def test_case_2_is_the_users_jit():
    d = decide_executors(CPU, opts(jit=False), Case.FUNCTION_JIT, "Net")
    assert d.executors == () and "your thunder.jit" in d.headline and not d.warning


def test_case_3_reads_the_users_executors():
    facts = ExecutorFacts(device="cpu", installed=REGISTERED, defaults=CPU_DEFAULTS, user_jitted=LITGPT[:2])
    d = decide_executors(facts, opts(), Case.USER_JITTED, "Net")
    assert (
        d.executors == ("sdpa", "torchcompile") and d.headline == "executors: sdpa, torchcompile (your thunder.jit's)"
    )
    assert "collectives and their waits stay outside torchcompile" in d.reason
