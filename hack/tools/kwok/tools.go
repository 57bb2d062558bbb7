//go:build tools

// Package tools pins sigs.k8s.io/kwok/cmd/kwok, built by hack/build-tools.sh.
// Separate module: kwok needs newer k8s.io libraries than the pinned control plane.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
