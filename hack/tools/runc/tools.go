//go:build tools

// Package tools pins runc (built with cgo and the seccomp tag by hack/build-tools.sh).
package tools

import (
	_ "github.com/opencontainers/runc"
)
