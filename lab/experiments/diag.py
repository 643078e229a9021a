"""GPU diagnostics: (1) non-causal N=16384 fwd+bwd timed with longer do_bench windows (ours vs cuDNN);
(2) MQA / GQA-4 dK/dV group split sweep at N = 4096 / 16384 (backward time). bf16, D = 128, H = 16.
Usage (GPU, from the repo root): ``python -m lab.experiments.diag``."""
import triton.testing as tt
from kernels import flash_attn
from lab.probe_flash import inputs, sdpa_fn

q, k, v, do = inputs(16384, 16)
cud = sdpa_fn("sdpa_cudnn", False)
for rep in (100, 1000):
    for name, f in (("ours", lambda: flash_attn(q, k, v).backward(do)), ("cudnn", lambda: cud(q, k, v).backward(do))):
        ms = tt.do_bench(f, warmup=50, rep=rep, grad_to_none=[q, k, v], return_mode="median")
        print(f"noncausal 16k fwd+bwd {name} rep={rep}: {ms:.3f} ms", flush=True)
    o = flash_attn(q, k, v)
    print(f"  ours fwd {tt.do_bench(lambda: flash_attn(q, k, v), rep=rep, return_mode='median'):.3f} bwd "
          f"{tt.do_bench(lambda: o.backward(do, retain_graph=True), rep=rep, grad_to_none=[q, k, v], return_mode='median'):.3f}", flush=True)
del q, k, v, do, o
for N in (4096, 16384):
    for hkv in (1, 4):
        q, k, v, do = inputs(N, hkv)
        res = []
        for split in (0, 1, 2, 4, 8, 16 // hkv):
            if split and (16 // hkv) % split:
                continue
            o = flash_attn(q, k, v, causal=True, dkdv_split=split or None)
            ms = tt.do_bench(lambda: o.backward(do, retain_graph=True), rep=100, grad_to_none=[q, k, v], return_mode="median")
            res.append(f"split={split or 'auto'}:{ms:.3f}")
        print(f"causal N={N} Hkv={hkv} bwd ms " + " ".join(res), flush=True)
