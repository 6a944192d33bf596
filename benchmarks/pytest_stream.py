"""pytest plugin: each test's outcome as one JSON line, written and flushed the moment the test finishes.

    python -m pytest -p benchmarks.pytest_stream --stream-jsonl PATH ...

pytest writes --junitxml only when it exits, so a device call killed at its time limit would lose every
result; this file keeps each finished test (nodeid, outcome, seconds, its record_property values such as
the measured softcap tanh error, and the first line of a failure) however the process ends.
"""
import json


def pytest_addoption(parser):
    parser.addoption("--stream-jsonl", default=None, metavar="PATH",
                     help="append one JSON line per test outcome to PATH as each test finishes")


class Stream:
    """Writes the lines to one file, line-buffered (each write is one whole line)."""

    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1)

    def pytest_runtest_logreport(self, report):
        if report.when != "call" and report.outcome == "passed":
            return                             # setup / teardown only matter when they fail or skip
        line = dict(nodeid=report.nodeid, when=report.when, outcome=report.outcome,
                    seconds=round(report.duration, 3), properties=dict(report.user_properties))
        if report.failed or report.skipped:
            line["message"] = short_message(report.longrepr)[:500]
        self.file.write(json.dumps(line, default=repr) + "\n")
        self.file.flush()

    def pytest_unconfigure(self, config):
        self.file.close()


def short_message(longrepr) -> str:
    """A failure's assertion message, or a skip's reason."""
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    if isinstance(longrepr, tuple):           # a skip: (path, line, reason)
        return str(longrepr[2])
    return (str(longrepr).strip().splitlines() or [""])[-1]


def pytest_configure(config):
    path = config.getoption("stream_jsonl")
    if path:
        config.pluginmanager.register(Stream(path), "stream-jsonl")
