"""QoS controller: SLI accounting persisted in the API server, gate release in Q order, QoS evictions."""
