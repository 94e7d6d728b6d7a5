#!/usr/bin/env python3
"""Helpers of the live re-planning test on the GPU machine (issue 18), run by
gpu-session.sh's s10live:

  filler CONTROL LEAVE_GIB   a torch process that first takes all of the
                             card but LEAVE_GIB, then holds EXTRA GiB more,
                             EXTRA read from the file CONTROL every 50 ms
                             (taking what it can when the card is short);
                             it logs what it holds to stdout.
  clients PORT N STOP OUT    rounds of N concurrent streaming /completion
                             requests (the reference case: 4096-token
                             prompt, 64 tokens) until the file STOP exists;
                             every request's times and outcome as JSON
                             lines into OUT.
  summary RES                phases, process memory against the
                             allowance, failed requests, decode speed per
                             phase and migrations, from RES's files.
"""
import json
import os
import sys
import threading
import time
import urllib.request

GIB = 1 << 30


def filler(control, leave_gib):
    import torch

    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    base = []
    chunk = 256 << 20
    target = free - int(float(leave_gib) * GIB)
    held = 0
    while held + chunk <= target:
        base.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        held += chunk
    free, _ = torch.cuda.mem_get_info()
    print(json.dumps({"t": time.time(), "base_gib": held / GIB, "free_gib": free / GIB}), flush=True)
    extra = []
    want_last = None
    while True:
        try:
            want = float(open(control).read().strip() or 0)
        except (OSError, ValueError):
            want = 0.0
        if want < 0:
            break
        n = int(want * GIB) // chunk
        if want != want_last:
            while len(extra) > n:
                extra.pop()
            torch.cuda.empty_cache()
            short = False
            while len(extra) < n:
                try:
                    extra.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
                except torch.cuda.OutOfMemoryError:
                    short = True
                    break
            free, _ = torch.cuda.mem_get_info()
            print(json.dumps({"t": time.time(), "want_gib": want, "extra_gib": len(extra) * chunk / GIB,
                              "short": short, "free_gib": free / GIB}), flush=True)
            want_last = want if not short else None
        time.sleep(0.05)


def clients(port, n, stop, out):
    """Rounds of N concurrent requests (the protocol of a fresh start's
    measurement too), one round after another until STOP exists; in every
    other round client 0 sends the probe instead."""
    port, n = int(port), int(n)
    f = open(out, "a")

    def one(i, k, rec):
        probe = i == 0 and k % 2 == 1
        if probe:
            prompt = [1000 + (j * 104729) % 20000 for j in range(512)]
        else:
            prompt = [1000 + (i * 7919 + (k * 31 + j) * 104729) % 20000 for j in range(4096)]
        n_predict = 16 if probe else 64
        body = {"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "temperature": 0,
                "cache_prompt": False, "stream": True}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        rec.update({"client": i, "req": k, "t0": time.time(), "probe": probe})
        try:
            timings, first, pieces, text = None, None, 0, ""
            with urllib.request.urlopen(req, timeout=600) as r:
                for line in r:
                    line = line.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    j = json.loads(line[5:])
                    if j.get("content"):
                        text += j["content"]
                        pieces += 1
                        first = first or time.time()
                    if j.get("stop"):
                        timings = j.get("timings")
            rec.update(ok=timings is not None and timings.get("predicted_n") == n_predict, t1=time.time(),
                       t_first=first, pieces=pieces, **({"text": text} if probe else {}),
                       **({k2: timings[k2] for k2 in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms",
                                                      "predicted_per_second")} if timings else {}))
        except Exception as e:  # a failed request is what the test counts
            rec.update(ok=False, t1=time.time(), error=repr(e))

    k = 0
    while not os.path.exists(stop):
        recs = [{} for _ in range(n)]
        ts = [threading.Thread(target=one, args=(i, k, recs[i])) for i in range(n)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        for rec in recs:
            rec["round"] = k
            f.write(json.dumps(rec) + "\n")
        f.flush()
        k += 1


def summary(res):
    phases = [json.loads(l) for l in open(f"{res}/live.phases")]
    reqs = [json.loads(l) for l in open(f"{res}/live.requests")]
    trace, t0 = [], None
    for l in open(f"{res}/live.trace"):
        if l.startswith("# started at unix"):
            t0 = float(l.split()[-1])
        if l.startswith("#"):
            continue
        c = l.split()
        trace.append(dict(t=float(c[0]), total=int(c[1]), others=int(c[2]), own=int(c[3]), allowance=int(c[4]),
                          budget=int(c[5]), plan_total=int(c[6])))
    probes = [r for r in reqs if r.get("probe") and r["ok"]]
    out = {"requests": len(reqs), "failed": sum(not r["ok"] for r in reqs),
           "probe_requests": len(probes), "probe_distinct_outputs": len({r["text"] for r in probes}),
           "phases": []}
    for i, p in enumerate(phases):
        start = p["t"]
        end = phases[i + 1]["t"] if i + 1 < len(phases) else max(r["t1"] for r in reqs)
        rows = [r for r in trace if start <= t0 + r["t"] < end]
        # The longest run of samples with the process over the allowance:
        # the issue wants it under within 1 s of each change.
        longest, run_start = 0.0, None
        for r in rows:
            if r["own"] > r["allowance"]:
                run_start = r["t"] if run_start is None else run_start
                longest = max(longest, r["t"] - run_start + 0.05)
            else:
                run_start = None
        settled = [r for r in rows if t0 + r["t"] >= start + 1.0]
        over = [r for r in settled if r["own"] > r["allowance"]]
        speeds = [r["predicted_per_second"] for r in reqs
                  if r["ok"] and not r.get("probe") and r["t0"] >= start + 2 and r["t1"] <= end]
        out["phases"].append({
            "phase": p["name"], "filler_extra_gib": p["extra_gib"], "seconds": round(end - start, 1),
            "allowance_gib": round(min((r["allowance"] for r in settled), default=0) / GIB, 3),
            "own_max_gib_after_1s": round(max((r["own"] for r in settled), default=0) / GIB, 3),
            "longest_over_allowance_s": round(longest, 2),
            "samples_over_after_1s": len(over), "samples_after_1s": len(settled),
            "budget_gib": round(settled[-1]["budget"] / GIB, 3) if settled else None,
            # the plan in force's total: over the budget when even the
            # smallest plan does not fit (a fresh start is measured there)
            "plan_total_gib": round(settled[-1]["plan_total"] / GIB, 3) if settled else None,
            "requests_in_phase": len(speeds),
            "decode_tok_s_each_mean": round(sum(speeds) / len(speeds), 1) if speeds else None,
            "failed_in_phase": sum(1 for r in reqs if not r["ok"] and start <= r["t1"] < end),
        })
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    {"filler": filler, "clients": clients, "summary": summary}[sys.argv[1]](*sys.argv[2:])
