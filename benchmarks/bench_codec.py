"""Key codec throughput: AIBrix L2 keys -> EIC key strings.

Measured in one run against upstream's key function, `md5(key).hexdigest() +
conn_id` (aibrix_kvcache/l2/connectors/eic/eic.py), on the same keys:

- 16-byte keys: AIBrix's default ROLLING_HASH key builder;
- 4 KiB keys: the RAW key builder for a 1024-token prefix.

Goal (issue 2): at least 300k keys per second for the default keys.

    python benchmarks/bench_codec.py [--json]
"""

import argparse
import hashlib
import json
import os
import statistics
import sys
import time

from aibrix_eic.keys.codec import KeyCodec

GOAL_KEYS_PER_S = 300_000
CONN_ID = "aibrix_h0_7_l0_31_lcnd16roc"


def keys_per_second(encode, keys, repeats: int = 7) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        encode(keys)
        samples.append(len(keys) / (time.perf_counter() - started))
    return statistics.median(samples)


def upstream_encode(keys):
    return [hashlib.md5(key).hexdigest() + CONN_ID for key in keys]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    codec = KeyCodec(CONN_ID, "tenant-a")
    report = {}
    for label, key_nbytes, count in (("16B", 16, args.keys), ("4KiB", 4096, args.keys // 20)):
        keys = [os.urandom(key_nbytes) for _ in range(count)]
        ours_many = keys_per_second(codec.encode_many, keys)
        ours_one = keys_per_second(lambda ks: [codec.encode(k) for k in ks], keys)
        upstream = keys_per_second(upstream_encode, keys)
        report[label] = {
            "encode_many_keys_per_s": ours_many,
            "encode_keys_per_s": ours_one,
            "upstream_md5_keys_per_s": upstream,
            "ratio_to_upstream": ours_many / upstream,
        }
    report["goal_keys_per_s"] = GOAL_KEYS_PER_S
    report["goal_met"] = report["16B"]["encode_many_keys_per_s"] >= GOAL_KEYS_PER_S
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("Key codec, keys per second (median of 7 runs):")
        print(f"  {'key size':8s} {'encode_many':>12s} {'encode':>12s} {'upstream md5':>13s} {'ratio':>7s}")
        for label in ("16B", "4KiB"):
            row = report[label]
            print(
                f"  {label:8s} {row['encode_many_keys_per_s']:12,.0f} {row['encode_keys_per_s']:12,.0f} "
                f"{row['upstream_md5_keys_per_s']:13,.0f} {row['ratio_to_upstream']:6.2f}x"
            )
        verdict = "met" if report["goal_met"] else "MISSED"
        print(f"  goal >= {GOAL_KEYS_PER_S:,} keys/s for 16-byte keys: {verdict}")
    return 0 if report["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
