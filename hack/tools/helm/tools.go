//go:build tools

// Package tools pins helm.sh/helm/v3/cmd/helm, built by hack/build-helm.sh.
// Separate module: Helm's k8s.io libraries differ from the pinned control plane's.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
