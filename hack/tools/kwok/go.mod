module github.com/kube-qos-extender/hack/tools/kwok

go 1.26.0

require sigs.k8s.io/kwok v0.8.0
