#!/usr/bin/env python3
"""OCI runtime wrapper for docker engines whose root lacks capabilities (these CI machines: no CAP_SYS_RESOURCE).

`docker run --privileged` (every kind node) asks runc for every capability the engine knows; where the host's
bounding set lacks one, runc fails with "unable to apply caps: operation not permitted". This wrapper, set as the
engine's default runtime by hack/kind-up.sh only when a privileged probe container fails that way, removes from
the bundle's config.json (create/run) and from the --process file (exec) each capability missing from this
process's bounding set, then execs the real runc with the same arguments. Nothing else changes.
"""

from __future__ import annotations

import json
import os
import sys

# Linux capability numbers (include/uapi/linux/capability.h) -> the names OCI specs use.
NAMES = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE NET_BIND_SERVICE "
    "NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN "
    "SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE "
    "MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE"
).split()
RUNC = os.environ.get("QOS_REAL_RUNC") or "@RUNC@"


def bounding() -> set[str]:
    with open("/proc/self/status") as f:
        mask = int(next(line.split()[1] for line in f if line.startswith("CapBnd:")), 16)
    return {f"CAP_{n}" for i, n in enumerate(NAMES) if mask >> i & 1}


def strip(caps: dict[str, list[str]], allowed: set[str]) -> bool:
    changed = False
    for key, names in caps.items():
        kept = [c for c in names if c in allowed or c.removeprefix("CAP_") not in NAMES]
        changed |= kept != names
        caps[key] = kept
    return changed


def fix(path: str, process_only: bool) -> None:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return  # not ours to judge: runc reports it
    process = doc if process_only else doc.get("process", {})
    if strip(process.get("capabilities") or {}, bounding()):
        with open(path, "w") as f:
            json.dump(doc, f)


def main(argv: list[str]) -> None:
    args = argv[1:]
    for i, a in enumerate(args):
        if a in ("--bundle", "-b") and i + 1 < len(args):
            fix(os.path.join(args[i + 1], "config.json"), process_only=False)
        elif a.startswith("--bundle="):
            fix(os.path.join(a.split("=", 1)[1], "config.json"), process_only=False)
        elif a in ("--process", "-p") and i + 1 < len(args):
            fix(args[i + 1], process_only=True)
        elif a.startswith("--process="):
            fix(a.split("=", 1)[1], process_only=True)
    os.execv(RUNC, [RUNC, *args])


if __name__ == "__main__":
    main(sys.argv)
