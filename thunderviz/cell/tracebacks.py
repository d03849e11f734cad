"""A failed cell's tracebacks, sized for a reader: identical ones shown once for every rank that raised them, the
user's own frames first, library frames folded into one line.

Why: a forward that raised on 2 ranks printed both ranks' identical 34-frame tracebacks in full (517 lines, the
message once per rank), and the user's own line (``Bad.forward``) first appeared at output line 161, under frames of
torch, Fabric and thunder's interpreter. IPython's ``ultratb`` on the rank writes a frame as a header (``Cell In[3],
line 7, in Bad.forward()`` or ``File .../thunder/core/prims.py:4118, in matmul_meta(a, b)``) followed by a few lines
of context and a blank line; ``parse`` reads that text back into frames, and ``compact`` writes the short form. The
full text stays in ``RankFailure.traceback`` (``CellError.full_traceback``), one click or one call away.

ipyparallel's ``CompositeError.render_traceback`` was the idea (several remote errors in one report); it prints each
engine's traceback in full, which is what this replaces.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Frame", "ParsedTraceback", "compact", "is_library_file", "parse", "same_text"]

_FRAME_HEAD = re.compile(r"^(?:Cell In\[\d+\], line \d+(?:, in .*)?|File (?P<file>.+?):\d+, in .*)$")
_SEPARATOR = re.compile(r"^-{20,}$")
_TRACEBACK_TITLE = re.compile(r"^\S+\s+Traceback \(most recent call last\)$")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_CHAINED = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
#: the package a library frame is counted under (``torch``, ``thunder``, ``lightning``, ...)
_PACKAGE = re.compile(r"(?:site|dist)-packages/([^/]+)/")
#: context lines shown around a user frame's arrow (IPython writes up to 5 above it)
_CONTEXT_ABOVE = 2


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get("stdlib", ""), paths.get("platstdlib", ""), paths.get("purelib", ""), paths.get("platlib", "")}
    roots.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # thunderviz itself
    roots.add(sys.base_prefix)
    return tuple(sorted(r for r in roots if r))


_ROOTS = _library_roots()


def is_library_file(path: str) -> bool:
    """Whether a frame's file is library code (an installed package, the standard library, thunderviz) rather than
    the user's: a notebook cell, or a file of their own. IPython writes paths under the home folder as ``~/...``."""
    path = os.path.expanduser(path).replace("\\", "/")
    if "site-packages/" in path or "dist-packages/" in path or path.startswith("<frozen"):
        return True
    return any(path.startswith(root.replace("\\", "/") + "/") for root in _ROOTS)


def _package(path: str) -> str:
    m = _PACKAGE.search(path.replace("\\", "/"))
    if m:
        return m.group(1).split(".")[0].split("-")[0]
    if "/thunderviz/" in path.replace("\\", "/"):
        return "thunderviz"
    return "the standard library"


@dataclass
class Frame:
    """One frame as IPython printed it: its header line and the context lines under it."""

    head: str
    lines: list[str] = field(default_factory=list)

    @property
    def file(self) -> str | None:
        """The frame's file; None for a notebook cell (``Cell In[3]``)."""
        m = _FRAME_HEAD.match(self.head)
        return m.group("file") if m else None

    @property
    def is_user(self) -> bool:
        return self.file is None or not is_library_file(self.file)

    def short(self) -> list[str]:
        """The header and the context up to the arrow line (``---->``), at most ``_CONTEXT_ABOVE`` lines above it."""
        arrow = next((i for i, line in enumerate(self.lines) if line.lstrip().startswith(("-->", "---->", "->"))), None)
        if arrow is None:
            return [self.head, *self.lines[-1:]]
        return [self.head, *self.lines[max(0, arrow - _CONTEXT_ABOVE) : arrow + 1]]


@dataclass
class ParsedTraceback:
    """The last exception of a traceback: its frames (outermost first) and its message lines; ``chained`` counts
    the exceptions printed before it (``raise ... from``, or raised while handling another)."""

    frames: list[Frame]
    error: list[str]
    chained: int = 0

    @property
    def library_frames(self) -> list[Frame]:
        return [f for f in self.frames if not f.is_user]


def parse(text: str) -> ParsedTraceback | None:
    """Read IPython's traceback text back into frames; None when it is not one (a dead rank's log, a bare
    message), which is then shown as it is."""
    lines = text.rstrip("\n").splitlines()
    sections: list[list[str]] = [[]]
    for line in lines:
        if line.strip() in _CHAINED:
            sections.append([])
        else:
            sections[-1].append(line)
    frames: list[Frame] = []
    tail: list[str] = []
    for line in sections[-1]:
        if _SEPARATOR.match(line) or _TRACEBACK_TITLE.match(line):
            continue
        if _FRAME_HEAD.match(line):
            frames.append(Frame(line))
            tail = []
        elif frames and not tail and line.strip():
            frames[-1].lines.append(line)
        elif frames and not line.strip():
            tail = [""]  # a blank line ends the frame; what follows the last one is the message
        elif frames:
            tail.append(line)
    error = [t for t in tail if t.strip()]
    if not frames or not error:
        return None
    return ParsedTraceback(frames=frames, error=error, chained=len(sections) - 1)


def same_text(text: str) -> str:
    """What two ranks' tracebacks must share to be shown once: the text, object addresses aside."""
    return _ADDRESS.sub("0x…", text.strip())


def compact(text: str, *, max_user_frames: int = 6) -> list[str]:
    """The short form of one traceback: the message, the user's frames innermost first (each with the lines up to
    its arrow), one line counting the library frames folded by package, and the innermost frame when it is library
    code (where the error was raised). Text that is no IPython traceback comes back as its last 20 lines."""
    parsed = parse(text)
    if parsed is None:
        lines = text.rstrip().splitlines()
        return (["... (" + str(len(lines) - 20) + " lines above)"] if len(lines) > 20 else []) + lines[-20:]
    out = list(parsed.error)
    users = [f for f in parsed.frames if f.is_user][::-1]
    for frame in users[:max_user_frames]:
        out.extend(frame.short())
    if len(users) > max_user_frames:
        out.append(f"... {len(users) - max_user_frames} more frames of your code")
    library = parsed.library_frames
    if library:
        by_package = Counter(_package(f.file or "") for f in library)
        counts = ", ".join(f"{name} {n}" for name, n in by_package.most_common())
        out.append(f"... {len(library)} library frame{'s' if len(library) != 1 else ''} folded ({counts})")
        innermost = parsed.frames[-1]
        if not innermost.is_user:
            out.append(f"raised in {innermost.head.removeprefix('File ')}")
    if parsed.chained:
        out.append(
            f"(after {parsed.chained} earlier exception{'s' if parsed.chained != 1 else ''}, in the full output)"
        )
    return out
