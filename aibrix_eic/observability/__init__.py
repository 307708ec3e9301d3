"""Counters, Prometheus series, the exporter, health() and logs."""
