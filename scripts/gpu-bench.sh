#!/usr/bin/env bash
# The prepared GPU measurement, for a machine with a GPU: `hla bench` of training steps,
# operators and matmuls on every GPU device the binary has (wgpu; cuda when built with
# it), each fused kernel against its composed form, into experiments/bench/gpu-<device>/
# (bench.json, bench.md, the time-vs-T charts). Sized for 10 minutes a device; not yet run
# on a GPU (no task has had one).
#
#   scripts/gpu-bench.sh [HLA]    HLA: an hla binary built with --features wgpu and/or
#                                 cuda (default target/release/hla)
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
for device in wgpu cuda; do
    # A device the binary lacks, or one this machine cannot open, fails at once.
    if ! "$hla" bench --device "$device" --quick --only matmul --json >/dev/null 2>&1; then
        echo "gpu-bench: no $device device here (or not in $hla); skipped" >&2
        continue
    fi
    out="experiments/bench/gpu-$device"
    timeout 300 "$hla" bench --device "$device" --quick --only train --composed \
        --workload nanogpt,long --out "$out/train"
    timeout 300 "$hla" bench --device "$device" --quick --only operators,matmul --composed \
        --operator-shape 4,16,128 --out "$out/b4-h16-d128"
    measured=1
done
if [ "$measured" = 0 ]; then
    echo "gpu-bench: no GPU device could run" >&2
    exit 1
fi
