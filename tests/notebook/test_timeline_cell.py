"""The ``--timeline [--steps N]`` flags: the --steps check and --steps without --timeline."""

from __future__ import annotations

import argparse

import pytest
from IPython.core.error import UsageError

from thunderviz.notebook.timeline_cell import steps_arg, timeline_options


@pytest.mark.parametrize("text", ["0", "-3", "two", "1.5"])
def test_steps_must_be_a_positive_whole_number(text):
    with pytest.raises(argparse.ArgumentTypeError, match=rf"--steps {text}: need a whole number >= 1"):
        steps_arg(text)
    assert steps_arg("4") == 4


def test_steps_without_timeline_is_not_ignored():
    with pytest.raises(UsageError, match="--steps 3 counts the steps of a timeline; add --timeline"):
        timeline_options(argparse.Namespace(timeline=False, steps=3))
    assert timeline_options(argparse.Namespace(timeline=True, steps=None)) == {"timeline": True, "steps": 5}
    assert timeline_options(argparse.Namespace(timeline=False, steps=None)) == {"timeline": False, "steps": 5}
