#!/usr/bin/env python3
"""Where a decode step's time goes, from a CUPTI trace with host API records
(scripts/device/cupti-trace.cpp with CUPTI_TRACE_API=1).

    trace-decode.py TRACE.csv[.xz] TOKENS [DETAIL_US]

The decode window is everything after the last big host-to-device copy (a
whole weight streamed for the prompt, 16 MiB or more). Over it, per token:
the link's busy time and bytes, the compute stream's busy time, the host's
main thread (the one with the most API calls) in each runtime call, and the
time the four states overlap (link busy, device computing, host in a CUDA
call, host in its own code: the scheduler and the CPU's splits). Then the
sequence of one stretch of DETAIL_US (default 900) in the middle of the
window, to read a layer's order.
"""
import collections
import sys

import numpy as np

from cupti_records import kind, load


def union_mask(intervals, t0, n):
    m = np.zeros(n, dtype=bool)
    for a, b in intervals:
        i, j = max(0, (a - t0) // 1000), min(n, (b - t0) // 1000 + 1)
        if i < j:
            m[i:j] = True
    return m


def tally(records, name):
    """Count and total duration (ns) of records by name(record)."""
    count, total = collections.Counter(), collections.Counter()
    for r in records:
        count[name(r)] += 1
        total[name(r)] += r[1] - r[0]
    return count, total


def main():
    path, tokens = sys.argv[1], int(sys.argv[2])
    detail_us = int(sys.argv[3]) if len(sys.argv) > 3 else 900
    kernels, copies, api = load(path)
    big = [c for c in copies if c[4] == 1 and c[3] >= 16 << 20]
    start = max(c[1] for c in big) if big else min(k[0] for k in kernels)
    kernels = [k for k in kernels if k[0] >= start]
    copies = [c for c in copies if c[0] >= start]
    api = [a for a in api if a[0] >= start]
    end = max([k[1] for k in kernels] + [c[1] for c in copies])
    api = [a for a in api if a[1] <= end]  # not the teardown after the last step
    main_thread = collections.Counter(a[2] for a in api).most_common(1)[0][0]
    mine = [a for a in api if a[2] == main_thread]
    n = (end - start) // 1000 + 1
    per = lambda x: x / tokens
    print(f"{path}: decode window {(end - start) / 1e6:.1f} ms, {per((end - start) / 1e6):.2f} ms per token "
          f"({tokens} tokens)")

    h2d = [c for c in copies if c[4] == 1]
    d2h = [c for c in copies if c[4] == 2]
    link = union_mask([(c[0], c[1]) for c in h2d], start, n)
    print(f"  link (H2D): {per(len(h2d)):.0f} copies, {per(sum(c[3] for c in h2d)) / 1e6:.1f} MB, busy "
          f"{per(link.sum()) / 1e3:.2f} ms per token ({per(sum(c[3] for c in h2d)) / max(per(link.sum()), 1) / 1e3:.1f} GB/s "
          f"while busy)")
    for s, cnt in collections.Counter(c[2] for c in h2d).most_common():
        mine_s = [c for c in h2d if c[2] == s]
        print(f"    stream {s}: {per(cnt):.0f} copies, {per(sum(c[3] for c in mine_s)) / 1e6:.1f} MB, "
              f"{per(sum(c[1] - c[0] for c in mine_s)) / 1e6:.2f} ms")
    print(f"  D2H: {per(len(d2h)):.0f} copies, {per(sum(c[3] for c in d2h)) / 1e3:.1f} kB")
    comp_stream = collections.Counter(k[2] for k in kernels).most_common(1)[0][0]
    gpu = union_mask([(k[0], k[1]) for k in kernels], start, n)
    print(f"  kernels: {per(len(kernels)):.0f} per token, busy {per(gpu.sum()) / 1e3:.2f} ms "
          f"(compute stream {comp_stream})")
    by, k_us = tally(kernels, lambda k: kind(k[3]))
    print("    " + ", ".join(f"{name} {per(cnt):.0f}x {per(k_us[name]) / 1e3:.0f} us"
                             for name, cnt in by.most_common(12)))

    in_api = union_mask([(a[0], a[1]) for a in mine], start, n)
    print(f"  host thread {main_thread}: {per(len(mine)):.0f} runtime calls, in them "
          f"{per(in_api.sum()) / 1e3:.2f} ms per token; in its own code {per((~in_api).sum()) / 1e3:.2f} ms")
    calls, call_ns = tally(mine, lambda a: a[3])
    for name, ns in call_ns.most_common(10):
        print(f"    {name}: {per(calls[name]):.0f} calls, {per(ns) / 1e3:.0f} us per token "
              f"({ns / calls[name] / 1e3:.1f} us each)")
    others = collections.Counter(a[2] for a in api if a[2] != main_thread)
    if others:
        print(f"  other threads' calls per token: " + ", ".join(f"{t}: {per(c):.0f}" for t, c in others.items()))

    print("  states per token (ms): link busy / device computing / host in a CUDA call (else in its own code)")
    for lk in (True, False):
        for gk in (True, False):
            for hk in (True, False):
                sel = (link == lk) & (gpu == gk) & (in_api == hk)
                print(f"    link {'busy' if lk else 'idle'}, device {'busy' if gk else 'idle'}, host "
                      f"{'in CUDA' if hk else 'own code'}: {per(sel.sum()) / 1e3:.2f}")

    # one stretch in the middle, in order
    mid = start + (end - start) // 2
    lo, hi = mid, mid + detail_us * 1000
    ev = [(a[0], a[1], f"host {a[3]}") for a in mine if lo <= a[0] < hi]
    ev += [(k[0], k[1], f"    gpu {kind(k[3])} s{k[2]}") for k in kernels if lo <= k[0] < hi]
    ev += [(c[0], c[1], f"        link {'H2D' if c[4] == 1 else 'D2H' if c[4] == 2 else c[4]} {c[3]} s{c[2]}")
           for c in copies if lo <= c[0] < hi]
    print(f"  {detail_us} us from the middle (start us, duration us, what):")
    last = None
    for a, b, what in sorted(ev):
        if last is not None and a - last > 20000:
            print(f"      ... {(a - last) / 1e3:.0f} us without a record")
        print(f"    {(a - lo) / 1e3:8.1f} {(b - a) / 1e3:7.1f} {what}")
        last = max(last or 0, b if what.startswith("host") else a)


if __name__ == "__main__":
    main()
