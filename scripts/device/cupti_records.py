"""The records of a CUPTI trace written by scripts/device/cupti-trace.cpp,
shared by trace-gaps.py and trace-prompt.py.

Lines: K,start,end,stream,name (kernels); M,start,end,stream,bytes,kind
(memory copies); A,start,end,thread,name (host API calls, with
CUPTI_TRACE_API=1). Times are in ns.
"""
import lzma


def load(path):
    opener = lzma.open if path.endswith(".xz") else open
    kernels, copies, api = [], [], []
    with opener(path, "rt") as f:
        for line in f:
            p = line.rstrip("\n").split(",", 4)
            if p[0] == "K":
                kernels.append((int(p[1]), int(p[2]), int(p[3]), p[4]))
            elif p[0] == "M":
                q = line.split(",")
                copies.append((int(q[1]), int(q[2]), int(q[3]), int(q[4]), int(q[5])))
            elif p[0] == "A":
                api.append((int(p[1]), int(p[2]), int(p[3]), p[4]))
    return sorted(kernels), sorted(copies), sorted(api)


def kind(name):
    for key in ("mul_mat_q", "mmq", "flash_attn", "rms_norm", "rope", "get_rows", "quantize", "mul_mat_vec",
                "argmax", "set_rows", "unary", "add", "concat", "topk", "argsort", "soft_max", "cpy", "scale"):
        if key in name:
            return key
    return name[:24]
