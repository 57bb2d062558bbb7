"""The counter pods' ``tick N`` lines with their kubelet timestamps: what "no lost progress" is measured against,
shared by the real-node migration e2e tests and ``bench/migration_faults.py``."""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
from datetime import datetime
from pathlib import Path

TICK = re.compile(r"^(\S+) tick (\d+)$")


def rfc3339(stamp: str) -> float:
    """Seconds since the epoch of a kubelet timestamp (2026-11-22T20:01:02.123456789Z): Python's parser takes
    at most microseconds, so the fraction is added by hand."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z", stamp)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {stamp!r}")
    return datetime.fromisoformat(m.group(1) + "+00:00").timestamp() + float(m.group(2) or 0)


def parse_ticks(lines: str) -> list[tuple[float, int]]:
    """(timestamp, count) of every tick line of ``kubectl logs --timestamps`` output; other lines are skipped."""
    return [(rfc3339(m.group(1)), int(m.group(2))) for line in lines.splitlines() if (m := TICK.match(line.strip()))]


def logged_ticks(
    bin_dir: Path, env: dict[str, str], ns: str, pod: str, container: str | None = None
) -> list[tuple[float, int]]:
    """The pod's (its ``container``'s) ticks logged so far; raises with kubectl's stderr when they cannot be read."""
    which = ["-c", container] if container else []
    out = subprocess.run([str(bin_dir / "kubectl"), "logs", "--timestamps", "-n", ns, pod, *which], env=env,
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"kubectl logs {ns}/{pod} failed ({out.returncode}): {out.stderr[-2000:]}")
    return parse_ticks(out.stdout)


class LogFollower:
    """``kubectl logs -f --timestamps`` of a pod in a thread: every tick with its kubelet timestamp until the pod
    (and so the stream) goes away: the ticks printed around a checkpoint survive the source pod's deletion."""

    def __init__(self, bin_dir: Path, env: dict[str, str], ns: str, pod: str) -> None:
        self.ticks: list[tuple[float, int]] = []
        self.proc = subprocess.Popen(
            [str(bin_dir / "kubectl"), "logs", "-f", "--timestamps", "-n", ns, pod],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.ticks.extend(parse_ticks(line))

    def stop(self) -> list[tuple[float, int]]:
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.thread.join(10)
        return list(self.ticks)
