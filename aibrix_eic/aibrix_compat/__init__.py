"""Workarounds for aibrix-kvcache 0.8 defects, and the upstream connector for comparisons."""
