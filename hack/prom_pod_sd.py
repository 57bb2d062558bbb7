#!/usr/bin/env python3
"""Prometheus file_sd targets for pods, refreshed every few seconds (local clusters only).

Why: Debian's Prometheus is built without kubernetes_sd_configs, and the local cluster has no
prometheus-operator to turn config/'s ServiceMonitor into scrape targets. This writes the pods matching a
label selector (their IP and the port of a named container port, node and pod as labels) to a file_sd JSON
file, atomically, so the local Prometheus scrapes what a ServiceMonitor would select in a real cluster.

Usage: prom_pod_sd.py --kubectl BIN --kubeconfig FILE --namespace NS --selector SEL --port-name NAME --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time


def targets(doc: dict, port_name: str) -> list[dict]:
    out = []
    for pod in doc.get("items", []):
        ip = pod.get("status", {}).get("podIP")
        if not ip or pod.get("status", {}).get("phase") != "Running":
            continue
        # a native sidecar (init container with restartPolicy Always) serves for the pod's whole life, as
        # Prometheus' kubernetes_sd lists it too
        spec = pod.get("spec", {})
        sidecars = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
        for c in (spec.get("containers") or []) + sidecars:
            for port in c.get("ports") or []:
                if port.get("name") == port_name:
                    meta = pod["metadata"]
                    out.append(
                        {
                            "targets": [f"{ip}:{port['containerPort']}"],
                            "labels": {
                                "pod": meta["name"],
                                "namespace": meta["namespace"],
                                "node": pod["spec"].get("nodeName", ""),
                                "container": c["name"],
                            },
                        }
                    )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--kubectl", "--kubeconfig", "--namespace", "--selector", "--port-name", "--out"):
        p.add_argument(flag, required=True)
    p.add_argument("--interval", type=float, default=3.0)
    a = p.parse_args()
    last = None
    while True:
        cmd = [a.kubectl, "--kubeconfig", a.kubeconfig, "get", "pods", "-n", a.namespace, "-l", a.selector, "-o", "json"]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode == 0:
            body = json.dumps(targets(json.loads(res.stdout), a.port_name), sort_keys=True)
            if body != last:
                tmp = f"{a.out}.tmp"
                with open(tmp, "w") as f:
                    f.write(body)
                os.replace(tmp, a.out)
                last = body
        time.sleep(a.interval)


if __name__ == "__main__":
    main()
