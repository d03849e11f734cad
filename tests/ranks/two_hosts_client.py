"""The notebook on host a of the two-host test: a real IPython shell with ``%load_ext thunderviz``, driven by JSON
commands on stdin, answering one ``@@tv@@ {json}`` line per command on stdout (rank output may share stdout).

Commands: ``{"cell": MAGIC_LINE_AND_SOURCE}`` runs a cell and reports ok/error/seconds (and its report's traffic
within and between hosts); ``{"line": "thunder_ranks
restart"}`` runs a line magic; ``{"pull": NAME}`` returns NAME from every rank; ``{"engines": CONNECTION_FILE}``
counts the engines a fresh client sees (to prove a cluster was not stopped); ``{"quit": true}``.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

MARK = "@@tv@@ "


def _answer(**payload: object) -> None:
    sys.stdout.write(MARK + json.dumps(payload, default=str) + "\n")
    sys.stdout.flush()


def main() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "thunderviz")
    magics = shell.magics_manager.registry["ThundervizMagics"]
    _answer(ready=True)
    for line in sys.stdin:
        command = json.loads(line)
        try:
            if "cell" in command:
                start = time.monotonic()
                result = shell.run_cell(command["cell"])
                error = result.error_in_exec or result.error_before_exec
                traffic = result.result.traffic() if hasattr(result.result, "traffic") else None
                _answer(
                    ok=error is None,
                    traffic=traffic.describe() if traffic is not None else None,
                    seconds=time.monotonic() - start,
                    error_type=type(error).__name__,
                    error=str(error) if error is not None else "",
                    kinds={r: f.kind.value for r, f in getattr(error, "failures", {}).items()},
                )
            elif "line" in command:
                name, _, rest = command["line"].partition(" ")
                shell.run_line_magic(name, rest)
                _answer(ok=True)
            elif "pull" in command:
                engine = magics.engine
                _answer(
                    ok=True, values=[engine.pull(command["pull"], r) for r in engine.ranks], hosts=engine.rank_hosts
                )
            elif "engines" in command:
                import ipyparallel as ipp

                client = ipp.Client(command["engines"])
                time.sleep(1.0)
                _answer(ok=True, engines=len(client.ids))
                client.close()
            elif command.get("quit"):
                magics._stop()
                _answer(ok=True)
                return
        except BaseException as exc:  # report, keep serving: the test decides
            _answer(ok=False, error_type=type(exc).__name__, error=str(exc), traceback=traceback.format_exc())


if __name__ == "__main__":
    main()
