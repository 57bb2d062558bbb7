"""TEST-ONLY fault injection for the agent. Off by default; never enable it in a real cluster.

An agent started with ``--enable-test-fault-injection`` (or ``test_fault_injection: true`` in its config)
accepts ``PUT /v1/test/faults`` with ``{"faults": {"<point>": <times>}, "cut_after_bytes": n}``. Each named
point then fires ``times`` times (-1: every time) at one precise place of the protocol. Without the flag the
endpoint answers 404 and every hook is a no-op, so production code paths are the tested ones.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["FaultInjection", "FaultPoint", "InjectedFault"]

log = logging.getLogger("extender.agent.faults")


class FaultPoint(StrEnum):
    # source side
    SOURCE_CUT_TRANSFER = "source.transfer.cut"  # stop the upload after cut_after_bytes, dropping the connection
    SOURCE_CORRUPT_TRANSFER = "source.transfer.corrupt"  # flip one byte of the upload (declared sha256 stays)
    SOURCE_KILL_AFTER_CHECKPOINT = "source.kill.after-checkpoint"  # SIGKILL self once C1 is on disk
    SOURCE_KILL_AFTER_FINAL_DUMP = "source.kill.after-final-dump"  # SIGKILL self once C2 is on disk
    SOURCE_KILL_BEFORE_COMMIT = "source.kill.before-commit"  # SIGKILL self once the destination confirmed
    # destination side
    DEST_REFUSE_PREPARE = "destination.refuse.prepare"  # answer 409 to prepare
    DEST_REFUSE_RESTORE = "destination.refuse.restore"  # answer 409 to restore, restoring nothing
    DEST_FAIL_RESTORE = "destination.fail.restore"  # answer 500 to restore, restoring nothing (retried)
    DEST_KILL_DURING_TRANSFER = "destination.kill.during-transfer"  # SIGKILL self mid-upload
    DEST_KILL_BEFORE_RESTORE = "destination.kill.before-restore"  # SIGKILL self after journaling RESTORING
    DEST_KILL_AFTER_RESTORE = "destination.kill.after-restore"  # SIGKILL self after restoring, before answering


class InjectedFault(Exception):
    """Raised by a hook that simulates an error (as opposed to killing the process)."""


@dataclass(slots=True)
class FaultInjection:
    enabled: bool = False
    remaining: dict[FaultPoint, int] = field(default_factory=dict)
    cut_after_bytes: int = 4096
    fired: list[str] = field(default_factory=list)

    def configure(self, body: Any) -> None:
        if not self.enabled:
            raise PermissionError("test fault injection is disabled on this agent")
        if not isinstance(body, dict):
            raise ValueError("faults body must be an object")
        faults = body.get("faults", {})
        if not isinstance(faults, dict):
            raise ValueError("faults must be an object {point: times}")
        parsed: dict[FaultPoint, int] = {}
        for name, times in faults.items():
            try:
                point = FaultPoint(name)
            except ValueError:
                raise ValueError(f"unknown fault point {name!r} (known: {', '.join(FaultPoint)})") from None
            if isinstance(times, bool) or not isinstance(times, int) or times < -1:
                raise ValueError(f"times for {name} must be an integer >= -1")
            parsed[point] = times
        cut = body.get("cut_after_bytes", self.cut_after_bytes)
        if isinstance(cut, bool) or not isinstance(cut, int) or cut < 0:
            raise ValueError("cut_after_bytes must be an integer >= 0")
        self.remaining = parsed
        self.cut_after_bytes = cut
        self.fired = []

    def fires(self, point: FaultPoint) -> bool:
        """True (and one use consumed) when ``point`` is armed. Always False when disabled."""
        if not self.enabled:
            return False
        left = self.remaining.get(point, 0)
        if left == 0:
            return False
        if left > 0:
            self.remaining[point] = left - 1
        self.fired.append(point.value)
        log.warning("TEST FAULT INJECTED", extra={"decision": {"fault": point.value}})
        return True

    def maybe_kill(self, point: FaultPoint) -> None:
        if self.fires(point):
            for handler in logging.getLogger().handlers:
                handler.flush()
            if os.getpid() == 1:
                # PID 1 of a container (the agent in its DaemonSet pod): the kernel ignores a SIGKILL it sends
                # itself, so the hook silently did nothing on real nodes. _exit ends it as abruptly (no
                # cleanup, no finally blocks); the kubelet restarts the container either way.
                os._exit(128 + signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)

    def snapshot(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "remaining": {p.value: n for p, n in self.remaining.items()},
            "cut_after_bytes": self.cut_after_bytes,
            "fired": list(self.fired),
        }
