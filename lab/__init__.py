"""Lab tooling that is not the product: `make demo` (lab.demo) and the small synchronous Kubernetes client the demo,
bench/ and e2e/ drive clusters with (lab.kube_sync). Not in the wheel or the image: the package `extender` carries
only what a cluster runs (issue 28)."""
