"""Read untrusted JSON into typed values, with errors that say exactly where a document is wrong.

Trace files (and any other file format thunderviz reads) come from other machines and other people: they may be
truncated, edited by hand, written by another version, or made to crash a viewer. Python's ``json`` module alone
lets through what the renderer cannot take (``NaN``, 5,000-digit integers, lone surrogates that later fail to
encode, lists where a string was meant, 100,000 nested brackets) and raises half a dozen exception types on the
way. This module is the one gate:

- ``parse_json(data, limits)`` turns bytes into Python values or raises ``Invalid``, never anything else: size cap
  first, strict UTF-8, no ``NaN``/``Infinity``, no duplicate keys, integers within ``limits.max_int``, nesting at
  most ``limits.max_depth``, every string at most ``limits.max_str`` characters and encodable as UTF-8;
- ``Node`` wraps one parsed value with its location (``bundles[0].forward.ops[12].inputs[1].shape``) and offers
  typed accessors (``node["field"].integer(minimum=0)``, ``node.get("field")``, ``node.items()``) that raise
  ``Invalid`` naming that location.

A file format reads its file with ``read_json_file`` (the size cap applies before anything is parsed), checks its
header with ``check_envelope`` (``{"format": ..., "version": ...}``), builds its objects through ``Node`` and turns
``Invalid`` into its own exception with the file name (see ``thunderviz.trace.file``). Nothing here knows
about traces.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_FILE_BYTES",
    "Invalid",
    "Limits",
    "Node",
    "TooLarge",
    "WrongVersion",
    "check_envelope",
    "int_within",
    "parse_json",
    "read_json_file",
]


#: Default size cap of every file thunderviz reads, trace and timeline files alike (a 4-block GPT's FSDP capture is
#: about 1 MB, 2 MB with every stage).
MAX_FILE_BYTES = 128 * 2**20


@dataclass(frozen=True)
class Limits:
    """Bounds a document must stay within; a format picks its own (``dataclasses.replace`` to change one).

    Args:
        max_bytes: the largest document read at all (checked before parsing).
        max_depth: deepest nesting of lists and objects (the top-level value is depth 1).
        max_str: longest string, in characters (object keys included).
        max_int: largest absolute value of an integer.
        max_values: most JSON values (numbers, strings, lists, objects...) in one document.
    """

    max_bytes: int = MAX_FILE_BYTES
    max_depth: int = 32
    max_str: int = 2**20
    max_int: int = 2**62
    max_values: int = 50_000_000


DEFAULT_LIMITS = Limits()


class Invalid(ValueError):
    """A document broke a rule. ``path`` is where (``""`` for the document itself), ``problem`` what."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path or 'the document'}: {problem}")
        self.path = path
        self.problem = problem


class TooLarge(Invalid):
    """The document is over ``Limits.max_bytes`` (a caller may say how to raise the cap)."""


class WrongVersion(Invalid):
    """The document is of this format but another version; ``found`` is what it says (any JSON value)."""

    def __init__(self, path: str, problem: str, found: Any) -> None:
        super().__init__(path, problem)
        self.found = found


def _describe(value: Any) -> str:
    """A short, safe description of a JSON value for error messages (never the whole value)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        text = str(value) if abs(value) < 10**30 else f"a {len(str(abs(value)))}-digit integer"
        return f"the integer {text}"
    if isinstance(value, float):
        return f"the number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"an object with {len(value)} keys"
    return type(value).__name__


class _PathPrefix(str):
    """A ready-made location (``Node(value, "bundles['gpt']")``) that is put in front of the keys below it as is."""


def _child_path(path: str, key: str | int) -> str:
    if isinstance(key, _PathPrefix):
        return f"{path}.{key}" if path else str(key)
    if isinstance(key, int):
        return f"{path}[{key}]"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", key):
        return f"{path}.{key}" if path else key
    shown = key if len(key) <= 40 else key[:37] + "..."
    return f"{path}[{shown!r}]"


def _no_constant(name: str) -> NoReturn:
    raise Invalid("", f"{name} is not a JSON number (write a finite number or null)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        k = next(k for k, _v in pairs if k in seen or seen.add(k))
        raise Invalid("", f"the key {k[:40]!r} appears twice in one object, so which value counts is unclear")
    return out


def read_json_file(path: str, limits: Limits = DEFAULT_LIMITS) -> Node:
    """Read and parse a JSON file within ``limits`` (never more than ``max_bytes + 1`` bytes are read).

    Raises:
        OSError: the file cannot be read (missing, a directory, no permission).
        TooLarge: it is over ``limits.max_bytes``.
        Invalid: its content breaks a rule of ``parse_json``.
    """
    with open(path, "rb") as f:
        data = f.read(limits.max_bytes + 1)
    return Node(parse_json(data, limits))


def check_envelope(doc: Node, name: str, version: int) -> None:
    """Check ``{"format": name, "version": version, ...}``, the header every thunderviz file starts with.

    Raises:
        Invalid: not an object, or another ``format`` (the file is something else).
        WrongVersion: this format, another version.
    """
    d = doc.value
    if type(d) is not dict or d.get("format") != name:
        raise Invalid("", f'JSON without "format": "{name}"')
    found = d.get("version")
    if type(found) is not int or found != version:
        shown = repr(found) if type(found) in (int, type(None)) else "of another type"
        raise WrongVersion("version", f"format version {shown[:40]}, this thunderviz reads version {version}", found)


def parse_json(data: bytes | str, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Parse a JSON document within ``limits``; every failure is ``Invalid``."""
    if len(data) > limits.max_bytes:
        raise TooLarge("", f"the file is larger than the limit of {limits.max_bytes:,} bytes")
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Invalid("", f"not UTF-8 text (invalid byte at offset {e.start})") from None
    else:
        text = data

    def parse_float(s: str) -> float:
        f = float(s)
        if not math.isfinite(f):
            raise Invalid("", f"the number {s[:40]} is too large to represent")
        return f

    try:
        value = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates, parse_float=parse_float)
    except Invalid:
        raise
    except RecursionError:
        raise Invalid("", f"nested deeper than {limits.max_depth} levels") from None
    except json.JSONDecodeError as e:
        raise Invalid("", f"not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except (ValueError, OverflowError, MemoryError) as e:
        raise Invalid("", f"not readable JSON ({type(e).__name__}: {str(e)[:200]})") from None
    _check_shape(value, limits)
    return value


def _path_of(where: Any) -> str:
    """Render a location: ``None`` for the document, else ``(parent's location, key)``, built only for errors."""
    keys: list[str | int] = []
    while where is not None:
        where, key = where
        keys.append(key)
    path = ""
    for key in reversed(keys):
        path = _child_path(path, key)
    return path


def _check_shape(root: Any, limits: Limits) -> None:
    """Depth, string sizes and encodability, integer range and value count, walked without recursion.

    The walk keeps no locations (most documents are fine); when it finds a problem, ``_locate`` walks again
    to name the place.
    """
    stack: list[tuple[Any, int]] = [(root, 1)]
    pop, push = stack.pop, stack.append
    seen = 1
    max_depth, max_str, max_int, max_values = limits.max_depth, limits.max_str, limits.max_int, limits.max_values
    while stack:
        value, depth = pop()
        t = type(value)
        if t is str:
            if len(value) > max_str or not (value.isascii() or _encodable(value)):
                _locate(root, limits)
        elif t is list or t is dict:
            if depth > max_depth:
                _locate(root, limits)
            seen += len(value)
            if seen > max_values:
                raise Invalid("", f"more than {max_values:,} values")
            d = depth + 1
            if t is list:
                stack.extend([(v, d) for v in value])
            else:
                for k, v in value.items():
                    if len(k) > max_str or not (k.isascii() or _encodable(k)):
                        _locate(root, limits)
                    push((v, d))
        elif t is int and (value > max_int or value < -max_int):
            _locate(root, limits)


def _encodable(s: str) -> bool:
    """False for a string Python holds but UTF-8 cannot write (a lone surrogate from a ``\\ud800`` escape)."""
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _locate(root: Any, limits: Limits) -> None:
    """The slow walk: the same rules, with locations; raises ``Invalid`` at the first problem, if there is one."""
    stack: list[tuple[Any, int, Any]] = [(root, 1, None)]
    while stack:
        value, depth, where = stack.pop()
        t = type(value)
        if t is list or t is dict:
            if depth > limits.max_depth:
                raise Invalid(_path_of(where), f"nested deeper than {limits.max_depth} levels")
            if t is list:
                stack.extend((v, depth + 1, (where, i)) for i, v in enumerate(value))
            else:
                for k, v in value.items():
                    _check_str(k, limits, (where, k))
                    stack.append((v, depth + 1, (where, k)))
        elif t is str:
            _check_str(value, limits, where)
        elif t is int and (value > limits.max_int or value < -limits.max_int):
            raise Invalid(_path_of(where), f"{_describe(value)} is out of range")


def _check_str(s: str, limits: Limits, where: Any) -> None:
    if s.isascii() and len(s) <= limits.max_str:
        return
    if len(s) > limits.max_str:
        raise Invalid(_path_of(where), f"a string of {len(s):,} characters is over the limit of {limits.max_str:,}")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Invalid(
            _path_of(where), f"a string holds a lone surrogate (\\u{ord(s[e.start]):04x}), which is not Unicode text"
        ) from None


_MISSING = object()
_new_node = object.__new__  # children are made without __init__: reading a large file makes hundreds of thousands


def int_within(v: Any, minimum: int | None, maximum: int | None) -> bool:
    """Whether ``v`` is an integer (not a bool) within bounds: the fast check a format's hot loop can use before
    falling back to a ``Node`` to name what is wrong."""
    return (
        isinstance(v, int)
        and not isinstance(v, bool)
        and (minimum is None or v >= minimum)
        and (maximum is None or v <= maximum)
    )


class Node:
    """One JSON value and where it sits in the document; the typed accessors raise ``Invalid`` naming the place.

    Two kinds of accessor: on the value itself (``node.string()``, ``node.integer(minimum=0)``, ``node.items()``)
    and on a field of an object (``node.req_str("name")``, ``node.opt_int("group_size", minimum=1)``,
    ``node.req_list("ops")``). The field forms check the common, valid case without creating a child node; either way
    the place is kept as a link to the parent and rendered (``bundles[0].forward.ops[12]``) only for an error.
    """

    __slots__ = ("_where", "value")

    def __init__(self, value: Any, path: str = "") -> None:
        self.value = value
        self._where = (None, _PathPrefix(path)) if path else None

    @property
    def path(self) -> str:
        return _path_of(self._where)

    def _child(self, value: Any, key: str | int) -> Node:
        child = _new_node(Node)
        child.value, child._where = value, (self._where, key)
        return child

    def fail(self, problem: str) -> NoReturn:
        raise Invalid(self.path, problem)

    def _expect(self, what: str) -> NoReturn:
        self.fail(f"expected {what}, found {_describe(self.value)}")

    # ------------------------------------------------------------------ the value itself

    def obj(self) -> dict[str, Any]:
        if not isinstance(self.value, dict):
            self._expect("an object")
        return self.value

    def items(self, *, max_len: int | None = None) -> list[Node]:
        """The elements of a list."""
        if not isinstance(self.value, list):
            self._expect("a list")
        if max_len is not None and len(self.value) > max_len:
            self.fail(f"a list of {len(self.value):,} is longer than the limit of {max_len:,}")
        child = self._child
        return [child(v, i) for i, v in enumerate(self.value)]

    def int_list(
        self, *, max_len: int | None = None, minimum: int | None = None, maximum: int | None = None
    ) -> list[int]:
        """A list of integers within bounds (checked in one pass; nodes are made only to name a bad element)."""
        v = self.value
        fits = isinstance(v, list) and (max_len is None or len(v) <= max_len)
        if fits and all(int_within(x, minimum, maximum) for x in v):
            return list(v)
        return [x.integer(minimum=minimum, maximum=maximum) for x in self.items(max_len=max_len)]

    def entries(self) -> list[tuple[str, Node]]:
        """The key/value pairs of an object, in order."""
        return [(k, self._child(v, k)) for k, v in self.obj().items()]

    def string(self, *, max_len: int | None = None, choices: Collection[str] | None = None) -> str:
        v = self.value
        if not isinstance(v, str):
            self._expect("a string")
        if max_len is not None and len(v) > max_len:
            self.fail(f"a string of {len(v):,} characters is longer than the limit of {max_len:,}")
        if choices is not None and v not in choices:
            self.fail(f"{_describe(v)} is not one of {sorted(choices)!r}")
        return v

    def integer(self, *, minimum: int | None = None, maximum: int | None = None) -> int:
        """An integer (``true``/``false`` and ``3.0`` are refused: they are not what a writer meant)."""
        v = self.value
        if not isinstance(v, int) or isinstance(v, bool):
            self._expect("an integer")
        if minimum is not None and v < minimum:
            self.fail(f"{_describe(v)} is below the minimum of {minimum}")
        if maximum is not None and v > maximum:
            self.fail(f"{_describe(v)} is above the maximum of {maximum:,}")
        return v

    def boolean(self) -> bool:
        if not isinstance(self.value, bool):
            self._expect("true or false")
        return self.value

    def str_map(self, *, max_len: int | None = None) -> dict[str, str]:
        """An object whose values are all strings."""
        d = self.obj()
        if all(isinstance(v, str) and (max_len is None or len(v) <= max_len) for v in d.values()):
            return dict(d)
        return {k: v.string(max_len=max_len) for k, v in self.entries()}

    # ------------------------------------------------------------------ fields of an object

    def __getitem__(self, key: str) -> Node:
        """A required field."""
        v = self.obj().get(key, _MISSING)
        if v is _MISSING:
            self.fail(f"the field {key!r} is missing")
        return self._child(v, key)

    def get(self, key: str) -> Node | None:
        """An optional field: None when absent or null."""
        v = self.obj().get(key)
        return None if v is None else self._child(v, key)

    def req_list(self, key: str, *, max_len: int | None = None) -> list[Node]:
        """A required list field."""
        return self[key].items(max_len=max_len)

    def opt_list(self, key: str, *, max_len: int | None = None) -> list[Node]:
        """An optional list field: [] when absent or null."""
        v = self.obj().get(key)
        return [] if v is None else self._child(v, key).items(max_len=max_len)

    def req_str(self, key: str, *, max_len: int | None = None, choices: Collection[str] | None = None) -> str:
        """A required string field."""
        v = self.obj().get(key, _MISSING)
        if isinstance(v, str) and (max_len is None or len(v) <= max_len) and (choices is None or v in choices):
            return v
        return self[key].string(max_len=max_len, choices=choices)

    def opt_str(self, key: str, *, max_len: int | None = None, choices: Collection[str] | None = None) -> str | None:
        """An optional string field: None when absent or null."""
        v = self.obj().get(key)
        if v is None:
            return None
        if isinstance(v, str) and (max_len is None or len(v) <= max_len) and (choices is None or v in choices):
            return v
        return self._child(v, key).string(max_len=max_len, choices=choices)

    def str_or(
        self, key: str, default: str, *, max_len: int | None = None, choices: Collection[str] | None = None
    ) -> str:
        """A string field, ``default`` when absent or null."""
        v = self.opt_str(key, max_len=max_len, choices=choices)
        return default if v is None else v

    def req_int(self, key: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
        """A required integer field."""
        v = self.obj().get(key, _MISSING)
        if int_within(v, minimum, maximum):
            return v
        return self[key].integer(minimum=minimum, maximum=maximum)

    def opt_int(self, key: str, *, minimum: int | None = None, maximum: int | None = None) -> int | None:
        """An optional integer field: None when absent or null."""
        v = self.obj().get(key)
        if v is None or int_within(v, minimum, maximum):
            return v
        return self._child(v, key).integer(minimum=minimum, maximum=maximum)
