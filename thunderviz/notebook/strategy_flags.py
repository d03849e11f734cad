"""The strategy flags of ``%%thunder_fsdp`` / ``%%thunder_ddp``, derived from ``parallel.options.OPTIONS``.

Why derived: each option's name, choices, default and help text are declared once; the flags, their ``--help`` and
their checks follow, so a flag cannot accept what the strategy refuses, and a new option appears in the magics by
giving it a ``Flag``. Values are checked in the kernel (``StrategySpec`` parses them) before any rank is touched.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from IPython.core.magic_arguments import argument, argument_group

from thunderviz.parallel.option_values import OptionError, Parallelism
from thunderviz.parallel.options import Option, flag_options

__all__ = ["flag_values", "strategy_arguments"]


def _dest(option: Option) -> str:
    return f"option_{option.name}"


def _type(option: Option) -> Callable[[str], Any] | None:
    parse = option.flag.parse if option.flag is not None else None
    if parse is None:
        return None

    def checked(text: str) -> Any:
        try:
            return parse(text)
        except OptionError as exc:  # argparse shows ArgumentTypeError messages as they are
            raise argparse.ArgumentTypeError(f"{option.flag.name} {text}: {exc}") from None

    checked.__name__ = option.name
    return checked


def _default_text(option: Option, parallelism: Parallelism) -> str:
    default = option.default_for(parallelism)
    if default is None:
        return ""
    if isinstance(default, bool):
        return ""
    return f" (default {str(default).lower() if option.choices else default})"


def _argument(option: Option, parallelism: Parallelism) -> Callable[[Any], Any]:
    flag = option.flag
    assert flag is not None
    help_text = option.help + _default_text(option, parallelism)
    if flag.negates:
        return argument(flag.name, dest=_dest(option), action="store_true", help=help_text)
    if option.choices is not None:
        return argument(
            flag.name,
            dest=_dest(option),
            choices=list(flag.choices) or [m.value.lower() for m in option.choices],
            default=None,
            help=help_text,
        )
    return argument(
        flag.name, dest=_dest(option), type=_type(option), default=None, metavar=flag.metavar, help=help_text
    )


def strategy_arguments(parallelism: Parallelism) -> Callable[[Any], Any]:
    """Decorate a magic with one flag per option of ``parallelism`` that has a ``Flag``, in a "strategy" group."""

    def decorate(func: Any) -> Any:
        for option in reversed(flag_options(parallelism)):
            func = _argument(option, parallelism)(func)
        return argument_group("strategy")(func)

    return decorate


def flag_values(parallelism: Parallelism, args: argparse.Namespace) -> dict[str, Any]:
    """The options the flags set (flags not given are left out, so the option's default applies)."""
    values: dict[str, Any] = {}
    for option in flag_options(parallelism):
        value = getattr(args, _dest(option))
        if option.flag is not None and option.flag.negates:
            if value:
                values[option.name] = False
        elif value is not None:
            values[option.name] = value
    return values
