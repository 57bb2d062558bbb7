"""Graceful stop for the long-running shells (serve, autoscaler, agent): SIGTERM (kubelet) and SIGINT (a
terminal) set one Event, so each shell runs its own cleanup in ``finally`` instead of dying mid-write; and the
periodic pass those shells share (the agents' issuer, the certificate keeper, the slack refresh), which the
same Event ends at once instead of after a sleep."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable

__all__ = ["every", "stop_event"]


def stop_event() -> asyncio.Event:
    """An Event set by SIGTERM or SIGINT on the running loop (where the platform lets us install handlers)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


async def every(
    interval_seconds: float,
    step: Callable[[], Awaitable[object]],
    stop: asyncio.Event,
    *,
    log: logging.Logger,
    failed: str,
    traceback: bool = False,
) -> None:
    """Run ``step`` now and then every interval until ``stop`` is set. A failing step (the API unreachable) is
    logged as ``failed`` on ``log`` and tried again next time: never fatal to the process."""
    while not stop.is_set():
        try:
            await step()
        except Exception as exc:
            if traceback:
                log.exception(failed, extra={"error": repr(exc)})
            else:
                log.warning(failed, extra={"error": str(exc)})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_seconds)
