#!/usr/bin/env bash
# Deploy kube-qos-extender into the cluster of $KUBECONFIG the way a user installs it: config/local (=
# config/default: qos-scheduler + QoS controller, node agents, autoscaler; adapted to this project's local real
# cluster, see config/local/kustomization.yaml), rendered with `kubectl kustomize`, applied server-side.
#
# Usage: hack/deploy-local.sh [--dry-run]
#   --dry-run   everything is sent with --dry-run=server (Secrets included) and no rollout is awaited; only
#               the two namespaces are created for real (objects can be dry-run only into an existing one)
#
# What it does:
#  1. TLS material (openssl; kept in $QOS_STATE/certs/deploy-local, reissued when missing, expiring within 30
#     days, not signed by the current CA, or when its SANs changed):
#     signed by the local CA ($QOS_STATE/certs/ca.{crt,key} from hack/local-up.sh, which the API server and
#     the kubelets trust for client certificates):
#       extender serving (SANs 127.0.0.1, localhost and the DNS names of Service qos-extender, which the
#       admission webhook calls), kube-scheduler -> extender client, Prometheus metrics client, the autoscaler's
#       gRPC expander serving certificate (SAN qos-autoscaler-expander.kube-qos-system.svc) and its /metrics
#       serving certificate (SAN qos-autoscaler.kube-qos-system.svc);
#     signed by a CA of the agents' own ($QOS_STATE/certs/deploy-local/agent-ca.*; it must not be the cluster
#     CA): the consolidation flow's client certificate (CN qos-autoscaler-consolidation: starts migrations)
#     and Prometheus' (CN qos-agent-metrics: /metrics only). The agents' own certificates are NOT made here:
#     each agent asks for its node's through the CSR API and qos-agent-issuer signs it with this CA, whose key
#     it alone receives (Secret qos-agent-issuer-ca; extender/agent/identity.py).
#  2. The Secrets config/ names (server-side apply: idempotent, no last-applied copy of the keys):
#       kube-qos-system: qos-extender-tls, qos-extender-metrics-client, qos-autoscaler-expander-tls,
#                        qos-autoscaler-metrics-tls, qos-autoscaler-agent-client
#       kube-qos-agent:  qos-agent-issuer-ca, qos-agent-metrics-client; ConfigMap qos-agent-ca (the agents' CA
#                        and the kubelets' serving CA)
#  3. `kubectl kustomize config/local`, the local CA set as the caBundle of MutatingWebhookConfiguration
#     qos-extender-ordering (config/controller expects cert-manager to inject it; not here), server-side apply.
#     A qos-extender-ordering left by hack/local-up.sh (hack/manifests: clientConfig.url = the extender on the
#     host) is replaced: a webhook has a url or a service, not both.
#  4. Waits for the rollouts (QOS_DEPLOY_TIMEOUT, default 300s) and prints KEY=VALUE lines on stdout (also
#     written to $QOS_STATE/deploy.env, except in a dry run); everything else goes to stderr.
#
# Environment: KUBECONFIG (default $QOS_STATE/kubeconfig/admin.kubeconfig), QOS_STATE=/tmp/qos-local,
#   QOS_OVERLAY=config/local (hack/kind-up.sh: config/kind; its certificates' CA is $QOS_STATE/certs/ca too),
#   QOS_KUBELET_CA (CA of the kubelets' serving certificates; default the local CA), QOS_DEPLOY_TIMEOUT=300s,
#   QOS_BIN_DIR (kubectl; default hack/build-tools.sh's cache, then PATH).
# Needs: the images kube-qos-extender:dev and registry.k8s.io/kube-scheduler:v1.35.8 in every real node's
#   containerd (imagePullPolicy Never), openssl, python3 with PyYAML. No cert-manager, no prometheus-operator.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0; fi
DRY_RUN=0
if [[ "${1:-}" == --dry-run ]]; then DRY_RUN=1; shift; fi
(($# == 0)) || die "unknown argument: $1 (see --help)"

QOS_STATE="${QOS_STATE:-/tmp/qos-local}"
OVERLAY="${QOS_OVERLAY:-config/local}"
[[ -s "${REPO_ROOT}/${OVERLAY}/kustomization.yaml" ]] || die "QOS_OVERLAY ${OVERLAY}: no kustomization.yaml in ${REPO_ROOT}/${OVERLAY}"
NS=kube-qos-system
AGENT_NS=kube-qos-agent
WEBHOOK=qos-extender-ordering
TIMEOUT="${QOS_DEPLOY_TIMEOUT:-300s}"
export KUBECONFIG="${KUBECONFIG:-${QOS_STATE}/kubeconfig/admin.kubeconfig}"
[[ -s "${KUBECONFIG%%:*}" ]] || die "KUBECONFIG ${KUBECONFIG} not found (run hack/local-up.sh, or set KUBECONFIG)"
if [[ -n "${QOS_BIN_DIR:-}" && -x "${QOS_BIN_DIR}/kubectl" ]]; then KUBECTL_BIN="${QOS_BIN_DIR}/kubectl"
elif [[ -x "${BIN_DIR}/kubectl" ]]; then KUBECTL_BIN="${BIN_DIR}/kubectl"
else KUBECTL_BIN="$(command -v kubectl)" || die "kubectl is required (hack/build-tools.sh)"; fi
K=("${KUBECTL_BIN}")
for b in openssl python3; do command -v "${b}" >/dev/null || die "${b} is required"; done
python3 -c 'import yaml' 2>/dev/null || die "python3 needs PyYAML"

CA_DIR="${QOS_STATE}/certs"
[[ -s "${CA_DIR}/ca.crt" && -s "${CA_DIR}/ca.key" ]] || die "local CA ${CA_DIR}/ca.{crt,key} missing (hack/local-up.sh makes it)"
KUBELET_CA="${QOS_KUBELET_CA:-${CA_DIR}/ca.crt}"
[[ -s "${KUBELET_CA}" ]] || die "QOS_KUBELET_CA ${KUBELET_CA} not found"
C="${CA_DIR}/deploy-local"
mkdir -p "${C}"
chmod 700 "${C}"
WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT
APPLY=(apply --server-side --force-conflicts --field-manager=qos-deploy-local)
DRY=()
if [[ "${DRY_RUN}" == 1 ]]; then DRY=(--dry-run=server); fi

# ---------------------------------------------------------------- render (first: the names come from it)
log "render: kubectl kustomize ${OVERLAY}"
"${K[@]}" kustomize "${REPO_ROOT}/${OVERLAY}" > "${WORK}/rendered.yaml" || die "kubectl kustomize ${OVERLAY} failed"
# The webhook's Service (namespace/name) -> the DNS names its serving certificate must carry.
read -r WEBHOOK_SVC_NS WEBHOOK_SVC_NAME < <(python3 - "${WORK}/rendered.yaml" "${WEBHOOK}" <<'PY'
import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d["kind"] == "MutatingWebhookConfiguration" and d["metadata"]["name"] == sys.argv[2]:
        svc = d["webhooks"][0]["clientConfig"]["service"]
        print(svc["namespace"], svc["name"])
        break
else:
    sys.exit(f"no MutatingWebhookConfiguration {sys.argv[2]} in the render")
PY
) || die "cannot find the webhook's Service in the render"

# ---------------------------------------------------------------- certificates
# issue <name> <CA prefix> <subject> <extendedKeyUsage> [subjectAltName]
issue() {
  local name="$1" ca="$2" subj="$3" eku="$4" san="${5:-}"
  local crt="${C}/${name}.crt" key="${C}/${name}.key" spec="${C}/${name}.spec"
  local want
  want="${subj}|${eku}|${san}|$(openssl x509 -in "${ca}.crt" -noout -fingerprint -sha256)"
  if [[ -s "${crt}" && -s "${key}" && "$(cat "${spec}" 2>/dev/null)" == "${want}" ]] \
    && openssl verify -CAfile "${ca}.crt" "${crt}" >/dev/null 2>&1 \
    && openssl x509 -in "${crt}" -noout -checkend 2592000 >/dev/null; then
    return 0
  fi
  log "certs: issuing ${name} (${subj}${san:+; ${san}})"
  sign_cert "${ca}" "${C}/${name}" "${subj}" "${eku}" "${san}"
  echo "${want}" > "${spec}"
}

LOCAL_CA="${CA_DIR}/ca"
AGENT_CA="${C}/agent-ca"
if [[ ! -s "${AGENT_CA}.crt" ]] || ! openssl x509 -in "${AGENT_CA}.crt" -noout -checkend 2592000 >/dev/null; then
  log "certs: generating the agents' CA ${AGENT_CA}.crt"
  make_ca "${AGENT_CA}" kube-qos-agent-ca
fi

svc_names() { # <name> <namespace> -> DNS SAN list of a Service
  echo "DNS:$1,DNS:$1.$2,DNS:$1.$2.svc,DNS:$1.$2.svc.cluster.local"
}
EXTENDER_SAN="IP:127.0.0.1,DNS:localhost,$(svc_names qos-extender "${NS}")"
if [[ "${WEBHOOK_SVC_NAME}.${WEBHOOK_SVC_NS}" != "qos-extender.${NS}" ]]; then
  EXTENDER_SAN+=",$(svc_names "${WEBHOOK_SVC_NAME}" "${WEBHOOK_SVC_NS}")"
fi
issue extender-serving "${LOCAL_CA}" "/CN=kube-qos-extender" serverAuth "${EXTENDER_SAN}"
issue scheduler-client "${LOCAL_CA}" "/CN=kube-scheduler-extender-client" clientAuth
issue metrics-client "${LOCAL_CA}" "/CN=prometheus-extender-client" clientAuth
issue autoscaler-expander "${LOCAL_CA}" "/CN=qos-autoscaler-expander" serverAuth \
  "IP:127.0.0.1,DNS:localhost,$(svc_names qos-autoscaler-expander "${NS}")"
issue autoscaler-metrics "${LOCAL_CA}" "/CN=qos-autoscaler-metrics" serverAuth \
  "IP:127.0.0.1,DNS:localhost,$(svc_names qos-autoscaler "${NS}")"
# The agents' own certificates are not issued here: each agent asks for its node's through the CSR API, and
# qos-agent-issuer signs them with the agents' CA (config/agent/issuer.yaml; extender/agent/identity.py).
# Issued here from that CA: the callers' identities.
issue agent-metrics-client "${AGENT_CA}" "/CN=qos-agent-metrics" clientAuth
issue autoscaler-agent-client "${AGENT_CA}" "/O=kube-qos-extender/CN=qos-autoscaler-consolidation" clientAuth

# ---------------------------------------------------------------- namespaces and Secrets
python3 - "${WORK}/rendered.yaml" > "${WORK}/namespaces.yaml" <<'PY'
import sys, yaml
print(yaml.safe_dump_all([d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Namespace"]))
PY
"${K[@]}" "${APPLY[@]}" -f "${WORK}/namespaces.yaml" >&2

CHANGED=0  # a Secret's content changed: running pods must restart (they read their certificates at start)
data_of() { # a Secret's data (JSON on stdin; nothing on stdin: "null")
  python3 -c 'import json, sys; t = sys.stdin.read(); print(json.dumps(json.loads(t).get("data") if t.strip() else None, sort_keys=True))'
}
secret() { # <namespace> <name> key=file ...
  local ns="$1" name="$2" new old
  shift 2
  local args=()
  for kv in "$@"; do args+=("--from-file=${kv}"); done
  "${K[@]}" -n "${ns}" create secret generic "${name}" "${args[@]}" --dry-run=client -o json > "${WORK}/secret.json"
  new="$(data_of < "${WORK}/secret.json")"
  old="$("${K[@]}" -n "${ns}" get secret "${name}" -o json 2>/dev/null | data_of || true)"
  if [[ "${new}" != "${old}" ]]; then CHANGED=1; fi
  "${K[@]}" "${APPLY[@]}" "${DRY[@]}" -f "${WORK}/secret.json" >&2
}
secret "${NS}" qos-extender-tls ca.crt="${CA_DIR}/ca.crt" tls.crt="${C}/extender-serving.crt" \
  tls.key="${C}/extender-serving.key" client.crt="${C}/scheduler-client.crt" client.key="${C}/scheduler-client.key"
secret "${NS}" qos-extender-metrics-client ca.crt="${CA_DIR}/ca.crt" tls.crt="${C}/metrics-client.crt" \
  tls.key="${C}/metrics-client.key"
secret "${NS}" qos-autoscaler-expander-tls ca.crt="${CA_DIR}/ca.crt" tls.crt="${C}/autoscaler-expander.crt" \
  tls.key="${C}/autoscaler-expander.key"
# the autoscaler's /metrics over HTTPS; ca.crt verifies the scrapers' certificates (metrics.clients)
secret "${NS}" qos-autoscaler-metrics-tls ca.crt="${CA_DIR}/ca.crt" tls.crt="${C}/autoscaler-metrics.crt" \
  tls.key="${C}/autoscaler-metrics.key"
secret "${NS}" qos-autoscaler-agent-client ca.crt="${AGENT_CA}.crt" tls.crt="${C}/autoscaler-agent-client.crt" \
  tls.key="${C}/autoscaler-agent-client.key"
secret "${AGENT_NS}" qos-agent-issuer-ca tls.crt="${AGENT_CA}.crt" tls.key="${AGENT_CA}.key"
secret "${AGENT_NS}" qos-agent-metrics-client ca.crt="${AGENT_CA}.crt" tls.crt="${C}/agent-metrics-client.crt" \
  tls.key="${C}/agent-metrics-client.key"
# Public certificates only: the agents' CA (peers) and the kubelets' serving CA.
"${K[@]}" -n "${AGENT_NS}" create configmap qos-agent-ca --from-file=agents-ca.crt="${AGENT_CA}.crt" \
  --from-file=kubelet-ca.crt="${KUBELET_CA}" --dry-run=client -o json > "${WORK}/ca.json"
new_ca="$(python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["data"], sort_keys=True))' < "${WORK}/ca.json")"
old_ca="$("${K[@]}" -n "${AGENT_NS}" get configmap qos-agent-ca -o json 2>/dev/null \
  | python3 -c 'import json, sys; t = sys.stdin.read(); print(json.dumps(json.loads(t)["data"], sort_keys=True) if t.strip() else None)' || true)"
if [[ "${new_ca}" != "${old_ca}" ]]; then CHANGED=1; fi
"${K[@]}" "${APPLY[@]}" "${DRY[@]}" -f "${WORK}/ca.json" >&2

# ---------------------------------------------------------------- the webhook's caBundle, then apply
python3 - "${WORK}/rendered.yaml" "${WEBHOOK}" "${CA_DIR}/ca.crt" > "${WORK}/deploy.yaml" <<'PY'
import base64, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
bundle = base64.b64encode(open(sys.argv[3], "rb").read()).decode()
for d in docs:
    if d["kind"] == "MutatingWebhookConfiguration" and d["metadata"]["name"] == sys.argv[2]:
        for hook in d["webhooks"]:
            hook["clientConfig"]["caBundle"] = bundle
print(yaml.safe_dump_all(docs, sort_keys=False))
PY

# hack/local-up.sh's webhook of the same name points at the host extender (clientConfig.url).
existing_url="$("${K[@]}" get mutatingwebhookconfiguration "${WEBHOOK}" -o jsonpath='{.webhooks[0].clientConfig.url}' 2>/dev/null || true)"
if [[ -n "${existing_url}" ]]; then
  log "WARNING: replacing MutatingWebhookConfiguration ${WEBHOOK} (url ${existing_url}, from hack/local-up.sh) by the in-cluster one"
  if [[ "${DRY_RUN}" == 1 ]]; then
    python3 - "${WORK}/deploy.yaml" "${WEBHOOK}" "${WORK}/webhook.yaml" > "${WORK}/rest.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
hook = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration" and d["metadata"]["name"] == sys.argv[2]]
yaml.safe_dump_all(hook, open(sys.argv[3], "w"))
print(yaml.safe_dump_all([d for d in docs if d not in hook], sort_keys=False))
PY
    "${K[@]}" replace --dry-run=server -f "${WORK}/webhook.yaml" >&2
    mv "${WORK}/rest.yaml" "${WORK}/deploy.yaml"
  else
    "${K[@]}" delete mutatingwebhookconfiguration "${WEBHOOK}" >&2
  fi
fi
# Warn about what hack/local-up.sh itself runs on the host and this deployment duplicates.
if [[ -s "${QOS_STATE}/config/kube-scheduler.yaml" ]] && grep -q 'schedulerName: qos-scheduler' "${QOS_STATE}/config/kube-scheduler.yaml" \
  && [[ -s "${QOS_STATE}/pids/kube-scheduler.pid" ]] && kill -0 "$(cat "${QOS_STATE}/pids/kube-scheduler.pid")" 2>/dev/null; then
  log "WARNING: hack/local-up.sh's kube-scheduler on the host also serves profile qos-scheduler: two schedulers for the same pods"
fi
if [[ -s "${QOS_STATE}/pids/qos-extender.pid" ]] && kill -0 "$(cat "${QOS_STATE}/pids/qos-extender.pid")" 2>/dev/null; then
  log "WARNING: hack/local-up.sh's extender runs on the host (QOS_START_EXTENDER=1): with its controller on, two controllers act on the same pods"
fi

WORKLOADS=("${NS} deployment/qos-scheduler" "${NS} deployment/qos-autoscaler" "${AGENT_NS} deployment/qos-agent-issuer"
  "${AGENT_NS} daemonset/qos-agent")
EXISTED=()
for w in "${WORKLOADS[@]}"; do
  read -r ns obj <<< "${w}"
  if "${K[@]}" -n "${ns}" get "${obj}" >/dev/null 2>&1; then EXISTED+=("${w}"); fi
done

# imagePullPolicy Never: every real node must hold the images already (the kubelet reports them in
# status.images; containerd names kube-qos-extender:dev docker.io/library/kube-qos-extender:dev).
IMAGES=(docker.io/library/kube-qos-extender:dev registry.k8s.io/kube-scheduler:v1.35.8)
while read -r node names; do
  [[ -n "${node}" ]] || continue
  for image in "${IMAGES[@]}"; do
    if [[ " ${names} " != *" ${image} "* ]]; then
      log "WARNING: node ${node} does not report image ${image}: its pods will fail with ErrImageNeverPull until it is imported"
    fi
  done
done < <("${K[@]}" get nodes -l 'type!=kwok' \
  -o jsonpath='{range .items[*]}{.metadata.name}{" "}{range .status.images[*]}{range .names[*]}{@}{" "}{end}{end}{"\n"}{end}')

# Same tag, new build: the image id of the tar hack/build-image.sh made (and hack/real-nodes.sh import loaded)
# goes into the pod templates that use it, so a rebuilt image rolls the workloads out (imagePullPolicy Never
# with a fixed tag would otherwise keep the old containers running).
IMAGE_TAR="${QOS_IMAGE_TAR:-${QOS_CACHE}/images/kube-qos-extender.tar}"
if [[ -f "${IMAGE_TAR}" ]]; then
  image_id="$(tar -xOf "${IMAGE_TAR}" manifest.json | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["Config"].split("/")[-1].removesuffix(".json"))')"
  python3 - "${WORK}/deploy.yaml" "${image_id}" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["kind"] in ("Deployment", "DaemonSet"):
        pod = d["spec"]["template"]
        if any(c.get("image", "").startswith("kube-qos-extender:") for c in pod["spec"]["containers"]):
            pod.setdefault("metadata", {}).setdefault("annotations", {})["qos.kube-qos-extender.io/image-id"] = sys.argv[2]
yaml.safe_dump_all(docs, open(sys.argv[1], "w"), sort_keys=False)
PY
  log "image: ${IMAGE_TAR} (id ${image_id:0:19})"
fi

log "apply: ${OVERLAY} (server-side$([[ "${DRY_RUN}" == 1 ]] && echo ', dry run'))"
"${K[@]}" "${APPLY[@]}" "${DRY[@]}" -f "${WORK}/deploy.yaml" >&2

# ---------------------------------------------------------------- rollout
if [[ "${DRY_RUN}" != 1 ]]; then
  if [[ "${CHANGED}" == 1 ]]; then
    # New certificates reach the mounted Secrets, but the processes read them at start only.
    for w in "${EXISTED[@]}"; do
      read -r ns obj <<< "${w}"
      log "rollout restart ${ns}/${obj}: the certificates changed"
      "${K[@]}" -n "${ns}" rollout restart "${obj}" >&2
    done
  fi
  for w in "${WORKLOADS[@]}"; do
    read -r ns obj <<< "${w}"
    log "rollout: ${ns}/${obj} (timeout ${TIMEOUT})"
    if ! "${K[@]}" -n "${ns}" rollout status "${obj}" --timeout="${TIMEOUT}" >&2; then
      "${K[@]}" -n "${ns}" get pods -o wide >&2 || true
      "${K[@]}" -n "${ns}" get events --sort-by=.lastTimestamp 2>/dev/null | tail -n 20 >&2 || true
      die "${ns}/${obj} did not roll out within ${TIMEOUT}"
    fi
  done
fi

# ---------------------------------------------------------------- result
{
  echo "KUBECONFIG=${KUBECONFIG}"
  echo "QOS_DEPLOY_DRY_RUN=${DRY_RUN}"
  echo "QOS_NAMESPACE=${NS}"
  echo "QOS_AGENT_NAMESPACE=${AGENT_NS}"
  echo "QOS_SCHEDULER_DEPLOYMENT=qos-scheduler"
  echo "QOS_AUTOSCALER_DEPLOYMENT=qos-autoscaler"
  echo "QOS_AGENT_DAEMONSET=qos-agent"
  echo "QOS_EXTENDER_SERVICE=qos-extender"
  echo "QOS_AUTOSCALER_SERVICE=qos-autoscaler"
  echo "QOS_WEBHOOK=${WEBHOOK}"
  echo "QOS_AGENT_PORT=9443"
  echo "QOS_DEPLOY_CERTS=${C}"
  echo "EXTENDER_CA=${CA_DIR}/ca.crt"
  echo "EXTENDER_CLIENT_CERT=${C}/metrics-client.crt"
  echo "EXTENDER_CLIENT_KEY=${C}/metrics-client.key"
  echo "AGENT_CA=${AGENT_CA}.crt"
  echo "AGENT_CLIENT_CERT=${C}/autoscaler-agent-client.crt"
  echo "AGENT_CLIENT_KEY=${C}/autoscaler-agent-client.key"
  echo "AGENT_METRICS_CERT=${C}/agent-metrics-client.crt"
  echo "AGENT_METRICS_KEY=${C}/agent-metrics-client.key"
} > "${WORK}/deploy.env"
# A dry run leaves the env file of a real deployment alone.
if [[ "${DRY_RUN}" != 1 ]]; then cp "${WORK}/deploy.env" "${QOS_STATE}/deploy.env"; fi
cat "${WORK}/deploy.env"
