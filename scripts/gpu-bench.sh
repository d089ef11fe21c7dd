#!/usr/bin/env bash
# The prepared GPU measurement, for a machine with a GPU: `hla verify` (every operator's
# forms agree on the device), then `hla bench` of training steps,
# operators and matmuls on every GPU device the binary has (wgpu; cuda when built with
# it), each fused kernel against its composed form, into experiments/bench/gpu-<device>/
# (bench.json, bench.md, the time-vs-T charts). Sized for 10 minutes a device; not yet run
# on a GPU (no task has had one).
#
#   scripts/gpu-bench.sh [HLA]    HLA: an hla binary built with --features wgpu and/or
#                                 cuda (default target/release/hla)
#
# Environment: HLA_GPU_DEVICES, the devices in order (default "wgpu cuda");
# HLA_GPU_BENCH_TIMEOUT, the seconds each of the two measurements of a device may take
# (default 300); on a machine with PyTorch, scripts/gpu-reference.py then measures the
# references (PyTorch's attention, flash-linear-attention, hla2's chunk decomposition in
# PyTorch) into experiments/bench/gpu-reference/.
#
# Without a GPU, wgpu may open Mesa's software driver (lavapipe) instead: point
# VK_ICD_FILENAMES at the GPU's Vulkan driver to be sure.
#
# Two problems: nanoGPT's step and one sequence of 2048 (`train`), and the operators at
# flash-linear-attention's published chunk_gla shape, B4 H16 d128 up to T = 2048.
set -euo pipefail
cd "$(dirname "$0")/.."
hla="${1:-target/release/hla}"
measured=0
limit="${HLA_GPU_BENCH_TIMEOUT:-300}"
for device in ${HLA_GPU_DEVICES:-wgpu cuda}; do
    out="experiments/bench/gpu-$device"
    mkdir -p "$out"
    # First the values: every operator's forms agree on this device (a device the binary
    # lacks, or one this machine cannot open, fails at once).
    if ! timeout "$limit" "$hla" verify --device "$device" 2>&1 | tee "$out/verify.txt"; then
        echo "gpu-bench: $device: no device, or its forms disagree (see $out/verify.txt)" >&2
        # It ran (and disagreed): measure anyway; it did not run: no such device here.
        grep -q "^operator" "$out/verify.txt" || continue
    fi
    # Each measurement on its own: one that runs out of time leaves the others.
    timeout "$limit" "$hla" bench --device "$device" --quick --only operators,matmul --composed \
        --operator-shape 4,16,128 --out "$out/b4-h16-d128" ||
        echo "gpu-bench: $device operators stopped (exit $?)" >&2
    timeout "$limit" "$hla" bench --device "$device" --quick --only train --composed \
        --workload nanogpt,long --out "$out/train" ||
        echo "gpu-bench: $device training steps stopped (exit $?)" >&2
    measured=1
done
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    timeout "$limit" python3 scripts/gpu-reference.py --out experiments/bench/gpu-reference || true
fi
if [ "$measured" = 0 ]; then
    echo "gpu-bench: no GPU device could run" >&2
    exit 1
fi
