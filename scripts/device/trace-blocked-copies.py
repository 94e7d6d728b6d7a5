#!/usr/bin/env python3
"""Whether a decode's small copies to the device wait for the streamed
weights' copies, from a CUPTI trace (scripts/device/cupti-trace.cpp).

    trace-blocked-copies.py TRACE.csv[.xz]

The decode window is everything after the last copy of 30 MB or more (a
whole weight streamed for the prompt). Over it: the small copies to the
device (under 1 MiB: the CPU's products, the graph's inputs), how many ran
while a weight's copy (1 MiB or more) was on the link and how long they
took, and how many started within 4 us of the end of a weight's copy, that
is, waited for it (patch 0041).
"""
import bisect
import statistics
import sys

from cupti_records import load

HOST_TO_DEVICE = 1


def main(path):
    _, copies, _ = load(path)
    last = max((c[1] for c in copies if c[3] >= 30 << 20), default=0)
    window = [c for c in copies if c[0] > last]
    weights = [c for c in window if c[3] >= 1 << 20]
    small = [c for c in window if c[3] < 1 << 20 and c[4] == HOST_TO_DEVICE]
    starts = [w[0] for w in weights]
    ends = sorted(w[1] for w in weights)

    def during(c):
        i = bisect.bisect_right(starts, c[0]) - 1
        return i >= 0 and weights[i][1] > c[0]

    def after_end(c):
        i = bisect.bisect_left(ends, c[0] - 4000)
        return i < len(ends) and ends[i] <= c[0] + 4000

    inside = [c[1] - c[0] for c in small if during(c)]
    outside = [c[1] - c[0] for c in small if not during(c)]
    blocked = sum(1 for c in small if after_end(c))
    med = lambda v: statistics.median(v) / 1e3 if v else 0.0
    print(f"{path}: {len(weights)} weight copies, {len(small)} small copies to the device")
    print(f"  during a weight's copy: {len(inside)} (median {med(inside):.1f} us); else {len(outside)} (median {med(outside):.1f} us)")
    print(f"  starting within 4 us of the end of a weight's copy: {blocked}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
