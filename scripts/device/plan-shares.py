#!/usr/bin/env python3
"""Rewrite a saved plan's (`pipeshard plan --format json`) dense row split.

  plan-shares.py PLAN.json SHARE all         every split weight at SHARE
  plan-shares.py PLAN.json SHARE down-whole  ffn_down streamed whole where it
                                             split, ffn_up and ffn_gate at SHARE

Options after the mode:
  --output SHARE  the output projection, where it runs on the CPU in decode
                  (alone or split), splits by rows there with SHARE on the
                  GPU (patch 0043); 0: the CPU computes it alone
  --attn-stream   attention weights that run on the CPU in decode, in the
                  layers whose KV cache is on the GPU, stream to the GPU
                  instead (as the decode tuner's ffn_down-whole setting)

For experiments with `run --plan` (a saved plan is used as is, not tuned):
with ffn_down streamed whole the CPU computes one split per layer (up and
gate) instead of two, so each layer hands over between the CPU and the GPU
once instead of twice.
"""
import json
import sys

plan = json.load(open(sys.argv[1]))
share = float(sys.argv[2])
mode = sys.argv[3]
opts = sys.argv[4:]
if mode not in ("all", "down-whole"):
    sys.exit(f"unknown mode {mode}")
output_share = float(opts[opts.index("--output") + 1]) if "--output" in opts else None
attn_stream = "--attn-stream" in opts
decode = min(plan["tiers"])
kv_gpu_from = plan["n_layer"] - plan.get("kv_gpu_layers", 0)
for t in plan["tensors"]:
    if t["resident"]:
        continue
    if output_share is not None and t["role"] == "Output":
        if [decode, "cpu"] in t["exec"] or [decode, "split"] in t["exec"]:
            e_out = "split" if output_share > 0 else "cpu"
            t["exec"] = [[n, e_out if n == decode else e] for n, e in t["exec"]]
            t["gpu_share"] = [[decode, output_share]] if output_share > 0 else []
        continue
    if attn_stream and t["role"].startswith("Attn") and (t.get("layer") or 0) >= kv_gpu_from:
        t["exec"] = [[n, "stream" if n == decode and e == "cpu" else e] for n, e in t["exec"]]
        continue
    if not t.get("gpu_share"):
        continue
    if mode == "down-whole" and t["role"] == "FfnDown":
        t["exec"] = [[n, "stream" if e == "split" else e] for n, e in t["exec"]]
        t["gpu_share"] = []
    else:
        t["gpu_share"] = [[n, share] for n, _ in t["gpu_share"]]
plan["row_split_share"] = share
if mode == "down-whole":
    plan["row_split_down_whole"] = True
json.dump(plan, sys.stdout)
