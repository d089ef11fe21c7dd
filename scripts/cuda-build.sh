#!/usr/bin/env bash
# Builds the `cuda` feature offline: the LLVM that cubecl-cuda compiles kernels with comes from
# Debian's llvm-22-dev instead of the archive its build would download.
#
#   scripts/cuda-build.sh [cargo build arguments]    # cargo build --release --features cuda …
#   scripts/cuda-build.sh --test [test arguments]    # then the PTX tests of hla-model
#                                                    # (src/ptx_tests/) and train/tests/cuda.rs
#                                                    # (no GPU needed)
#   scripts/cuda-build.sh --setup-only               # only the LLVM set-up below
#
# Why this works, read from the sources of the crates Cargo.lock pins:
# - cubecl-cuda 0.11.3 turns kernels into PTX with LLVM's NVPTX target (cubecl-llvm 0.11.3,
#   pliron-llvm 0.19, llvm-sys 231). llvm-sys is built with `no-llvm-linking`: cubecl-llvm's
#   build script links LLVM itself, through tracel-llvm-bundler 23.1.0-4.
# - The bundler's build script downloads LLVM into
#   $XDG_DATA_HOME/tracel/tracel-llvm-23.1.0-4 (~/.local/share when XDG_DATA_HOME is unset or
#   not absolute), unless the marker `.tracel-llvm-installed` exists there. Nothing lets it
#   use a system LLVM, except that marker: cubecl-llvm's build script then only runs that
#   folder's `bin/llvm-config --link-static` (--cxxflags, --includedir, --libdir, --libs,
#   --system-libs) and links what it answers, statically.
# - Debian's LLVM 22 has every LLVM C function pliron-llvm and cubecl-llvm call, with the same
#   number of arguments. llvm-sys 231 follows LLVM 23's headers; its enums differ from 22's
#   only where cubecl's path does not look: the split branch opcodes, the byte type and the
#   value kinds after the one LLVM 23 inserts are read only by pliron's import of LLVM IR,
#   and cubecl emits neither of the two new atomic operations.
# So this script puts the marker and an `llvm-config` that answers for Debian's LLVM 22 in that
# folder, then builds. A later plain `cargo build/clippy/test --features cuda` finds them too.
# To undo: remove the folder (the script says which). cubecl-llvm's build script does not
# watch llvm-config: after pointing HLA_LLVM_CONFIG elsewhere, `cargo clean -p cubecl-llvm`.
#
# Environment:
#   HLA_LLVM_CONFIG  another LLVM's llvm-config, 22 or newer (default: Debian's llvm-22, which
#                    the script installs with apt-get when it runs as root)
set -euo pipefail
cd "$(dirname "$0")/.."

mode=build
case "${1:-}" in
--setup-only | --test)
    mode="${1#--}"
    shift
    ;;
esac

# The Debian packages: LLVM 22's headers, static libraries and llvm-config (llvm-22-dev, from
# bookworm-security on Debian 12); Polly's static libraries, which `llvm-config --libs` lists
# (libpolly-22-dev); zstd, which `--system-libs` lists and llvm-22-dev does not pull in; g++
# for cubecl-llvm's two C++ shims, compiled against LLVM's C++ headers.
packages=(llvm-22-dev libpolly-22-dev libzstd-dev g++)
llvm_config="${HLA_LLVM_CONFIG:-/usr/lib/llvm-22/bin/llvm-config}"

if [ -z "${HLA_LLVM_CONFIG:-}" ]; then
    missing=()
    for package in "${packages[@]}"; do
        if [ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)" != "install ok installed" ]; then
            missing+=("$package")
        fi
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
            echo "cuda-build: missing Debian packages; install them with:" >&2
            echo "  sudo apt-get install ${missing[*]}" >&2
            echo "(or set HLA_LLVM_CONFIG to an LLVM 22 or newer llvm-config)" >&2
            exit 1
        fi
        echo "cuda-build: installing ${missing[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
fi

if [ ! -x "$llvm_config" ]; then
    echo "cuda-build: $llvm_config is not an executable llvm-config" >&2
    exit 1
fi
version="$("$llvm_config" --version)"
if [ "${version%%.*}" -lt 22 ]; then
    echo "cuda-build: $llvm_config is LLVM $version; cubecl-llvm calls LLVM 22's C API" >&2
    exit 1
fi

# The folder tracel-llvm-bundler 23.1.0-4 reads (dirs::data_local_dir() on Linux). Keep the
# version in step with Cargo.lock's tracel-llvm-bundler.
if [[ "${XDG_DATA_HOME:-}" == /* ]]; then
    data_home="$XDG_DATA_HOME"
else
    data_home="$HOME/.local/share"
fi
bundle="$data_home/tracel/tracel-llvm-23.1.0-4"
marker="$bundle/.tracel-llvm-installed"
stamp="$bundle/hla-system-llvm"

if ! grep -A1 '^name = "tracel-llvm-bundler"$' Cargo.lock | grep -qx 'version = "23.1.0-4"'; then
    echo "cuda-build: Cargo.lock no longer pins tracel-llvm-bundler 23.1.0-4: update this script" >&2
    exit 1
fi

if [ -e "$marker" ] && [ ! -e "$stamp" ]; then
    # The bundler's own download (a machine with the network): it is LLVM 23, leave it.
    echo "cuda-build: using the LLVM bundle already in $bundle" >&2
else
    mkdir -p "$bundle/bin"
    # An llvm-config that is Debian's, except for one answer: the bundler turns each word of
    # `--system-libs` into a library name by its file stem, so Debian's
    # /usr/lib/x86_64-linux-gnu/libz3.so would become `-llibz3`, which no linker finds. Such
    # paths are given as -lNAME instead.
    wrapper="$(cat <<EOF
#!/usr/bin/env bash
# Written by hla's scripts/cuda-build.sh: tracel-llvm-bundler's llvm-config, answered by
# $llvm_config (LLVM $version).
set -euo pipefail
out="\$("$llvm_config" "\$@")"
case " \$* " in
*" --system-libs "*)
    words=()
    for word in \$out; do
        case "\$word" in
        /*.so | /*.so.* | /*.a)
            name="\${word##*/}"
            name="\${name#lib}"
            name="\${name%%.so*}"
            word="-l\${name%.a}"
            ;;
        esac
        words+=("\$word")
    done
    out="\${words[*]}"
    ;;
esac
printf '%s\n' "\$out"
EOF
)"
    # Rewritten only when it changes: the marker's time is what the bundler's build script
    # watches, and a rerun rebuilds cubecl-llvm and everything above it.
    if [ ! -e "$bundle/bin/llvm-config" ] || [ "$(cat "$bundle/bin/llvm-config")" != "$wrapper" ]; then
        printf '%s\n' "$wrapper" >"$bundle/bin/llvm-config"
        chmod +x "$bundle/bin/llvm-config"
    fi
    echo "not tracel's LLVM 23: hla's scripts/cuda-build.sh points tracel-llvm-bundler at $llvm_config (LLVM $version)" >"$stamp"
    # Last, so that an interrupted set-up leaves no marker without its llvm-config.
    [ -e "$marker" ] || : >"$marker"
    echo "cuda-build: LLVM $version ($llvm_config) stands in for tracel's bundle in $bundle" >&2
fi

if [ "$mode" = setup-only ]; then
    exit 0
fi
# cudarc picks the CUDA API it binds from `nvcc --version`; without nvcc it binds the newest it
# knows and says so in a cargo warning (CUDARC_CUDA_VERSION, e.g. 12080, chooses another).
if [ "$mode" = test ]; then
    cargo build --release --features cuda
    # hla-model's PTX tests (src/ptx_tests/: every GPU kernel through the linked LLVM) and
    # the binary's own (train/tests/cuda.rs), both from the workspace's test build (one
    # build of Burn for the two).
    ptx="$(cargo test --release --features cuda --lib --no-run --message-format=json |
        grep '"target":{[^}]*"name":"hla_model"' |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')"
    cli="$(cargo test --release --features cuda --test cuda --no-run --message-format=json |
        grep '"target":{[^}]*"name":"cuda"' |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')"
    # The kernels the tests compile call exp: libdevice, from PyPI when no toolkit has it.
    # CUDA_PATH is given to the tests only: cudarc's build watches it, and a change rebuilds
    # Burn.
    if [ -z "${CUDA_PATH:-}" ]; then
        libdevice="$(scripts/cuda-libdevice.sh)"
        eval "$libdevice"
    fi
    (cd model && env CUDA_PATH="$CUDA_PATH" "$ptx" ptx_tests "$@")
    cd train
    exec env CUDA_PATH="$CUDA_PATH" "$cli" "$@"
fi
exec cargo build --release --features cuda "$@"
