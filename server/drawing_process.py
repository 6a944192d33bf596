"""The drawing process's entry point (`python -m server.drawing_process`, started by server.drawing.Drawing): the
server's thread and memory policy, then server.drawing.serve on its pipes. Apart from server.drawing, which
server.memory reads for its budget, so that neither imports the other."""
from __future__ import annotations

import os
import sys

from server.admission import LANES
from server.drawing import idle_exit_s, serve
from server.memory import configure_malloc_arenas, configure_threads, start_idle_trim


def main() -> None:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())   # a stray print goes to the log, not into the answers
    configure_threads()
    configure_malloc_arenas()
    start_idle_trim()
    import explorer.views                               # noqa: F401 — imported before it says it is ready
    serve(sys.stdin.buffer, answers, idle_exit_s(), LANES["forward"].running)   # as many at once as the lane runs


if __name__ == "__main__":
    main()
