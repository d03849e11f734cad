"""One-off: move ``ranks/`` and ``thunder/`` into packages that say which process and which concern a module serves.

Run at the repository root of a clean checkout (delete this file after use):

    python tools/restructure.py                 # git mv every module, then rewrite every reference
    python tools/restructure.py --commit        # the same, as two commits: the moves, then the rewrites
    python tools/restructure.py --dry-run       # print the map and what it would place, change nothing
    python tools/restructure.py --place thunder/direct_regions.py=comm/direct_regions.py

``ranks/`` becomes ``pool/`` (kernel: the rank processes), ``cell/`` (kernel: one cell across the ranks), ``rank/``
(inside each rank process) and ``reports/`` (the report objects, the strategy table, traffic accounting);
``thunder/`` gets one subpackage per concern (``jit/``, ``reuse/``, ``comm/``, ``memory/``, ``capture/``). Every
import statement and dotted or path reference in thunderviz/, tests/, bench/, docs/, README.md, pyproject.toml and
mkdocs.yml is rewritten; ``from thunderviz.ranks import RankEngine`` becomes an import from the module that defines
the name (no re-exporting ``ranks`` package is left). tests/test_architecture.py's RULES get the new packages and
docs/layout.py their process. A module under ranks/ or thunder/ this map does not know (added by later work) stops
the script before anything moves, naming it: add it to the map or pass ``--place old=new``.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

PKG = Path("thunderviz")

#: old path under thunderviz/ -> new path under thunderviz/
MOVES: dict[str, str] = {
    # kernel side: the pool of rank processes
    "ranks/cluster.py": "pool/cluster.py",
    "ranks/engine.py": "pool/engine.py",
    "ranks/spawn.py": "pool/spawn.py",
    "ranks/warm_pool.py": "pool/warm_pool.py",
    "ranks/watchdog.py": "pool/watchdog.py",
    "ranks/topology.py": "pool/topology.py",
    "ranks/rendezvous.py": "pool/rendezvous.py",
    # kernel side: one cell across the ranks (what crosses, waiting, what failed, what the user sees)
    "ranks/driver.py": "cell/driver.py",
    "ranks/protocol.py": "cell/protocol.py",
    "ranks/status.py": "cell/status.py",
    "ranks/failures.py": "cell/failures.py",
    "ranks/tracebacks.py": "cell/tracebacks.py",
    "ranks/cell_numbers.py": "cell/numbers.py",
    "ranks/rank_output.py": "cell/output.py",
    # rank side: inside each rank process
    "ranks/inside_rank.py": "rank/calls.py",
    "ranks/rank_identity.py": "rank/identity.py",
    "ranks/rank_setup.py": "rank/setup.py",
    "ranks/rank_fabric.py": "rank/fabric.py",
    "ranks/rank_state.py": "rank/state.py",
    "ranks/cell_hooks.py": "rank/cell_hooks.py",
    "ranks/cell_phase.py": "rank/cell_phase.py",
    "ranks/cell_targets.py": "rank/cell_targets.py",
    "ranks/collect.py": "rank/collect.py",
    "ranks/memory_measure.py": "rank/memory.py",
    "ranks/timeline_rank.py": "rank/timeline.py",
    # reports: one home for what a run reports (drawn by render/, shown by notebook/)
    "ranks/report.py": "reports/run_report.py",
    "ranks/strategy_table.py": "reports/strategy_table.py",
    "ranks/traffic.py": "reports/traffic.py",
    # thunder/: the jit decision's support
    "thunder/executors.py": "thunder/jit/executors.py",
    "thunder/jit_keywords.py": "thunder/jit/keywords.py",
    "thunder/facts.py": "thunder/jit/facts.py",
    "thunder/prologue.py": "thunder/jit/prologue.py",
    "thunder/front_doors.py": "thunder/jit/front_doors.py",
    "thunder/hf.py": "thunder/jit/hf.py",
    "thunder/untraceable.py": "thunder/jit/untraceable.py",
    # thunder/: compile reuse
    "thunder/compile_reuse.py": "thunder/reuse/compile_reuse.py",
    "thunder/reuse_key.py": "thunder/reuse/key.py",
    "thunder/reuse_why.py": "thunder/reuse/why_not.py",
    # thunder/: the communication pass and what it distributes
    "thunder/comm_setup.py": "thunder/comm/setup.py",
    "thunder/comm_pass.py": "thunder/comm/comm_pass.py",
    "thunder/collectives.py": "thunder/comm/collectives.py",
    "thunder/accumulation.py": "thunder/comm/accumulation.py",
    "thunder/distribute.py": "thunder/comm/distribute.py",
    "thunder/fusion_regions.py": "thunder/comm/fusion_regions.py",
    # thunder/: memory
    "thunder/rehearsal.py": "thunder/memory/rehearsal.py",
    "thunder/meta_world.py": "thunder/memory/meta_world.py",
    "thunder/memory_meter.py": "thunder/memory/meter.py",
    "thunder/storage_tracker.py": "thunder/memory/storage_tracker.py",
    "thunder/saved_compare.py": "thunder/memory/saved_compare.py",
    # thunder/: capture (thunder's traces -> the trace model)
    "thunder/capture.py": "thunder/capture/traces.py",
    "thunder/snapshot.py": "thunder/capture/snapshot.py",
    "thunder/param_names.py": "thunder/capture/param_names.py",
    "thunder/find_target.py": "thunder/capture/find_target.py",
}

#: Modules that stay where they are (what every thunder subpackage uses).
STAYS = {"thunder/__init__.py", "thunder/hooks.py", "thunder/compat.py", "thunder/modules.py"}

#: The old ``ranks`` package's __init__ is removed; its re-exports are imported from where they are defined.
REMOVED_INITS = ["ranks/__init__.py"]

#: Dotted names that are not modules and must not change (a logger name users may have configured).
KEEP = {"thunderviz.ranks.output"}

#: thunder's own modules that share a name with one of ours: ``thunder.executors`` without our prefix is thunder's.
THUNDER_OWN = {"executors"}

#: The new packages' __init__ docstrings: the first line says which process.
INITS: dict[str, str] = {
    "pool": "Kernel side: the rank processes. Where they come from (a local cluster on loopback, an attached one, a\n"
    "warm one started ahead), how they become ranks of one process group, and how they are kept and stopped.\n\n"
    "engine (RankEngine), cluster, warm_pool, watchdog (orphan guard), spawn (run_ranks, as torchrun would),\n"
    "topology (backend, hosts), rendezvous (how ranks find each other; the rank side reads it too).\n",
    "cell": "Kernel side: one cell across the ranks. What crosses to a rank and back (protocol), waiting for every\n"
    "rank while streaming its output (driver, output), what a rank is doing (status), and what failed (failures,\n"
    "tracebacks, numbers: a rank's traceback in the notebook's cell numbers).\n",
    "rank": "Rank side: what runs inside each rank process (cheap to import: the kernel names the calls it sends).\n\n"
    "calls (the names the kernel calls by apply), identity, setup (the process group), fabric, state, cell_hooks,\n"
    "cell_phase (the compiling sub-phase), cell_targets, collect (one cell's ReportData), memory (each cell's\n"
    "measured peak), timeline (--timeline on each rank; the kernel merges the recordings with it too).\n",
    "reports": "What a run reports, as picklable objects that open anywhere: run_report (RunReport, one cell on every\n"
    "rank), strategy_table (compare_runs, the 'which strategy?' table), traffic (bytes within and between hosts).\n"
    "render/ draws them; notebook/ shows them.\n",
    "thunder/jit": "The jit decision's support: what the installed thunder offers (executors, keywords), what the\n"
    "object handed to fabric.setup is (facts, front doors), and what thunder read when it ran (prologue).\n",
    "thunder/reuse": "Compile reuse: handing back thunder's earlier trace when the key matches (compile_reuse), the\n"
    "key itself (key), and why a compile could not reuse one (why_not).\n",
    "thunder/comm": "The communication pass: distributing parameters in place (distribute), attaching a plan\n"
    "(setup), the trace transform that buckets and places collectives (comm_pass), thunder's collective symbols\n"
    "(collectives), gradient accumulation, and fusion regions cut at bucket boundaries.\n",
    "thunder/memory": "Memory: a strategy's step rehearsed on the meta device (rehearsal, meta_world,\n"
    "storage_tracker), a real step's measured peak (meter), and thunder's saved tensors against eager's.\n",
    "thunder/capture": "Capture: thunder's traces read into the trace model (traces), one trace frozen (snapshot),\n"
    "its parameters named (param_names), and which jitted object traced a module (find_target).\n",
}

#: A module that runs in both processes says so in its first docstring line.
BOTH_SIDES = {"pool/rendezvous.py": "Both sides (kernel and rank): "}

#: tests/test_architecture.py: the new packages' rules, in place of the ``ranks`` row.
RULES_ROWS = """    # kernel side: the rank processes (IPython only inside functions run in the rank engine's own shell)
    "pool": _rule({"trace", "timeline", "parallel", "cell", "rank", "reports"}, ("thunder", *NOTEBOOK)),
    # kernel side: one cell across the ranks; what crosses is plain data
    "cell": _rule({"trace", "timeline", "parallel"}, ("thunder", *NOTEBOOK)),
    # rank side: inside each rank process
    "rank": _rule(
        {"trace", "timeline", "parallel", "thunder", "strategies", "cell", "pool"}, ("thunder", *NOTEBOOK)
    ),
    # what a run reports: picklable objects that open anywhere, drawn by render
    "reports": _rule({"trace", "timeline", "parallel", "render", "cell", "rank"}, ("thunder", *NOTEBOOK)),
"""

NEW_PACKAGES = ("pool", "cell", "rank", "reports")

#: docs/architecture.md's layout block: the entries for thunder/ and for what was ranks/.
ARCH_THUNDER = """\
  thunder/      the only package that imports lightning-thunder; at its root what every part uses: compat (the
                version gate), hooks (the sync hook and thunder's state), modules (unwrapping Fabric's wrapper and
                ThunderModule). One subpackage per concern:
    jit/        the jit decision's support: executors (what the installed thunder offers), keywords (what
                thunder.jit reads), facts (live object -> decision facts), prologue, front doors
    reuse/      compile reuse: compile_reuse (hand back an earlier compile), key, why_not (a miss in words)
    comm/       the communication pass: distribute (shard/replicate in place), setup, comm_pass (the
                bucketing/scheduling Transform), collectives (thunder's collective symbols), accumulation (the
                gradients a no_backward_sync backward keeps), fusion_regions
    memory/     rehearsal (a strategy's step on the meta device, counted) with meta_world (N ranks in one process)
                and storage_tracker; meter (a real step's peak: CUDA stats or MemTracker); saved_compare
    capture/    traces (thunder traces -> trace model), snapshot, param_names, find_target (which jitted object
                traced a module)
                RULE: no lightning; imports trace, parallel
"""
ARCH_RANKS = """\
  pool/         KERNEL: the rank processes on ipyparallel: engine (RankEngine), cluster (local on loopback, or
                attached), warm_pool, watchdog (orphan guard), spawn (run_ranks, as torchrun would), topology
                (backend, hosts), rendezvous (how ranks find each other; read on both sides)
  cell/         KERNEL: one cell across the ranks: protocol (what crosses, both ways), driver (waiting while
                streaming), output (library chatter kept out of cells), status, failures, tracebacks (short:
                identical ones once, library frames folded), numbers (tracebacks in the notebook's cell numbers)
  rank/         RANK: inside each rank process: calls (the names the kernel calls by apply), identity, setup (the
                process group), fabric, state, cell_hooks, cell_phase (the "compiling" sub-phase), cell_targets,
                collect (one cell's ReportData), memory (each cell's measured peak), timeline (--timeline)
                RULE (pool, cell, rank): no thunder directly; IPython only inside functions that run in the rank
                engine's own shell
  reports/      what a run reports, picklable, opens anywhere: run_report (RunReport), strategy_table (compare_runs,
                the "which strategy?" table), traffic (bytes within and between hosts); render/ draws them
"""
PROCESS_ROWS = '    "pool": "kernel",\n    "cell": "kernel",\n    "rank": "rank",\n    "reports": "anywhere",\n'


def dotted(rel: str) -> str:
    """``ranks/engine.py`` -> ``thunderviz.ranks.engine``; ``ranks/__init__.py`` -> ``thunderviz.ranks``."""
    parts = ["thunderviz", *Path(rel).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True)


class Map:
    def __init__(self, moves: dict[str, str]) -> None:
        self.moves = {dotted(old): dotted(new) for old, new in moves.items()}
        self.name_home: dict[str, str] = {}  # names the removed ranks/__init__ re-exported -> defining module
        for init in REMOVED_INITS:
            tree = ast.parse((PKG / init).read_text(encoding="utf-8"))
            for node in tree.body:
                if isinstance(node, ast.ImportFrom) and node.module:
                    for alias in node.names:
                        self.name_home[alias.name] = self.moves.get(node.module, node.module)
        self.removed = {dotted(i) for i in REMOVED_INITS}
        self.unknown: set[str] = set()

    def module(self, name: str) -> str:
        return self.moves.get(name, name)

    def text(self, s: str) -> str:
        """Every dotted reference (``thunderviz.ranks.engine.X``, ``ranks.engine``) and path (``ranks/engine.py``)."""

        def full(m: re.Match[str]) -> str:
            whole, pkg, sub = m.group(0), m.group(1), m.group(2)
            if whole in KEEP:
                return whole
            old = f"thunderviz.{pkg}.{sub}" if sub else f"thunderviz.{pkg}"
            if old in self.moves:
                return self.moves[old]
            if pkg == "ranks" and sub and sub in self.name_home:
                return f"{self.name_home[sub]}.{sub}"
            if old in self.removed:
                return "thunderviz.pool"
            if sub and pkg == "ranks":
                self.unknown.add(whole)
            return whole

        s = re.sub(r"(?<![\w.])thunderviz\.(ranks|thunder)(?:\.(\w+))?(?!\w)", full, s)

        def short(m: re.Match[str]) -> str:
            pkg, sub = m.group(1), m.group(2)
            if pkg == "thunder" and sub in THUNDER_OWN:
                return m.group(0)
            new = self.moves.get(f"thunderviz.{pkg}.{sub}")
            return new.removeprefix("thunderviz.") if new else m.group(0)

        s = re.sub(r"(?<![\w./])(ranks|thunder)\.(\w+)(?!\w)", short, s)

        def path(m: re.Match[str]) -> str:
            prefix, pkg, sub = m.group(1) or "", m.group(2), m.group(3)
            new = self.moves.get(f"thunderviz.{pkg}.{sub}")
            return prefix + new.removeprefix("thunderviz.").replace(".", "/") + ".py" if new else m.group(0)

        return re.sub(r"(?<![\w/])(thunderviz/)?(ranks|thunder)/(\w+)\.py", path, s)

    def prose(self, s: str) -> str:
        """Renamed modules named alone in prose: ``rank_setup``, ``inside_rank.set_up``, rank_setup.py (comments,
        docstrings and docs only: in code such a name is a variable or an import alias)."""
        renamed = {
            old.rpartition(".")[2]: new.removeprefix("thunderviz.")
            for old, new in self.moves.items()
            if old.rpartition(".")[2] != new.rpartition(".")[2] and "_" in old.rpartition(".")[2]
        }
        if not renamed:
            return s
        names = "|".join(sorted(renamed, key=len, reverse=True))
        s = re.sub(rf"``({names})``", lambda m: f"``{renamed[m.group(1)]}``", s)
        s = re.sub(rf"(?<![\w./])({names})\.py\b", lambda m: renamed[m.group(1)].replace(".", "/") + ".py", s)
        return re.sub(rf"(?<![\w./])({names})\.(?=[a-zA-Z_])", lambda m: renamed[m.group(1)] + ".", s)

    def import_from(self, node: ast.ImportFrom) -> list[tuple[str, str, str | None]] | None:
        """``(module, name, asname)`` triples replacing one ``from X import ...``; None when nothing moves."""
        if node.level or not node.module or not node.module.startswith("thunderviz"):
            return None
        out: list[tuple[str, str, str | None]] = []
        changed = False
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            if sub in self.moves:  # a module imported by name: from thunderviz.ranks import engine
                new_parent, _, new_leaf = self.moves[sub].rpartition(".")
                asname = alias.asname or (alias.name if new_leaf != alias.name else None)
                out.append((new_parent, new_leaf, asname))
                changed = True
            elif node.module in self.removed and alias.name in self.name_home:
                out.append((self.name_home[alias.name], alias.name, alias.asname))
                changed = True
            elif node.module in self.moves:
                out.append((self.moves[node.module], alias.name, alias.asname))
                changed = True
            elif node.module in self.removed:
                raise SystemExit(f"from {node.module} import {alias.name}: name not found in the removed package")
            else:
                out.append((node.module, alias.name, alias.asname))
        return out if changed else None


def rewrite_python(path: Path, m: Map) -> str:
    src = path.read_text(encoding="utf-8")
    lines = src.splitlines(keepends=True)
    tree = ast.parse(src, str(path))
    spans: list[tuple[int, int, str]] = []  # (first line index, last line index + 1, replacement)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            triples = m.import_from(node)
            if triples is None:
                continue
            indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)
            by_module: dict[str, list[str]] = {}
            for module, name, asname in triples:
                by_module.setdefault(module, []).append(f"{name} as {asname}" if asname else name)
            text = "".join(f"{indent}from {mod} import {', '.join(names)}\n" for mod, names in by_module.items())
            spans.append((node.lineno - 1, node.end_lineno, text))
        elif isinstance(node, ast.Import):
            if not any(a.name in m.moves or a.name in m.removed for a in node.names):
                continue
            indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)
            parts = []
            for a in node.names:
                new = m.moves.get(a.name, "thunderviz.pool" if a.name in m.removed else a.name)
                parts.append(f"{new} as {a.asname}" if a.asname else new)
            spans.append((node.lineno - 1, node.end_lineno, f"{indent}import {', '.join(parts)}\n"))
    spans.sort()
    out, at = [], 0
    for first, end, text in spans:
        if first < at:  # an import inside a span already replaced (cannot happen for statements)
            continue
        out.append(m.text("".join(lines[at:first])))
        out.append(text)
        at = end
    out.append(m.text("".join(lines[at:])))
    return _in_prose("".join(out), m.prose)


def _in_prose(src: str, edit: Callable[[str], str]) -> str:
    """``edit`` applied to the comments and string literals of ``src`` only."""
    import io
    import tokenize

    lines = src.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    pieces, at = [], 0
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            continue
        begin = starts[tok.start[0] - 1] + tok.start[1]
        end = starts[tok.end[0] - 1] + tok.end[1]
        pieces.append(src[at:begin])
        pieces.append(edit(src[begin:end]))
        at = end
    pieces.append(src[at:])
    return "".join(pieces)


def unplaced(moves: dict[str, str]) -> list[str]:
    found = []
    for folder in ("ranks", "thunder"):
        for p in sorted((PKG / folder).rglob("*.py")):
            rel = p.relative_to(PKG).as_posix()
            if "__pycache__" in rel or rel in moves or rel in STAYS or rel in REMOVED_INITS:
                continue
            found.append(rel)
    return found


def files_to_rewrite() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()
    keep = (".py", ".md", ".ipynb", ".sh", ".toml", ".yml", ".cfg", ".txt", ".js")
    tops = ("thunderviz/", "tests/", "bench/", "docs/")
    return [
        Path(f)
        for f in tracked
        if (f.startswith(tops) and f.endswith(keep)) or f in ("README.md", "pyproject.toml", "mkdocs.yml")
        if Path(f).is_file() and f != "tools/restructure.py"
    ]


def _multiline_string_lines(src: str) -> set[int]:
    """1-based numbers of the lines inside (or opening) a triple-quoted string."""
    import io
    import tokenize

    rows: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.STRING and tok.start[0] != tok.end[0]:
            rows.update(range(tok.start[0], tok.end[0] + 1))
    return rows


def wrap_long_lines(limit: int = 120) -> list[str]:
    """Longer names made some comment and docstring lines too long: break them at a space, same indentation.
    Returns the long lines it could not break (code), for a hand to mend."""
    import json

    found = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--select",
            "E501",
            "--output-format",
            "json",
            "--exclude",
            "tools",
            ".",
        ],
        capture_output=True,
        text=True,
    ).stdout
    left: list[str] = []
    by_file: dict[str, set[int]] = {}
    for item in json.loads(found or "[]"):
        by_file.setdefault(item["filename"], set()).add(item["location"]["row"])
    for filename, rows in by_file.items():
        path = Path(filename)
        src = path.read_text(encoding="utf-8")
        in_string = _multiline_string_lines(src)
        lines = src.splitlines(keepends=True)
        for row in sorted(rows, reverse=True):
            line = lines[row - 1].rstrip("\n")
            indent = line[: len(line) - len(line.lstrip())]
            comment = line.lstrip().startswith("#")
            cut = line.rfind(" ", len(indent) + 8, limit)
            if (comment or row in in_string) and cut > 0:
                marker = ""
                if comment:
                    marker = line.lstrip().split(" ", 1)[0] + " "  # "#" or "#:"
                lines[row - 1] = line[:cut] + "\n" + indent + marker + line[cut + 1 :] + "\n"
            else:
                left.append(f"{filename}:{row}")
        path.write_text("".join(lines), encoding="utf-8")
    return left


def edit_architecture_test(path: Path) -> None:
    t = path.read_text(encoding="utf-8")
    row = re.search(r'^    "ranks": _rule\(.*?\),\n', t, re.MULTILINE | re.DOTALL)
    if row is None:
        raise SystemExit("tests/test_architecture.py: no 'ranks' row in RULES")
    t = t[: row.start()] + RULES_ROWS + t[row.end() :]
    t = t.replace('layer == "ranks" and top == "IPython"', 'layer in {"pool", "cell", "rank"} and top == "IPython"')
    t = t.replace('"ranks use IPython only', '"rank processes use IPython only')
    t = re.sub(r'(?<=[{(, ])"ranks"(?=[,}) ])', "*RANK_PACKAGES", t)
    t = t.replace(
        "\n\n@dataclass(frozen=True)\nclass Rule:",
        "\n\n#: What was ranks/: the rank processes (pool), one cell across them (cell), inside a rank (rank),\n"
        '#: what a run reports (reports).\nRANK_PACKAGES = {"pool", "cell", "rank", "reports"}\n'
        "\n\n@dataclass(frozen=True)\nclass Rule:",
        1,
    )
    t = t.replace(
        "- ``ranks``: rank processes (ipyparallel engines) and the kernel's driver. IPython only inside functions that "
        "run in\n  the rank engine's own shell.",
        "- ``pool`` (kernel: the rank processes), ``cell`` (kernel: one cell across the ranks), ``rank`` (inside each\n"
        "  rank process): IPython only inside functions that run in the rank engine's own shell. ``reports``: what a\n"
        "  run reports, drawn by ``render``.",
    )
    path.write_text(t, encoding="utf-8")


def edit_architecture_doc(path: Path) -> None:
    """The layout block's thunder/ and ranks/ entries, replaced; the old ones are printed so that anything later
    work added to them can be carried over by hand."""
    t = path.read_text(encoding="utf-8")
    for start, stop, new in (
        ("  thunder/ ", "  strategies/ ", ARCH_THUNDER),
        ("  ranks/ ", "  notebook/ ", ARCH_RANKS),
    ):
        found = re.search(rf"^{re.escape(start)}.*?(?=^{re.escape(stop)})", t, re.MULTILINE | re.DOTALL)
        if found is None:
            print(f"docs/architecture.md: no {start.strip()} entry; write the new one by hand", file=sys.stderr)
            continue
        print(
            f"docs/architecture.md: replaced this entry (carry over anything new):\n{found.group(0)}", file=sys.stderr
        )
        t = t[: found.start()] + new + t[found.end() :]
    path.write_text(t, encoding="utf-8")


def edit_layout(path: Path) -> None:
    t = path.read_text(encoding="utf-8")
    if '    "ranks": "both",\n' not in t:
        raise SystemExit("docs/layout.py: no 'ranks' row in PROCESS")
    path.write_text(t.replace('    "ranks": "both",\n', PROCESS_ROWS), encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit", action="store_true", help="commit the moves, then the rewrites")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--place", action="append", default=[], metavar="OLD=NEW", help="e.g. thunder/x.py=comm/x.py")
    args = ap.parse_args()
    if not (PKG / "ranks" / "engine.py").is_file():
        raise SystemExit("run at the repository root of a checkout that still has thunderviz/ranks/")
    moves = dict(MOVES)
    for item in args.place:
        old, _, new = item.partition("=")
        moves[old] = new if new.startswith(("thunder/", "pool/", "cell/", "rank/", "reports/")) else f"thunder/{new}"
    moves = {old: new for old, new in moves.items() if (PKG / old).is_file()}
    missing = unplaced(moves)
    if missing:
        raise SystemExit(
            "these modules have no place in the map; add them to MOVES (or STAYS) in tools/restructure.py, or pass\n"
            "--place OLD=NEW for each, e.g. --place thunder/x.py=thunder/comm/x.py:\n  " + "\n  ".join(missing)
        )
    if args.dry_run:
        for old, new in moves.items():
            print(f"thunderviz/{old} -> thunderviz/{new}")
        return
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, check=True).stdout
    if dirty.strip():
        raise SystemExit("the checkout has uncommitted changes; run on a clean one")
    m = Map(moves)  # reads the old ranks/__init__ before it goes

    # 1. the moves, alone (history follows them: git log --follow)
    for old, new in moves.items():
        (PKG / new).parent.mkdir(parents=True, exist_ok=True)
        sh("git", "mv", str(PKG / old), str(PKG / new))
    for init in REMOVED_INITS:
        sh("git", "rm", "-q", str(PKG / init))
    for package, doc in INITS.items():
        init = PKG / package / "__init__.py"
        init.write_text(f'"""{doc.rstrip()}\n"""\n', encoding="utf-8")
        sh("git", "add", str(init))
    if args.commit:
        sh(
            "git",
            "commit",
            "-q",
            "-m",
            "Move ranks/ and thunder/ modules into packages by process and concern (git mv only)",
        )

    # 2. every reference
    for path in files_to_rewrite():
        new = rewrite_python(path, m) if path.suffix == ".py" else m.prose(m.text(path.read_text(encoding="utf-8")))
        if new != path.read_text(encoding="utf-8"):
            path.write_text(new, encoding="utf-8")
    for rel, prefix in BOTH_SIDES.items():
        p = PKG / rel
        t = p.read_text(encoding="utf-8")
        if t.startswith('"""') and not t[3:].startswith(prefix):
            p.write_text('"""' + prefix + t[3].lower() + t[4:], encoding="utf-8")
    edit_architecture_test(Path("tests/test_architecture.py"))
    edit_layout(Path("docs/layout.py"))
    edit_architecture_doc(Path("docs/architecture.md"))
    ruff = [sys.executable, "-m", "ruff"]
    subprocess.run([*ruff, "check", "--select", "I", "--fix", "-q", "."], check=False)
    subprocess.run([*ruff, "format", "-q", "."], check=False)
    long_code = wrap_long_lines()
    subprocess.run([*ruff, "format", "-q", "."], check=False)
    drawn = subprocess.run([sys.executable, "docs/layout.py"], check=False)
    if long_code:
        print("lines over 120 characters to shorten by hand:", long_code, file=sys.stderr)
    if m.unknown:
        print("left unchanged (not modules of the old packages):", sorted(m.unknown), file=sys.stderr)
    if args.commit:
        sh("git", "add", "-A")
        sh("git", "commit", "-q", "-m", "Rewrite imports and references for the new layout; rules and picture follow")
    print(f"moved {len(moves)} modules; layout picture {'redrawn' if drawn.returncode == 0 else 'NOT redrawn'}")


if __name__ == "__main__":
    main()
