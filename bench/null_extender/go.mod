module kube-qos-extender/bench/null_extender

go 1.22
