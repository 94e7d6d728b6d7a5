#!/usr/bin/env python3
"""Where a device idles in a CUPTI trace (scripts/device/cupti-trace.cpp).

    trace-gaps.py TRACE.csv[.xz] [MIN_MS]

Lists every gap of at least MIN_MS (default 1) between two kernels on the
stream that ran the most kernels (the compute stream), with the kinds of
kernels around it, and the bytes and link time of the big host-to-device
copies (weights streamed through slots) on every stream.
"""
import collections
import sys

from cupti_records import kind, load


def main():
    path = sys.argv[1]
    min_ns = float(sys.argv[2] if len(sys.argv) > 2 else 1) * 1e6
    kernels, copies, _ = load(path)
    stream = collections.Counter(k[2] for k in kernels).most_common(1)[0][0]
    ck = [k for k in kernels if k[2] == stream]
    t0 = ck[0][0]
    print(f"{path}: compute stream {stream}, {len(ck)} kernels over {(ck[-1][1] - t0) / 1e6:.1f} ms")
    for a, b in zip(ck, ck[1:]):
        gap = b[0] - a[1]
        if gap >= min_ns:
            print(f"  gap {gap / 1e6:7.2f} ms at {(a[1] - t0) / 1e6:9.2f} ms: {kind(a[3])} -> {kind(b[3])}")
    big = [c for c in copies if c[4] == 1 and c[3] >= 1 << 20]
    for s, n in collections.Counter(c[2] for c in big).most_common():
        mine = [c for c in big if c[2] == s]
        secs = sum(c[1] - c[0] for c in mine) / 1e9
        gb = sum(c[3] for c in mine) / 1e9
        print(f"  stream {s}: {n} host-to-device copies of 1 MiB or more, {gb:.2f} GB in {secs * 1e3:.1f} ms "
              f"({gb / max(secs, 1e-9):.1f} GB/s)")


if __name__ == "__main__":
    main()
