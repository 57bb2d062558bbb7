"""Graceful stop for the long-running shells (serve, autoscaler, agent): SIGTERM (kubelet) and SIGINT (a
terminal) set one Event, so each shell runs its own cleanup in ``finally`` instead of dying mid-write."""

from __future__ import annotations

import asyncio
import contextlib
import signal

__all__ = ["stop_event"]


def stop_event() -> asyncio.Event:
    """An Event set by SIGTERM or SIGINT on the running loop (where the platform lets us install handlers)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop
