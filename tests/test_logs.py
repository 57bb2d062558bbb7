"""extender.logs: one JSON object per line with the decision's fields, and no per-record work for fields the
formatter never writes (the caller's file / line, thread, process). Run in a child interpreter: the switches
are process-wide, and this test session's other loggers keep theirs."""

from __future__ import annotations

import subprocess
import sys

import orjson

_CHILD = r"""
import logging, sys
import orjson
from extender.logs import setup_logging

setup_logging("INFO")
seen = []
class Keep(logging.Handler):
    def emit(self, record):
        seen.append(record)
logging.getLogger().addHandler(Keep())
log = logging.getLogger("extender.webhook.verbs")
log.info("bind", extra={"pod": "ns/p", "node": "n1", "decision": {"retries": 0}})
log.debug("not at INFO", extra={"pod": "ns/q"})
r = seen[0]
print(orjson.dumps({"records": len(seen), "lineno": r.lineno, "func": r.funcName, "thread": r.thread,
                    "process": r.process, "processName": r.processName}).decode())
"""


def test_a_decision_line_is_json_with_its_fields_and_no_caller_lookup() -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True, timeout=60)
    lines = [orjson.loads(x) for x in done.stderr.splitlines()]
    assert len(lines) == 1, done.stderr  # the DEBUG line is below the level
    line = lines[0]
    assert line["level"] == "info" and line["msg"] == "bind" and line["logger"] == "extender.webhook.verbs"
    assert (line["pod"], line["node"], line["decision"]) == ("ns/p", "n1", {"retries": 0})
    assert "exception" not in line
    kept = orjson.loads(done.stdout)
    assert kept["records"] == 1
    # nothing walked the stack or asked for the thread / process: the formatter writes none of it
    assert (kept["lineno"], kept["func"]) == (0, "(unknown function)")
    assert kept["thread"] is None and kept["process"] is None and kept["processName"] is None


def test_an_unserialisable_extra_and_an_exception_still_make_one_line() -> None:
    child = r"""
import logging
from extender.logs import setup_logging
setup_logging("INFO")
try:
    raise ValueError("boom")
except ValueError:
    logging.getLogger("x").exception("failed", extra={"decision": {"at": object()}})
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True, timeout=60)
    (line,) = [orjson.loads(x) for x in done.stderr.splitlines()]
    assert line["level"] == "error" and line["decision"]["at"].startswith("<object object at")
    assert "ValueError: boom" in line["exception"]
