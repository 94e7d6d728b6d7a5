#!/usr/bin/env python3
"""Chat requests with images against a running `pipeshard serve` (GPU machine).

Usage: vlm_client.py PORT IMAGE_DIR
Sends a 1080p image request and a text request at once, then 1440p and 480p
image requests one after the other; prints one JSON line per request with
its wall time and the server's timings, then the server's peak device
memory from /metrics.
"""
import base64
import json
import sys
import threading
import time
import urllib.request

port, image_dir = int(sys.argv[1]), sys.argv[2]
base = f"http://127.0.0.1:{port}"


def chat(name, content, out):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 64, "temperature": 0}
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.time()
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            j = json.loads(r.read())
        out[name] = {"wall_s": round(time.time() - t0, 3), "usage": j.get("usage"),
                     "timings": j.get("timings"),
                     "text": j["choices"][0]["message"]["content"][:80]}
    except Exception as e:  # report, do not hide
        out[name] = {"wall_s": round(time.time() - t0, 3), "error": str(e)}


def image(res):
    data = base64.b64encode(open(f"{image_dir}/{res}.png", "rb").read()).decode()
    return [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
            {"type": "text", "text": "Describe this image in detail."}]


out = {}
both = [threading.Thread(target=chat, args=("1080p+text: image", image("1080p"), out)),
        threading.Thread(target=chat, args=("1080p+text: text", "Write a short poem about the sea.", out))]
for t in both:
    t.start()
for t in both:
    t.join()
chat("1440p", image("1440p"), out)
chat("480p", image("480p"), out)
for k, v in out.items():
    print(json.dumps({"request": k, **v}))
metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
for line in metrics.splitlines():
    if line.startswith(("pipeshard_vram", "llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total")):
        print(line)
