#!/usr/bin/env python3
"""A streamed prompt's copy/compute overlap in a CUPTI trace (scripts/device/cupti-trace.cpp).

    trace-prompt.py TRACE.csv[.xz] [MIN_COPY_MIB]

A prompt is a run of host-to-device copies of at least MIN_COPY_MIB (default
64: whole weights streamed through slots) with less than 20 ms between them.
For each prompt it prints:
  - the link: the copies' bytes, busy time and rate, and where it idles
    between two copies (sum, and the largest gaps, with what the compute
    stream did meanwhile);
  - the compute stream (the one that ran the most kernels): busy and idle
    time from the prompt's first kernel to its last, and each gap that ends
    within 50 us of a copy's end (compute waiting for a weight);
  - the host (with API records, CUPTI_TRACE_API=1): the main thread's gaps
    of 1 ms or more without a CUDA call before the first copy, and its
    longest synchronous waits (cudaStreamSynchronize, cudaEventSynchronize)
    inside the prompt;
  - per group of copies (GROUP per layer, default 3): the copy's start and
    end and the compute wait before it is used, relative to the prompt.
"""
import collections
import os
import sys

from cupti_records import kind, load


def ms(ns):
    return ns / 1e6


def main():
    path = sys.argv[1]
    min_copy = float(sys.argv[2] if len(sys.argv) > 2 else 64) * (1 << 20)
    group = int(os.environ.get("GROUP", "3"))
    kernels, copies, api = load(path)
    stream = collections.Counter(k[2] for k in kernels).most_common(1)[0][0]
    ck = [k for k in kernels if k[2] == stream]
    big = [c for c in copies if c[4] == 1 and c[3] >= min_copy]
    prompts = []
    for c in big:
        if prompts and c[0] - prompts[-1][-1][1] < 20e6:
            prompts[-1].append(c)
        else:
            prompts.append([c])
    threads = collections.Counter(a[2] for a in api)
    main_thread = threads.most_common(1)[0][0] if threads else None
    print(f"{path}: compute stream {stream}, {len(prompts)} prompts with copies >= {min_copy / (1 << 20):.0f} MiB")
    for n, pc in enumerate(prompts):
        t0 = pc[0][0]
        # the prompt's kernels: from shortly before the first copy to the first compute idle of 5 ms after the last
        ks = [k for k in ck if k[1] >= t0 - 50e6]
        # start: the first kernel after a gap of 5 ms or more before the first copy ends
        start_i = 0
        for i in range(1, len(ks)):
            if ks[i][0] - ks[i - 1][1] > 5e6 and ks[i][0] <= pc[0][1]:
                start_i = i
        ks = ks[start_i:]
        end_i = len(ks) - 1
        for i in range(1, len(ks)):
            if ks[i][0] > pc[-1][1] and ks[i][0] - ks[i - 1][1] > 5e6:
                end_i = i - 1
                break
        ks = ks[: end_i + 1]
        k0, k1 = ks[0][0], ks[-1][1]
        busy = sum(k[1] - k[0] for k in ks)
        link = sum(c[1] - c[0] for c in pc)
        gb = sum(c[3] for c in pc) / 1e9
        print(f"\nprompt {n}: kernels {ms(k1 - k0):.1f} ms (first kernel {ms(k0 - t0):+.2f} ms from the first copy's start), "
              f"compute busy {ms(busy):.1f} ms, idle {ms(k1 - k0 - busy):.1f} ms")
        print(f"  link: {len(pc)} copies, {gb:.2f} GB, busy {ms(link):.1f} ms ({gb / (link / 1e9):.1f} GB/s), "
              f"first copy {ms(pc[0][0] - k0):+.2f} ms, last ends {ms(pc[-1][1] - k0):.2f} ms after the first kernel; "
              f"compute after the last copy {ms(k1 - pc[-1][1]):.2f} ms")
        idle = [(pc[i + 1][0] - pc[i][1], i) for i in range(len(pc) - 1)]
        print(f"  link idle between copies: {ms(sum(g for g, _ in idle)):.1f} ms; largest: " +
              ", ".join(f"{ms(g):.2f} ms after copy {i} (at {ms(pc[i][1] - k0):.1f})" for g, i in sorted(idle, reverse=True)[:6]))
        # compute gaps and whether a weight copy ends right then
        gaps = []
        for a, b in zip(ks, ks[1:]):
            g = b[0] - a[1]
            if g >= 20e3:
                waiting = any(abs(c[1] - b[0]) < 50e3 or (c[0] < a[1] and c[1] > b[0] - 50e3 and c[1] <= b[0] + 50e3) for c in pc)
                gaps.append((g, a[1], kind(a[3]), kind(b[3]), waiting))
        wait = sum(g[0] for g in gaps if g[4])
        print(f"  compute gaps >= 20 us: {len(gaps)}, {ms(sum(g[0] for g in gaps)):.1f} ms; of them ending at a copy's end "
              f"(waiting for a weight): {sum(1 for g in gaps if g[4])}, {ms(wait):.1f} ms")
        for g, at, ka, kb, w in sorted(gaps, reverse=True)[:8]:
            print(f"    {ms(g):6.2f} ms at {ms(at - k0):7.2f} ms: {ka} -> {kb}{' (copy)' if w else ''}")
        # kernel time by kind
        byk = collections.Counter()
        for k in ks:
            byk[kind(k[3])] += k[1] - k[0]
        print("  kernel time by kind: " + ", ".join(f"{name} {ms(t):.1f}" for name, t in byk.most_common(8)))
        small = [c for c in copies if k0 - 50e6 <= c[0] <= k1 and c[3] < min_copy]
        sk = collections.Counter((c[4], c[2]) for c in small)
        print("  other copies (kind, stream: count): " + ", ".join(f"{k}: {v}" for k, v in sk.most_common(6)) +
              f"; {sum(c[3] for c in small) / 1e6:.1f} MB")
        if main_thread is not None:
            ma = [a for a in api if a[2] == main_thread and k0 - 200e6 <= a[0] <= k1]
            before = [a for a in ma if a[0] <= k0]
            hg = [(b[0] - a[1], a[3], b[3], b[0]) for a, b in zip(before, before[1:]) if b[0] - a[1] >= 1e6]
            print("  host gaps >= 1 ms before the first kernel (ms before it): " +
                  ", ".join(f"{ms(g):.2f} ({a} -> {b}, {ms(k0 - t):.2f})" for g, a, b, t in hg[-4:]))
            syncs = [a for a in ma if a[0] >= k0 and "ynchronize" in a[3]]
            print(f"  host syncs in the prompt: {len(syncs)}, {ms(sum(a[1] - a[0] for a in syncs)):.1f} ms; longest: " +
                  ", ".join(f"{a[3]} {ms(a[1] - a[0]):.2f} at {ms(a[0] - k0):.1f}" for a in sorted(syncs, key=lambda a: a[0] - a[1])[:5]))
            issue = [a for a in ma if a[0] >= k0 - 5e6 and a[3].startswith("cudaMemcpy") and a[1] - a[0] < 1e9]
            print(f"  host memcpy calls in the prompt: {len(issue)}")
        for g in range(0, len(pc), group):
            cs = pc[g:g + group]
            w = []
            for c in cs:
                nxt = next((k for k in ks if k[0] >= c[1] - 50e3), None)
                prv = max((k for k in ks if k[1] <= (nxt[0] if nxt else c[1])), default=None, key=lambda k: k[1])
                w.append(ms(nxt[0] - prv[1]) if nxt and prv and nxt[0] - c[1] < 50e3 else 0.0)
            if g // group < 3 or g // group >= len(pc) // group - 2 or os.environ.get("ALL"):
                print(f"    layer {g // group:2d}: " + " | ".join(
                    f"copy {ms(c[0] - k0):7.2f}-{ms(c[1] - k0):7.2f} ({c[3] / (1 << 20):.0f} MiB) wait {x:.2f}" for c, x in zip(cs, w)))


if __name__ == "__main__":
    main()
