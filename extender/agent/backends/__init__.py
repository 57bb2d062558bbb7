"""Runtime backends of the agent: criu (real CRIU on processes), kubelet (KEP-2008), simulated (kwok)."""
