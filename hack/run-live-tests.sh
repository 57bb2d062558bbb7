#!/usr/bin/env bash
# Run the tests marked `live` (tests/ and e2e/) against real clusters, one after the other:
#  1. the full local topology (hack/local-up.sh with QOS_WITH_EXTENDER=1: the real extender as a host process,
#     the marker managedResources, Prometheus scraping it; kwok nodes made by each test): every `live` test
#     except those marked `deployed`;
#  2. (on demand: QOS_LIVE_PHASES=2) the product on this project's own real kubelet nodes (hack/real-nodes.sh:
#     kubelets + containerd in network namespaces of this host; the host kube-scheduler serves only
#     default-scheduler): the tests marked `deployed`, config/local applied by hack/deploy-local.sh;
#  3. the product as users install it, on kind (hack/kind-up.sh: a control plane and three workers, one service
#     and two batch, CRIU in the node image; kwok and Prometheus in the cluster; config/kind applied): every test
#     marked `deployed` (test_deployed, migration and its faults, consolidation, co-location, the agents'
#     identity, leader election). The cluster is deleted afterwards (`kind export logs` into $QOS_KIND_STATE.logs
#     first, on failure); no kind container may be left and the host must have its sysctls back.
#  5. CRI-O nodes (issue 32): hack/local-up.sh with two real nodes whose runtime is CRI-O (QOS_NODE_RUNTIME=crio,
#     hack/build-crio.sh), the product from config/local-crio (config/local + the agent's CRI-O component), and
#     the migrations on them: e2e/test_migration_crio_real.py (marker `crio`) and the owned-pod moves of
#     e2e/test_migration_owned_real.py. Same clean-up checks as 2.
#  4. the install a user runs: a kind cluster with one worker and nothing of ours (QOS_KIND_DEPLOY=none), then
#     README.md's "Install on your cluster" commands, `helm install` to `helm uninstall` (marker `helm`:
#     e2e/test_helm_install.py). Same clean-up checks as 3.
# With KUBECONFIG set, that cluster is used as it is for phase 1 only (it must run the extender: e2e needs
# EXTENDER_URL, EXTENDER_CA, EXTENDER_CLIENT_CERT/KEY and PROMETHEUS_URL too). Each cluster lives under its own
# $QOS_STATE and is removed afterwards (logs kept on failure). QOS_LIVE_PHASES="1 3 4 5" (the default) selects phases.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
PYTEST="${ROOT}/.venv/bin/pytest"
PHASES="${QOS_LIVE_PHASES:-1 3 4 5}"
SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory)

check_sysctls() { # <before> <what>: the host got back the sysctls the kubelets changed
  local now
  now="$(sysctl "${SYSCTLS[@]}")"
  [[ "${now}" == "$1" ]] && return 0
  printf 'host sysctls not restored after %s:\nbefore:\n%s\nafter:\n%s\n' "$2" "$1" "${now}" >&2
  return 1
}

run_in_kind() { # <state> <cluster> <deploy: config|none> <kind-up specs...> -- <pytest args...>
  local state="$1" cluster="$2" deploy="$3" rc=0 specs=()
  shift 3
  while (($#)) && [[ "$1" != -- ]]; do specs+=("$1"); shift; done
  shift
  (
    export QOS_KIND_STATE="${state}" QOS_KIND_CLUSTER="${cluster}" QOS_KIND_DEPLOY="${deploy}"
    cleanup() {
      local rc=$?
      if ((rc != 0)); then
        rm -rf "${state}.logs"
        "${QOS_CACHE:-${HOME}/.cache/kube-qos-extender}/kind/$(sed -n 's/^KIND_VERSION=//p' hack/versions.env)/bin/kind" \
          export logs "${state}.logs" --name "${cluster}" >/dev/null 2>&1 || true
        echo "live tests on kind failed: logs kept in ${state}.logs" >&2
      fi
      hack/kind-up.sh --down || true
    }
    trap cleanup EXIT
    t0=${SECONDS}
    out="$(hack/kind-up.sh "${specs[@]}")" || { echo "kind-up failed" >&2; exit 1; }
    echo "kind-up: $((SECONDS - t0)) s" >&2
    while IFS= read -r line; do [[ "${line}" == *=* ]] && export "${line?}"; done <<< "${out}"
    t1=${SECONDS}
    prc=0
    "${PYTEST}" "$@" || prc=$?
    echo "live tests on kind: $((SECONDS - t1)) s (rc ${prc})" >&2
    exit "${prc}"
  ) || rc=$?
  return "${rc}"
}

run_in_cluster() { # <state dir> <local-up env+args...> -- <pytest args...>
  local state="$1"
  shift
  local up=() rc=0
  while (($#)) && [[ "$1" != -- ]]; do up+=("$1"); shift; done
  shift
  (
    export QOS_STATE="${state}"
    cleanup() {
      local rc=$?
      if ((rc == 0)); then hack/local-down.sh; else
        echo "live tests failed: logs kept in ${QOS_STATE}/logs" >&2
        hack/local-down.sh --keep-logs || true
      fi
    }
    trap cleanup EXIT
    # errexit does not apply inside a subshell whose status is tested (`|| rc=$?` below): every step that can
    # fail exits explicitly, or a failed local-up would run pytest without a cluster and report success.
    t0=${SECONDS}
    out="$(env "${up[@]}")" || { echo "local-up (${up[*]}) failed" >&2; exit 1; }
    echo "local-up (${up[*]}): $((SECONDS - t0)) s" >&2
    while IFS= read -r line; do [[ "${line}" == *=* ]] && export "${line?}"; done <<< "${out}"
    t1=${SECONDS}
    prc=0
    "${PYTEST}" "$@" || prc=$?
    echo "live tests in ${QOS_STATE}: $((SECONDS - t1)) s (rc ${prc})" >&2
    exit "${prc}"
  ) || rc=$?
  return "${rc}"
}

rc=0
if [[ -n "${KUBECONFIG:-}" ]]; then
  echo "live tests against ${KUBECONFIG}" >&2
  "${PYTEST}" -m "live and not deployed" tests e2e "$@" || rc=$?
  exit "${rc}"
fi
for phase in ${PHASES}; do
  case "${phase}" in
    # No kwok nodes: every test creates (and deletes) its own, and the autoscaler test needs an empty cluster.
    1) run_in_cluster "${QOS_STATE:-/tmp/qos-ci}" QOS_WITH_EXTENDER=1 hack/local-up.sh -- \
         -m "live and not deployed and not helm" tests e2e "$@" || rc=$? ;;
    # The product: no host extender, no hack/manifests webhook, the host scheduler without the qos profile;
    # one real node per node group (containers really run there), kwok nodes for the autoscaler to add.
    2) host_sysctls="$(sysctl "${SYSCTLS[@]}")"
       run_in_cluster "${QOS_DEPLOYED_STATE:-/tmp/qos-ci-deployed}" QOS_WITH_EXTENDER=0 QOS_HOST_QOS_PROFILE=0 \
         QOS_MANIFESTS_DIR=none hack/local-up.sh real:service:m1.medium=1 real:batch:m1.large=2 -- \
         -m deployed e2e "$@" || rc=$?
       # local-down must remove everything real nodes made (namespaces, links, cgroups, mounts, processes)
       hack/real-nodes.sh leftovers || rc=1
       # ... and give the host back the sysctls its kubelets changed
       check_sysctls "${host_sysctls}" "the real nodes" || rc=1 ;;
    5) host_sysctls="$(sysctl "${SYSCTLS[@]}")"
       # (both for local-up and for the tests: the product fixture runs hack/deploy-local.sh with QOS_OVERLAY)
       QOS_NODE_RUNTIME=crio QOS_OVERLAY=config/local-crio run_in_cluster "${QOS_CRIO_STATE:-/tmp/qos-ci-crio}" \
         QOS_WITH_EXTENDER=0 QOS_HOST_QOS_PROFILE=0 QOS_MANIFESTS_DIR=none \
         hack/local-up.sh real:service:m1.medium=1 real:batch:m1.large=1 -- \
         -m deployed e2e/test_migration_crio_real.py e2e/test_migration_owned_real.py "$@" || rc=$?
       hack/real-nodes.sh leftovers || rc=1
       check_sysctls "${host_sysctls}" "the CRI-O real nodes" || rc=1 ;;
    3|4) host_sysctls="$(sysctl "${SYSCTLS[@]}")"
       if [[ "${phase}" == 3 ]]; then
         cluster="${QOS_KIND_CLUSTER:-qos-ci}"
         run_in_kind "${QOS_KIND_STATE:-/tmp/qos-ci-kind}" "${cluster}" config service:m1.medium=1 batch:m1.large=2 \
           -- -m "deployed and not crio" e2e "$@" || rc=$?
       else
         cluster="${QOS_HELM_KIND_CLUSTER:-qos-ci-helm}"
         run_in_kind "${QOS_HELM_KIND_STATE:-/tmp/qos-ci-helm}" "${cluster}" none service:m1.medium=1 \
           -- -m helm e2e "$@" || rc=$?
       fi
       # --down deletes every container and the network kind made, and restores the host's sysctls
       if docker ps -a --filter "label=io.x-k8s.kind.cluster=${cluster}" -q | grep -q .; then
         echo "kind containers left after hack/kind-up.sh --down" >&2
         rc=1
       fi
       check_sysctls "${host_sysctls}" "kind" || rc=1 ;;
    *) echo "unknown phase ${phase}" >&2; exit 2 ;;
  esac
done
exit "${rc}"
