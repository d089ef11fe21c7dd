#!/usr/bin/env bash
# The prepared GPU measurement, for a machine with a GPU: the GPU tests on the real device
# (the kernels against their composed forms), `hla verify` (every operator's forms agree on
# the device), then `hla bench` of training steps, operators and matmuls on every GPU
# device the binary has (wgpu; cuda when built with it), each fused kernel against its
# composed form, into experiments/bench/gpu-<device>/ (tests.txt, verify.txt, bench.json,
# bench.md, the time-vs-T charts). Sized for 10 minutes a device; not yet run on a GPU (no
# task has had one).
#
#   scripts/gpu-bench.sh --build     on the CPU machine, beforehand: a stripped `hla` with
#                                    the GPU features and the GPU test executables, packed
#                                    into .gpu/hla-gpu.tar.xz (a GPU machine may have no
#                                    Rust and no network; the pack travels with the tree)
#   scripts/gpu-bench.sh [HLA]       on the GPU machine. HLA: an hla binary built with
#                                    --features wgpu and/or cuda (default: .gpu/hla,
#                                    unpacked from the pack when only it is there, else
#                                    target/release/hla)
#
# Environment: HLA_GPU_FEATURES, the features --build compiles in (default "wgpu cuda";
# cuda through scripts/cuda-build.sh, about 30 minutes cold); HLA_GPU_DEVICES, the devices
# in order (default "wgpu cuda"); HLA_GPU_BENCH_TIMEOUT, the seconds each measurement of a
# device may take (default 300); on a machine with PyTorch, scripts/gpu-reference.py then
# measures the references (PyTorch's attention, flash-linear-attention, hla2's chunk
# decomposition in PyTorch) into experiments/bench/gpu-reference/.
#
# Without a GPU, wgpu may open Mesa's software driver (lavapipe) instead: point
# VK_ICD_FILENAMES at the GPU's Vulkan driver to be sure.
#
# Two problems: nanoGPT's step and one sequence of 2048 (`train`), and the operators at
# flash-linear-attention's published chunk_gla shape, B4 H16 d128 up to T = 2048.
set -euo pipefail
cd "$(dirname "$0")/.."
pack=.gpu/hla-gpu.tar.xz

# --build: everything the GPU machine runs, compiled here.
if [ "${1:-}" = --build ]; then
    features="${HLA_GPU_FEATURES:-wgpu cuda}"
    list="${features// /,}"
    if [[ " $features " == *" cuda "* ]]; then
        build=(scripts/cuda-build.sh)
    else
        build=(cargo build --release)
    fi
    "${build[@]}" --features "$list" --bin hla
    # The test executable of the GPU path that needs nothing else (model/tests/wgpu.rs:
    # train's calls the hla binary at its build path), built with the same features on
    # every crate, so it shares the build above.
    tests=$(cargo test --release --workspace --features "$list" --test wgpu --no-run \
        --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "/model#" in m["package_id"]:
        print(m["executable"])
')
    target="${CARGO_TARGET_DIR:-target}"
    rm -rf .gpu/hla .gpu/tests "$pack"
    mkdir -p .gpu/tests
    strip -o .gpu/hla "$target/release/hla"
    strip -o .gpu/tests/model-wgpu "$tests"
    tar -C .gpu -cf - hla tests | xz -9 -T0 >"$pack"
    size=$(stat -c %s "$pack")
    echo "gpu-bench: $pack, $((size / 1000000)) MB: hla ($features) and the model's GPU tests"
    if [ "$size" -gt 60000000 ]; then
        echo "gpu-bench: the pack is over 60 MB, more than a GPU machine takes with the tree" >&2
        exit 1
    fi
    exit 0
fi

if [ -z "${1:-}" ] && [ ! -x .gpu/hla ] && [ -f "$pack" ]; then
    tar -C .gpu -xJf "$pack"
fi
default=target/release/hla
[ -x .gpu/hla ] && default=.gpu/hla
hla="${1:-$default}"
measured=0
limit="${HLA_GPU_BENCH_TIMEOUT:-300}"
for device in ${HLA_GPU_DEVICES:-wgpu cuda}; do
    out="experiments/bench/gpu-$device"
    mkdir -p "$out"
    # First the tests of the GPU path, on the real device (wgpu's default device is the
    # GPU): the kernels against their composed forms, a training step against the CPU's.
    if [ "$device" = wgpu ] && [ -x .gpu/tests/model-wgpu ]; then
        timeout "$limit" .gpu/tests/model-wgpu --test-threads 1 2>&1 | tee "$out/tests.txt" ||
            echo "gpu-bench: the GPU tests failed or stopped (see $out/tests.txt)" >&2
    fi
    # Then the values: every operator's forms agree on this device (a device the binary
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
