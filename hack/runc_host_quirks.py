#!/usr/bin/python3
"""runc for the CRI-O real nodes of hack/real-nodes.sh: usage `runc_host_quirks.py REAL_RUNC ARGS...`.

Only for this machine's quirks (containerd copes with both by itself); everything else passes straight through:

- root lacks CAP_SYS_RESOURCE here, so runc cannot lower oom_score_adj below the caller's (the pod infra
  container asks -998, Guaranteed containers -997: `nsexec: failed to update /proc/self/oom_score_adj:
  Permission denied`). containerd has `restrict_oom_score_adj` for that; CRI-O 1.34 has no such option (its
  only path, the `_CRIO_ROOTLESS` environment, also drops every memory/CPU/pids limit on cgroup v1). So, like
  containerd's option, a `create`/`run`/`restore` bundle's config.json (and an `exec` --process file) asking for
  less than this process's own oom_score_adj is given that value.
- cgroup v1 with the hugetlb controller bound to the unified (v2) hierarchy, not mounted as a v1 one: CRI-O
  sees hugetlb in /proc/cgroups and passes the kubelet's hugepage limits (0 for each page size), which runc's
  v1 manager cannot apply (`cannot set hugetlb limit: container could not join or create cgroup`). Then the
  bundle's hugepageLimits are dropped (no pod here can use huge pages: there is no hugetlb cgroup to charge).
Then the real runc runs with the same arguments.
"""
import json
import os
import sys

# runc global options that take a value (runc --help)
GLOBAL_WITH_VALUE = {"--root", "--log", "--log-format", "--criu", "--rootless"}


def option(args, *names):
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(n + "="):
                return a[len(n) + 1:]
    return None


def hugetlb_unusable():
    """cgroup v1 (some v1 hierarchy mounted) and none of them carries hugetlb"""
    v1 = hugetlb = False
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] == "cgroup":
                v1 = True
                hugetlb = hugetlb or "hugetlb" in fields[sep + 3].split(",")
    return v1 and not hugetlb


def fix(path, in_process):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return
    changed = False
    proc = doc if in_process else doc.get("process")
    if isinstance(proc, dict) and proc.get("oomScoreAdj") is not None:
        with open("/proc/self/oom_score_adj") as f:
            own = int(f.read().strip())
        if proc["oomScoreAdj"] < own:
            proc["oomScoreAdj"] = own
            changed = True
    resources = (doc.get("linux") or {}).get("resources") or {}
    if not in_process and resources.get("hugepageLimits") and hugetlb_unusable():
        del resources["hugepageLimits"]
        changed = True
    if not changed:
        return
    tmp = f"{path}.quirks.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def main():
    runc, args = sys.argv[1], sys.argv[2:]
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in GLOBAL_WITH_VALUE else 1
    if i < len(args):
        cmd, rest = args[i], args[i + 1:]
        if cmd in ("create", "run", "restore"):
            bundle = option(rest, "--bundle", "-b") or os.getcwd()
            fix(os.path.join(bundle, "config.json"), in_process=False)
        elif cmd == "exec":
            process = option(rest, "--process", "-p")
            if process:
                fix(process, in_process=True)
    os.execv(runc, [runc] + args)


if __name__ == "__main__":
    main()
