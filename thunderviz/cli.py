"""``thunderviz`` command line: ``thunderviz demo`` and ``thunderviz render TRACES... --out report.html``.

Each subcommand is a ``(add_arguments, run)`` pair registered in ``_SUBCOMMANDS``; adding one (``demo``) means
writing those two functions and one line in the table. ``main`` returns an exit code instead of calling
``sys.exit`` so tests can call it directly.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from thunderviz.errors import ThundervizError

__all__ = ["main"]


def _add_render_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "traces", nargs="*", type=Path, help="trace files written by thunderviz.save (one per rank is usual)"
    )
    p.add_argument(
        "--timeline",
        nargs="+",
        type=Path,
        default=[],
        metavar="FILE",
        help="timeline files written by record_timeline(...).save, one per rank: adds the measured timeline",
    )
    p.add_argument(
        "--out", "-o", type=Path, default=Path("report.html"), help="HTML file to write (default: report.html)"
    )
    p.add_argument("--title", default=None, help="page title (default: the trace files' names)")
    svg = p.add_mutually_exclusive_group()
    svg.add_argument(
        "--svg",
        dest="svg",
        action="store_const",
        const=True,
        default=None,
        help="require inline SVG graphs (fails without the Graphviz `dot` binary)",
    )
    svg.add_argument("--no-svg", dest="svg", action="store_const", const=False, help="DOT source only, no layout")
    p.add_argument("--no-diff", dest="diff", action="store_false", help="leave out the diff between jitted objects")


def _run_render(args: argparse.Namespace) -> int:
    # Only the trace model, its file format and the renderer: no torch, lightning or thunder (bench/cli_start.py).
    from thunderviz.render.html import render_html
    from thunderviz.trace.file import load
    from thunderviz.trace.units import format_bytes

    if not args.traces and not args.timeline:
        print("thunderviz render: give trace files, --timeline files (one per rank), or both", file=sys.stderr)
        raise SystemExit(2)  # a usage error, as argparse reports a missing argument
    bundles = []
    for path in args.traces:
        bundles.extend(load(path))
    timeline = None
    if args.timeline:
        from thunderviz.timeline import load as load_timeline

        timeline = load_timeline(*args.timeline)
    title = args.title or "thunderviz: " + ", ".join(p.name for p in [*args.traces, *args.timeline])
    page = render_html(bundles, title=title, svg=args.svg, diff=args.diff, timeline=timeline)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page, encoding="utf-8")
    print(f"wrote {args.out} ({len(bundles)} traces, {format_bytes(args.out.stat().st_size)})")
    return 0


def _add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", "-o", type=Path, default=Path("demo-output"), help="folder for the report (default: demo-output)"
    )
    p.add_argument(
        "--scenarios",
        action="store_true",
        help="instead of the notebook tutorial, run the seed scenarios from plain Python (no Jupyter), as a"
        " torchrun user would",
    )
    p.add_argument("--nproc", type=int, default=2, help="ranks for --scenarios (default: 2)")
    p.add_argument("--only", default=None, metavar="NAME,...", help="with --scenarios: run only these scenarios")


def _run_demo(args: argparse.Namespace) -> int:
    if args.nproc < 1:
        print(f"thunderviz demo: --nproc must be at least 1, got {args.nproc}", file=sys.stderr)
        return 2
    if args.scenarios:
        return _run_scenarios(args)
    from nbclient.exceptions import CellExecutionError

    from thunderviz.demos.tutorial import EXECUTED_NAME, FURTHER, TUTORIAL, run_tutorial

    print(f"thunderviz demo: running {TUTORIAL.name} headlessly on 2 CPU ranks (a real kernel, the magics, real ranks)")
    try:
        report = run_tutorial(args.out)
    except CellExecutionError as e:
        print(f"thunderviz demo: a tutorial cell failed; see {args.out / EXECUTED_NAME}\n{e}", file=sys.stderr)
        return 1
    summary = report.with_suffix(".txt")
    if summary.exists():
        print(summary.read_text(encoding="utf-8"))
    print(f"executed notebook: {report.parent / EXECUTED_NAME}")
    print(f"report: {report}")
    print(f"work through the tutorial yourself: jupyter lab --ip=127.0.0.1 {report.parent / TUTORIAL.name}")
    print(
        f"and its sequel (your own jit, activation checkpointing, a straggler, faults): {report.parent / FURTHER.name}"
    )
    return 0


def _run_scenarios(args: argparse.Namespace) -> int:
    from thunderviz.demos.scenarios import SEED_SCENARIOS, run_scenarios

    chosen = SEED_SCENARIOS
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        known = {sc.name: sc for sc in SEED_SCENARIOS}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            print(
                f"thunderviz demo: unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(known)}",
                file=sys.stderr,
            )
            return 2
        chosen = tuple(known[n] for n in wanted)
    run_scenarios(args.out, nproc=args.nproc, scenarios=chosen)
    return 0


_SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "render": ("write a self-contained HTML report from saved trace files", _add_render_arguments, _run_render),
    "demo": ("run the tutorial on 2 CPU ranks and write one offline HTML report", _add_demo_arguments, _run_demo),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="thunderviz", description="See what Lightning Thunder did on every rank.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_arguments, run) in _SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(_run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``thunderviz`` script; returns the exit code (errors: message on stderr, code 1)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args))
    except (ThundervizError, RuntimeError, OSError) as e:
        print(f"thunderviz {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
