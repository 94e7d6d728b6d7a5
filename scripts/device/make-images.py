"""Write test images (480p, 720p, 1080p, 1440p PNGs: gradients with noise) into
the directory given, for the vision benchmarks (server-bench.sh vl)."""
import sys, zlib, struct, numpy as np
out = sys.argv[1]
for name, (w, h) in {"480p": (854, 480), "720p": (1280, 720), "1080p": (1920, 1080), "1440p": (2560, 1440)}.items():
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(0)
    img = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) % 256)], axis=-1).astype(np.uint8)
    img = (img.astype(np.int16) + rng.integers(-20, 20, img.shape)).clip(0, 255).astype(np.uint8)
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) \
        + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
    open(f"{out}/{name}.png", "wb").write(png)
