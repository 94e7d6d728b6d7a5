#!/usr/bin/env python3
"""Rewrite a saved plan's (`pipeshard plan --format json`) dense row split.

  plan-shares.py PLAN.json SHARE all         every split weight at SHARE
  plan-shares.py PLAN.json SHARE down-whole  ffn_down streamed whole where it
                                             split, ffn_up and ffn_gate at SHARE

For experiments with `bench --plan` (a saved plan is used as is, not tuned):
with ffn_down streamed whole the CPU computes one split per layer (up and
gate) instead of two, so each layer hands over between the CPU and the GPU
once instead of twice.
"""
import json
import sys

plan = json.load(open(sys.argv[1]))
share = float(sys.argv[2])
mode = sys.argv[3]
if mode not in ("all", "down-whole"):
    sys.exit(f"unknown mode {mode}")
for t in plan["tensors"]:
    if not t.get("gpu_share"):
        continue
    if mode == "down-whole" and t["role"] == "FfnDown":
        t["exec"] = [[n, "stream" if e == "split" else e] for n, e in t["exec"]]
        t["gpu_share"] = []
    else:
        t["gpu_share"] = [[n, share] for n, _ in t["gpu_share"]]
plan["row_split_share"] = share
json.dump(plan, sys.stdout)
