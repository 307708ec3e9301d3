"""Disaggregated prefill/decode through EIC: a vLLM KV connector that is
AIBrix's `AIBrixPDReuseConnector` plus what keeps a decoder from answering
from KV it never loaded (connector.py). docs/vllm.md shows how to run it."""
