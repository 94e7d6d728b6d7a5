# pinned host-to-device copies in a loop for SECONDS, as the link's streaming does
import sys, time, torch
secs = float(sys.argv[1])
src = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
dst = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
t0 = time.time(); n = 0
while time.time() - t0 < secs:
    dst.copy_(src, non_blocking=True); n += 1
    if n % 8 == 0: torch.cuda.synchronize()
torch.cuda.synchronize()
print(f"h2d: {n * 256 / 1024 / (time.time() - t0):.1f} GiB/s over {time.time() - t0:.1f} s")
