//go:build tools

// Package tools pins the Kubernetes control-plane and node commands built by hack/build-tools.sh.
// The blank imports keep `go mod tidy` from dropping the dependencies.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
