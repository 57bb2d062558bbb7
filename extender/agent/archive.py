"""Checkpoint archives on disk: pack an image directory into a tar, hash it, unpack it safely.

Uncompressed tar: CRIU images are mostly page data that compresses poorly and a migration is latency-bound;
the sha256 travels beside the stream (``X-Qos-Archive-Sha256``) so the destination verifies before it restores.
Blocking functions; the agent calls them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = ["CHUNK", "ArchiveInfo", "hash_file", "pack_dir", "remove_path", "unpack"]

CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class ArchiveInfo:
    path: Path
    size: int
    sha256: str

    def to_json(self) -> dict[str, object]:
        return {"path": str(self.path), "size": self.size, "sha256": self.sha256}


def hash_file(path: Path) -> ArchiveInfo:
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return ArchiveInfo(path, size, h.hexdigest())


def pack_dir(src: Path, dest: Path) -> ArchiveInfo:
    """Tar the regular files of ``src`` (flat, sorted, fixed metadata) into ``dest`` atomically."""
    tmp = dest.with_name(dest.name + ".part")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(src.iterdir()):
            if entry.is_file() and not entry.is_symlink():
                info = tar.gettarinfo(str(entry), arcname=entry.name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with entry.open("rb") as f:
                    tar.addfile(info, f)
    os.replace(tmp, dest)
    return hash_file(dest)


class UnsafeArchiveError(tarfile.TarError):
    """An archive member that is not a plain file or directory inside the destination."""


def unpack(archive: Path, dest: Path) -> list[str]:
    """Extract ``archive`` into a fresh ``dest``: regular files and directories only, none outside ``dest``.

    With tarfile's 'data' filter where Python has it (3.11.4+, 3.12+); the image's Python (Debian bookworm's
    3.11.2) has no extraction filters, so the same checks are made here first either way: no links, no devices,
    no absolute or ``..`` names, permissions reduced to rwx (no setuid/setgid/sticky), owned by whoever unpacks."""
    remove_path(dest)
    dest.mkdir(parents=True)
    with tarfile.open(archive, "r:") as tar:
        members = tar.getmembers()
        for m in members:
            if not (m.isfile() or m.isdir()):
                raise UnsafeArchiveError(f"archive member {m.name!r} is not a regular file")
            parts = PurePosixPath(m.name).parts
            if m.name.startswith("/") or ".." in parts or not parts:
                raise UnsafeArchiveError(f"archive member {m.name!r} points outside the destination")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Python < 3.11.4 (the image)
            for m in members:
                m.mode &= 0o777
                m.uid = m.gid = os.getuid()
                m.uname = m.gname = ""
            tar.extractall(dest, members=members, numeric_owner=True)
    return sorted(m.name for m in members)


def remove_path(path: Path) -> None:
    """Remove a file or a directory tree; absent is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
