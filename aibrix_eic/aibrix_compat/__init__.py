"""Workarounds for aibrix-kvcache 0.8 defects (registry.py declares them) and the connector's token parser."""
