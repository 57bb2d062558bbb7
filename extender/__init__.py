"""kube-qos-extender: an SLO-aware, cost-aware add-on for the real kube-scheduler."""

__version__ = "0.1.0"
