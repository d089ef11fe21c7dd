#!/usr/bin/env bash
# The prepared GPU measurement, for a machine with a GPU, in one command of about 10
# minutes (a GPU machine may be at hand for minutes only; each step has its time limit).
# First the values, every device at once: the GPU tests on the real device (the kernels
# against their composed forms, wgpu) and `hla verify` (every operator's forms agree on
# the device, as the device runs them by default (the nodes, the attention's kernels, on
# cuda their tensor-core tiles, checked against Burn's attention op) and as the node with
# its gradients: verify-node.txt; where cuda's disagree or fail, not only run out of time,
# again with the tensor cores off, and where they agree so its times are taken so). Then
# the times, the GPU kernels against the nodes and the composed forms in the same rounds,
# most wanted first: on the first device (cuda) the operators at flash-linear-attention's
# published chunk_gla shape (B4 T2048 H16 d128, chunk 64) with plain matmuls and
# nanoGPT's training step and one sequence of 2048 (`train`), then the other device's
# operators, PyTorch's references where PyTorch sees the GPU, third order, hla2's node
# with its tile products off the tensor cores (cuda), the other device's training steps
# and the cost model. Into experiments/bench/gpu-<device>/ (tests.txt, verify.txt and
# verify-node.txt with their exit status in .rc, b4-h16-d128/,
# b4-h16-d128-no-tensor-cores/ and train/ with bench.json and bench.md) and
# experiments/bench/gpu-machine.txt. First run on an NVIDIA
# H200 on 2026-12-04 (experiments/bench/README.md).
#
#   scripts/gpu-bench.sh --build     on the CPU machine, beforehand: a stripped `hla` with
#                                    the GPU features, the GPU test executable and (with
#                                    cuda) CUDA's libdevice, packed into
#                                    .gpu/hla-gpu.tar.xz (a GPU machine may have no Rust
#                                    and no network; the pack travels with the tree)
#   scripts/gpu-bench.sh [HLA]       on the GPU machine. HLA: an hla binary built with
#                                    --features wgpu and/or cuda (default: .gpu/hla,
#                                    unpacked from the pack when only it is there, else
#                                    target/release/hla)
#
# Environment: HLA_GPU_FEATURES, the features --build compiles in (default "wgpu cuda";
# cuda through scripts/cuda-build.sh, about 30 minutes cold); HLA_GPU_DEVICES, the devices
# in order (default "cuda wgpu"); HLA_GPU_BENCH_SCALE, a whole number that multiplies every
# step's time limit (default 1); HLA_GPU_BENCH_OUT, the folder written in place of
# experiments/bench; on a machine with PyTorch, scripts/gpu-reference.py measures the
# references (PyTorch's attention, flash-linear-attention when it imports, hla2's chunk
# decomposition in PyTorch) into experiments/bench/gpu-reference/.
#
# Without a GPU, wgpu may open Mesa's software driver (lavapipe) instead: point
# VK_ICD_FILENAMES at the GPU's Vulkan driver to be sure. A rehearsal there checks that
# every step starts (each then runs out of time; about 8 minutes) without writing over the
# repository's results:
#
#   HLA_GPU_FEATURES=wgpu scripts/gpu-bench.sh --build
#   HLA_GPU_DEVICES=wgpu HLA_GPU_BENCH_OUT=/tmp/rehearsal scripts/gpu-bench.sh
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
    target="${CARGO_TARGET_DIR:-target}"
    rm -rf .gpu/hla .gpu/tests "$pack"
    mkdir -p .gpu/tests
    # Now: building the tests below links target/release/hla again, with their features.
    strip -o .gpu/hla "$target/release/hla"
    # The test executable of the GPU path that needs nothing else (model/tests/wgpu/:
    # train's calls the hla binary at its build path), built with wgpu alone (CI's feature
    # set, so it shares CI's build; cuda would link a second LLVM into the pack).
    tests=$(cargo test --release --workspace --features wgpu --test wgpu --no-run \
        --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "/model#" in m["package_id"]:
        print(m["executable"])
')
    strip -o .gpu/tests/model-wgpu "$tests"
    packed=(hla tests)
    if [[ " $features " == *" cuda "* ]]; then
        # libdevice, for a GPU machine whose CUDA (if any) is not where cubecl looks.
        scripts/cuda-libdevice.sh .gpu/cuda >/dev/null
        packed+=(cuda)
    fi
    tar -C .gpu -cf - "${packed[@]}" | xz -9 -T0 >"$pack"
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
devices="${HLA_GPU_DEVICES:-cuda wgpu}"
# Seconds per step: 200 for the values, then 9 minutes for the rest at most (a GPU
# machine's command may have 10 minutes: the last steps may not be reached).
scale="${HLA_GPU_BENCH_SCALE:-1}"
results="${HLA_GPU_BENCH_OUT:-experiments/bench}"
limit() { echo $(($1 * scale)); }

# libdevice for the cuda device (cubecl links it into kernels that call exp): a CUDA
# toolkit's where there is one, else the pack's.
cuda_roots=(/usr/local/cuda /opt/cuda /usr/lib/cuda /usr)
if [ -z "${CUDA_PATH:-}" ] && [ -e .gpu/cuda/nvvm/libdevice/libdevice.10.bc ]; then
    found=0
    for root in "${cuda_roots[@]}"; do
        [ -e "$root/nvvm/libdevice/libdevice.10.bc" ] && found=1 && break
    done
    [ "$found" = 1 ] || export CUDA_PATH="$PWD/.gpu/cuda"
fi

mkdir -p "$results"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
        >"$results/gpu-machine.txt" 2>&1 || true
fi

# First the values, on every device at once (they took 2 to 3 minutes each on an H200,
# mostly compiling kernels: side by side they fit the time): the GPU tests (the kernels
# against their composed forms, on wgpu's default device, the GPU), then `hla verify`
# (every operator's forms agree on the device; the node's, with its gradients, too). A device the binary lacks, or one this
# machine cannot open, is left out of the timings.
# `hla verify --device $1` with the further arguments, into $2.txt, its exit status into
# $2.rc (124: it ran out of time).
check() {
    local device=$1 name=$2 rc=0
    shift 2
    timeout "$(limit 200)" "$hla" verify --device "$device" "$@" >"$name.txt" 2>&1 || rc=$?
    echo "$rc" >"$name.rc"
}
for device in $devices; do
    out="$results/gpu-$device"
    mkdir -p "$out"
    if [ "$device" = wgpu ] && [ -x .gpu/tests/model-wgpu ]; then
        { timeout "$(limit 200)" .gpu/tests/model-wgpu --test-threads 1 >"$out/tests.txt" 2>&1 ||
            echo "gpu-bench: the GPU tests failed or stopped (see $out/tests.txt)" >&2; } &
    fi
    check "$device" "$out/verify" &
    # The node (its fused kernels on this device) forward and backward against the
    # reference: the cuda code of its kernels has run nowhere else. With 256 heads its
    # passes over the chunks fill the GPU and run whole; verify.txt's 4 heads split them
    # (an update matmul and a scan each).
    check "$device" "$out/verify-node" --form node --gradients --heads 256 &
done
wait
agrees() { tail -n 1 "$1.txt" 2>/dev/null | grep -q "^all forms agree"; }
# Whether a check failed other than by running out of time: its forms disagree, or it
# stopped (a panic, a fault).
faulted() {
    local rc
    rc=$(cat "$1.rc" 2>/dev/null || echo 0)
    [ "$rc" != 0 ] && [ "$rc" != 124 ]
}
present=()
# Devices whose forms disagreed, or which stopped, with the tensor cores (cuda) and agree
# without them: their times are taken without them too (`--tensor-cores off`, the register
# tiles), so a fault in the tensor-core tiles, whose cuda code has run nowhere else, still
# leaves the node's and the attention's kernels measured. A check that only ran out of
# time (cuda compiles every kernel through LLVM) changes nothing.
no_cores=()
for device in $devices; do
    out="$results/gpu-$device"
    cat "$out/tests.txt" "$out/verify.txt" "$out/verify-node.txt" 2>/dev/null || true
    if ! grep -q "^operator" "$out/verify.txt" 2>/dev/null; then
        echo "gpu-bench: $device: no such device here (see $out/verify.txt)" >&2
        continue
    fi
    # It ran: measure it, even where its forms disagree or it stopped.
    present+=("$device")
    agrees "$out/verify" && agrees "$out/verify-node" && continue
    echo "gpu-bench: $device: the forms disagree, or it stopped (see $out/verify.txt, $out/verify-node.txt)" >&2
    [ "$device" = cuda ] || continue
    faulted "$out/verify" || faulted "$out/verify-node" || continue
    check "$device" "$out/verify-no-tensor-cores" --tensor-cores off &
    check "$device" "$out/verify-node-no-tensor-cores" --form node --gradients --heads 256 \
        --tensor-cores off &
    wait
    cat "$out/verify-no-tensor-cores.txt" "$out/verify-node-no-tensor-cores.txt"
    if agrees "$out/verify-no-tensor-cores" && agrees "$out/verify-node-no-tensor-cores"; then
        no_cores+=("$device")
        echo "gpu-bench: $device: the forms agree with the tensor cores off: timing it so" >&2
    fi
done
# `--tensor-cores off` where the device's forms agree only without them (expanded
# unquoted: two words or none).
cores() { [[ " ${no_cores[*]} " == *" $1 "* ]] && echo "--tensor-cores off" || true; }

# Then the times, each kernel against its node and its composed form in the same rounds,
# in the order they matter (a GPU machine's command may end before the last): on the first
# device (cuda where it runs) the operators at flash-linear-attention's chunk_gla shape
# (B4 T2048 H16 d128, chunk 64) and plain matmuls, then nanoGPT's training step and one
# sequence of 2048 (`train`: what `train.form = "auto"` runs, the default route, against
# the others); the other device's operators; PyTorch's references; third order; hla2's
# node with its output step off the tensor cores (cuda); the other device's training
# steps; last the cost model, whose H200 rows at this shape are in the repository
# (experiments/bench/lavapipe/2026-12-07-routing/). Each measurement on its own: one that
# runs out of time leaves the others.
operators() {
    timeout "$(limit 100)" "$hla" bench --device "$1" --quick --only operators,matmul \
        --composed --operator-shape 4,16,128 --time 2048 $(cores "$1") \
        --operator hla2-chunked,linear-chunked,softmax --out "$results/gpu-$1/b4-h16-d128" ||
        echo "gpu-bench: $1 operators stopped (exit $?)" >&2
}
training() {
    timeout "$(limit 90)" "$hla" bench --device "$1" --quick --only train --composed \
        --workload nanogpt,long $(cores "$1") --out "$results/gpu-$1/train" ||
        echo "gpu-bench: $1 training steps stopped (exit $?)" >&2
}
third_order() {
    timeout "$(limit 45)" "$hla" bench --device "$1" --quick --only operators --composed \
        --operator-shape 4,16,128 --time 2048 --operator hla3-chunked $(cores "$1") \
        --out "$results/gpu-$1/b4-h16-d128-hla3" ||
        echo "gpu-bench: $1 third order stopped (exit $?)" >&2
}
# hla2's node with its output step on the register tiles, against the tensor cores of the
# operators above (cuda alone has them).
no_tensor_cores() {
    [ "$1" = cuda ] && [ -z "$(cores "$1")" ] || return 0
    timeout "$(limit 30)" "$hla" bench --device "$1" --quick --only operators --form node \
        --operator-shape 4,16,128 --time 2048 --operator hla2-chunked --tensor-cores off \
        --out "$results/gpu-$1/b4-h16-d128-no-tensor-cores" ||
        echo "gpu-bench: $1 node without tensor cores stopped (exit $?)" >&2
}
references() {
    python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null || return 0
    mkdir -p "$results/gpu-reference"
    PYTHONUNBUFFERED=1 timeout "$(limit 80)" python3 scripts/gpu-reference.py \
        --out "$results/gpu-reference" 2>&1 | tee "$results/gpu-reference/log.txt" ||
        echo "gpu-bench: the references stopped" >&2
}
# The cost model at the same shape, with this GPU's peaks, to read the times above against.
cost() {
    local gpu=h200
    nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H100 && gpu=h100
    timeout "$(limit 30)" "$hla" bench --device "$1" --only cost --gpu "$gpu" \
        --out "$results/gpu-$1/cost" || echo "gpu-bench: $1 cost model stopped (exit $?)" >&2
}
first="${present[0]:-}"
others=("${present[@]:1}")
if [ -n "$first" ]; then
    operators "$first"
    training "$first"
fi
for device in "${others[@]}"; do operators "$device"; done
references
for device in "${present[@]}"; do third_order "$device"; done
for device in "${present[@]}"; do no_tensor_cores "$device"; done
for device in "${others[@]}"; do training "$device"; done
for device in "${present[@]}"; do cost "$device"; done
if [ "${#present[@]}" = 0 ]; then
    echo "gpu-bench: no GPU device could run" >&2
    exit 1
fi
