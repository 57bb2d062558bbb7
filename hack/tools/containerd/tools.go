//go:build tools

// Package tools pins the node runtime built by hack/build-tools.sh for real (kubelet) nodes:
// containerd, ctr and the runc shim must come from one module (Debian's 1.6 shim is refused by 2.x).
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
