"""The agent's durable memory: one JSON record per migration and role, written atomically.

A restarted agent reads these to finish or roll back what it was doing (see ``protocol.reconcile_*``).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Literal

import orjson

__all__ = ["Journal", "Role"]

Role = Literal["source", "destination"]


class Journal:
    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir
        for role in ("source", "destination"):
            (state_dir / "journal" / role).mkdir(parents=True, exist_ok=True)
        self.archives = state_dir / "archives"
        self.archives.mkdir(parents=True, exist_ok=True)

    def _path(self, role: Role, mid: str) -> Path:
        return self.root / "journal" / role / f"{mid}.json"

    def archive_dir(self, role: Role, mid: str) -> Path:
        return self.archives / role / mid

    def get(self, role: Role, mid: str) -> dict[str, Any] | None:
        try:
            data = orjson.loads(self._path(role, mid).read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def save(self, role: Role, record: dict[str, Any]) -> None:
        record["updated"] = time.time()
        path = self._path(role, str(record["id"]))
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            f.write(orjson.dumps(record, option=orjson.OPT_INDENT_2))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def all(self, role: Role) -> list[dict[str, Any]]:
        out = []
        for path in sorted((self.root / "journal" / role).glob("*.json")):
            rec = self.get(role, path.stem)
            if rec is not None:
                out.append(rec)
        return out

    def delete(self, role: Role, mid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(role, mid).unlink()
