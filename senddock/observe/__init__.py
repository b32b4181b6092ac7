"""What a node shows of itself: Prometheus metrics and health endpoints (issue 16)."""
