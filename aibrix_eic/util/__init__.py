"""Small helpers with no knowledge of requests: sizes, address ranges, threads, device copies."""
