#!/usr/bin/env python3
"""Reference timings on a GPU machine with PyTorch, for `scripts/gpu-bench.sh`.

What the project's own GPU figures are read against, measured on the same GPU in the same
call, forward plus backward at flash-linear-attention's benchmark shape (B4 T2048 H16
d128 by default):

* PyTorch's causal `scaled_dot_product_attention` (FlashAttention-2's kernel in bf16; in
  f32 PyTorch picks its memory-efficient or math kernel);
* flash-linear-attention's `chunk_gla`, `chunk_simple_gla` and `chunk_linear_attn`, when
  its `fla` package can be imported (the check carries it as a wheel);
* hla2's chunk decomposition (docs/math.md §5) written with PyTorch's batched matmuls and
  autograd: what a matmul-only chunked hla2 costs on this GPU, first checked against the
  definition in float64.

    python3 scripts/gpu-reference.py [--out DIR] [--shape B,T,H,D] [--reps N]

Prints a table and writes `reference.json` (and `reference.md`) into DIR.
"""

import argparse
import json
import os
import statistics
import sys

import torch


def time_ms(step, reps, warmup=3):
    """Median wall time of `step()` in milliseconds, by CUDA events."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def hla2_definition(q, k, v):
    """o_t = Σ_{j≤t} Σ_{i≤j} (q_t·k_i)(q_j·k_i) v_j, straight from the sum (small T only)."""
    t = q.shape[-2]
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    qk = (q @ k.transpose(-1, -2)).masked_fill(~mask, 0)  # [.., t, i]: i ≤ t
    # pairs (t, j): Σ_{i ≤ min(t, j)} (q_t·k_i)(q_j·k_i), kept for j ≤ t
    weights = torch.einsum("...ti,...ji->...tj", qk, qk).masked_fill(~mask, 0)
    return weights @ v


def hla2_chunked(q, k, v, chunk):
    """docs/math.md §5 without decay, every chunk at once: [B, H, T, d] → [B, H, T, dv]."""
    b, h, t, d = q.shape
    dv = v.shape[-1]
    n = t // chunk
    q, k, v = (x.reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, v))
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # S at each chunk start: the exclusive prefix sum of the chunks' Kᵀ K.
    s_step = k.transpose(-1, -2) @ k
    s = torch.cumsum(s_step, dim=2) - s_step
    w = (q @ k.transpose(-1, -2)).masked_fill(~lower, 0)
    a = q @ s.transpose(-1, -2) + w @ k
    z_step = a.transpose(-1, -2) @ v
    z = torch.cumsum(z_step, dim=2) - z_step
    o = q @ z + (q @ a.transpose(-1, -2)).masked_fill(~lower, 0) @ v
    return o.reshape(b, h, t, dv)


def check_hla2():
    """The matmul decomposition equals the definition in float64 (ragged chunking aside)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 3, 48, 8, device="cuda", dtype=torch.float64, generator=gen) for _ in range(3))
    want = hla2_definition(q, k, v)
    got = hla2_chunked(q, k, v, 16)
    error = ((got - want).norm() / want.norm()).item()
    if error > 1e-10:
        print(f"gpu-reference: hla2's chunk decomposition is off by {error:.2e} (relative)", file=sys.stderr)
    return error


def fwd_bwd(fn, inputs):
    """A step that runs `fn` forward, then backward from a fixed random cotangent."""
    out = fn(*inputs)
    grad = torch.randn_like(out)

    def step():
        for x in inputs:
            x.grad = None
        fn(*inputs).backward(grad)

    return step


def leaves(shape, dtype, count, scale=1.0):
    return [(torch.randn(*shape, device="cuda", dtype=dtype) * scale).requires_grad_() for _ in range(count)]


def cases(b, t, h, d, chunk):
    """(name, dtype, step builder) for every reference that this machine can run."""
    scale = d**-0.5
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        def sdpa(dtype=dtype):
            qkv = leaves((b, h, t, d), dtype, 3)
            return fwd_bwd(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), qkv)

        def hla2(dtype=dtype):
            qkv = leaves((b, h, t, d), dtype, 3, scale)
            return fwd_bwd(lambda q, k, v: hla2_chunked(q, k, v, chunk), qkv)

        out.append(("torch sdpa causal", dtype, sdpa))
        out.append(("torch hla2 chunk decomposition", dtype, hla2))
    try:
        from fla.ops.gla import chunk_gla
        from fla.ops.linear_attn import chunk_linear_attn
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as error:  # noqa: BLE001 - any import failure means: not here
        print(f"gpu-reference: flash-linear-attention not importable ({error}); its rows skipped", file=sys.stderr)
        return out
    for dtype in (torch.float32, torch.bfloat16):
        def gla(dtype=dtype):
            q, k, v = leaves((b, t, h, d), dtype, 3, scale)
            g = torch.nn.functional.logsigmoid(torch.randn(b, t, h, d, device="cuda", dtype=dtype)).div(16).requires_grad_()
            return fwd_bwd(lambda q, k, v, g: chunk_gla(q, k, v, g)[0], [q, k, v, g])

        def simple_gla(dtype=dtype):
            q, k, v = leaves((b, t, h, d), dtype, 3, scale)
            g = torch.nn.functional.logsigmoid(torch.randn(b, t, h, device="cuda", dtype=dtype)).div(16).requires_grad_()
            return fwd_bwd(lambda q, k, v, g: chunk_simple_gla(q, k, v, g)[0], [q, k, v, g])

        def linear(dtype=dtype):
            qkv = leaves((b, t, h, d), dtype, 3, scale)
            return fwd_bwd(lambda q, k, v: chunk_linear_attn(q, k, v, normalize=False)[0], qkv)

        out.append(("fla chunk_gla", dtype, gla))
        out.append(("fla chunk_simple_gla", dtype, simple_gla))
        out.append(("fla chunk_linear_attn", dtype, linear))
    return out


def write(report, args):
    """reference.json and reference.md in args.out."""
    shape = report["shape"]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(args.out, "reference.md"), "w") as f:
        f.write(f"# Reference timings on {report['device']} (PyTorch {report['torch']})\n\n")
        f.write(
            f"Forward + backward, B{shape['batch']} T{shape['seq_len']} H{shape['heads']} "
            f"d{shape['head_dim']}, median of {args.reps}, TF32 matmuls allowed.\n\n"
        )
        f.write("| what | dtype | ms |\n|---|---|---|\n")
        for row in report["rows"]:
            f.write(f"| {row['name']} | {row['dtype']} | {row['fwd_bwd_ms']:.3f} |\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--shape", default="4,2048,16,128", help="B,T,H,D")
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    b, t, h, d = (int(x) for x in args.shape.split(","))
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    error = check_hla2()
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": {"batch": b, "seq_len": t, "heads": h, "head_dim": d, "chunk": args.chunk},
        "tf32": True,
        "hla2_decomposition_relative_error_f64": error,
        "rows": [],
    }
    for name, dtype, build in cases(b, t, h, d, args.chunk):
        try:
            ms = time_ms(build(), args.reps)
        except Exception as failure:  # noqa: BLE001 - a reference that fails is reported, not fatal
            print(f"gpu-reference: {name} {dtype} failed: {failure}", file=sys.stderr)
            continue
        row = {"name": name, "dtype": str(dtype).removeprefix("torch."), "fwd_bwd_ms": round(ms, 4)}
        report["rows"].append(row)
        print(f"{row['name']:<34} {row['dtype']:<9} {row['fwd_bwd_ms']:>9.3f} ms", flush=True)
        # After every row: a run stopped by its time limit keeps what it measured.
        if args.out:
            write(report, args)
    flops = 2 * b * h * (t // args.chunk) * (2 * args.chunk**2 * (3 * d + d) + 4 * args.chunk * d * 2 * d)
    print(f"(hla2 forward matmul work at this shape: {flops / 1e9:.1f} GFLOP; math.md §5)")


if __name__ == "__main__":
    main()
