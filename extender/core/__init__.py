"""Every decision, as pure functions over plain dataclasses: no I/O, no asyncio, no clock reads.

The webhook, controller, sidecar, agent and simulator are thin shells around this package; an
import-linter contract (pyproject.toml) and tests/test_purity.py keep it that way.
"""
