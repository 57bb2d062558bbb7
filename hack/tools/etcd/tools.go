//go:build tools

// Package tools pins etcd (go.etcd.io/etcd/server/v3, whose root package is the etcd command),
// built by hack/build-tools.sh. Separate module: etcd's gRPC/otel versions differ from Kubernetes'.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
