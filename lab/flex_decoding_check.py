"""GPU check of the Flex decoding refusal (lab): on torch 2.11 with triton 3.9, Flex's decoding template (fewer than
128 queries) uses ``tl.make_block_ptr``, which triton 3.9 removed; ``attn_zoo.flex.flex_decoding_unsupported`` names
the pair, the ``flex`` backend refuses such calls and the ``torch`` backend sends them to SDPA with the dense mask.
Prints, for 35 / 35, 35 / 300 and 256 / 256 queries / keys, each backend's max error against the fp32 reference or
its refusal. Usage (GPU): ``python lab/flex_decoding_check.py`` (results/h100/2026-12-06i/10/flexchk_t3*.txt)."""
import torch, triton, attn_zoo
from attn_zoo import AttentionSpec
from attn_zoo.flex import flex_decoding_unsupported, flex_decoding_refusal


def main():
    print("torch", torch.__version__, "triton", triton.__version__, "flex_decoding_unsupported:", flex_decoding_unsupported())
    g = torch.Generator(device="cuda").manual_seed(0)
    for Nq, Nk in ((35, 35), (35, 300), (256, 256)):
        q = torch.randn(2, 4, Nq, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(2, 4, Nk, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(2, 4, Nk, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        print("refusal(Nq=%d):" % Nq, flex_decoding_refusal(q))
        for spec in (AttentionSpec(kind="sliding_window", window_size=(16, 0)), AttentionSpec(kind="flash", causal=True)):
            ref = attn_zoo.attention(q.float(), k.float(), v.float(), spec, backend="reference")
            for be in ("torch", "flex"):
                try:
                    out = attn_zoo.attention(q, k, v, spec, backend=be)
                    print(f"  {spec.kind} Nq {Nq} Nk {Nk} {be}: max err {(out.float() - ref).abs().max().item():.4f}")
                except Exception as e:
                    print(f"  {spec.kind} Nq {Nq} Nk {Nk} {be}: {type(e).__name__}: {str(e)[:200]}")


if __name__ == "__main__":
    main()
