"""The client side of EIC: the SDK seam, its pools, the breaker and probe, one path for every SDK call."""
