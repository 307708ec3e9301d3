"""EIC as a secondary tier of vLLM's own KV offloading (vLLM's
`TieringOffloadingSpec`): `aibrix_eic.tier.manager.EICSecondaryTier`.
Imported only by vLLM (manager.py imports vLLM); jobs.py, presence.py and
settings.py do not."""
