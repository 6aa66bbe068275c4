#!/usr/bin/env bash
# A real Megatron-LM pretrain_gpt.py on one GPU through advisor-launch, with the hooks: unattended.
#
#   bash benchmarks/gpu/megatron_launch.sh RESULTS_DIR CHECKOUT [CHECKOUT...]
#   bash benchmarks/gpu/megatron_launch.sh --cpu-dry-run RESULTS_DIR CHECKOUT    # here, no GPU
#
# For each checkout (core_v0.15.2 under Python >= 3.10, core_v0.19.0 under >= 3.12): copy it to
# a temporary directory, build its dataset helpers, and for each layout below run
#   advisor estimate ... -o RESULTS/<tag>/<layout>/estimate.json
#   python -m launch torchrun --from estimate.json --megatron-lm COPY --mock-data \
#       --profile-dir RESULTS/<tag>/<layout>/profile -- <no Transformer Engine flags> --train-iters 10 ...
#   advisor profile show RESULTS/<tag>/<layout>/profile --format json
# keeping the launcher's and Megatron's output (launch.log) and the exit status (status; 124 past
# LAUNCH_TIMEOUT_S seconds, default 900). TP 1, one
# GPU: the layouts are models of Llama 3.1 8B's layer shape (h 4096, h_ffn 14336, 32 heads, 8 KV
# heads, v 128256) with few layers, at sequence 4096, estimated with --no-flash-attn because
# Megatron's local layers (no Transformer Engine) use unfused attention. What it adds: the hooks'
# CUDA backend on a real run (never run before: the campaign emulator's CUDA path failed on the
# probe), measured peaks against seed 004's estimate, and both pretrain signatures on a GPU.
#
# Needs: python3 with torch (CUDA), numpy, click, rich, pybind11, make, g++; this repository is put on
# PYTHONPATH (no install). --cpu-dry-run runs a tiny model on the CPU under the test double
# tests/fixtures/cuda_on_cpu over gloo, to check the script itself.
set -uo pipefail

cpu=0
if [ "${1:-}" = "--cpu-dry-run" ]; then cpu=1; shift; fi
if [ $# -lt 2 ]; then
    echo "usage: $0 [--cpu-dry-run] RESULTS_DIR CHECKOUT [CHECKOUT...]" >&2
    exit 2
fi
results=$(realpath -m "$1"); shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
export PATH="$(dirname "$(command -v "$python")"):$PATH"  # its torchrun
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" NO_VCS_VERSION=1 PYTHONDONTWRITEBYTECODE=1
no_te=(--transformer-impl local --no-rope-fusion --no-persist-layer-norm --no-gradient-accumulation-fusion
       --no-masked-softmax-fusion)
training=(--train-iters 10 --lr 1e-4 --log-interval 1 --eval-iters 0 --eval-interval 1000)
# the eager SwiGLU the H200 runs ran, priced by the estimate, whose row writes the flag (after '--' it
# conflicts with a row priced fused: launch/arguments.py MEMORY_FLAGS)
shape=(--model llama3.1-8b --seq-len 4096 --gbs 8 --no-flash-attn --no-bias-swiglu-fusion)
declare -A layouts=(
    [l2-mbs1]="--num-layers 2 --mbs 1"
    [l4-mbs2]="--num-layers 4 --mbs 2"
)
# LAYOUTS="name:estimate options;..." replaces them (e.g. the H200's out-of-memory boundary);
# TARGET replaces the estimate's memory target, TRAIN_ITERS the iterations; NO_PROFILE=1 launches
# without the hooks (Megatron's own memory reports, which the hooks' resets would cut short).
if [ -n "${LAYOUTS:-}" ]; then
    layouts=()
    IFS=';' read -ra specs <<< "$LAYOUTS"
    for spec in "${specs[@]}"; do layouts[${spec%%:*}]="${spec#*:}"; done
fi
read -ra target <<< "${TARGET:---mem 80}"
training[1]=${TRAIN_ITERS:-10}
if [ "$cpu" = 1 ]; then
    export CUDA_ON_CPU=1 OMP_NUM_THREADS=1 PYTHONPATH="$repo/tests/fixtures/cuda_on_cpu:$PYTHONPATH"
    no_te+=(--distributed-backend gloo)
    training=(--train-iters 2 --lr 1e-4 --log-interval 1 --eval-iters 0 --eval-interval 1000)
    shape=(--model llama3.1-8b --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --num-query-groups 2
           --vocab-size 4096 --seq-len 32 --gbs 4 --no-flash-attn --no-bias-swiglu-fusion)
fi

mkdir -p "$results"
"$python" -c 'import torch, sys; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.cuda.is_available()}")' \
    | tee "$results/environment.txt"
[ "$cpu" = 1 ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$results/environment.txt" 2>&1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
for source in "$@"; do
    tag=$(basename "$source")
    copy="$work/$tag"
    cp -r "$source" "$copy" && chmod -R u+w "$copy"
    suffix=$("$python" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
    if ! make -C "$copy/megatron/core/datasets" LIBEXT="$suffix" CXX="${CXX:-g++}" \
            CPPFLAGS="$("$python" -m pybind11 --includes)" > "$results/$tag-helpers.log" 2>&1; then
        echo "$tag: building the dataset helpers failed (see $tag-helpers.log)" | tee -a "$results/summary.txt"
        failures=$((failures + 1))
        continue
    fi
    for name in "${!layouts[@]}"; do
        out="$results/$tag/$name"
        profile=(--profile-dir "$out/profile")
        [ "${NO_PROFILE:-0}" = 1 ] && profile=()
        mkdir -p "$out"
        # shellcheck disable=SC2086  # the layout's options are words
        "$python" -m advisor estimate "${shape[@]}" ${layouts[$name]} --gpus 1 "${target[@]}" --format json \
            -o "$out/estimate.json" 2> "$out/estimate.err"
        timeout "${LAUNCH_TIMEOUT_S:-900}" "$python" -m launch torchrun --from "$out/estimate.json" --megatron-lm "$copy" --mock-data \
            "${profile[@]}" -- "${no_te[@]}" "${training[@]}" > "$out/launch.log" 2>&1
        status=$?
        echo "$status" > "$out/status"
        if [ "$status" != 0 ]; then
            failures=$((failures + 1))
        elif [ "${NO_PROFILE:-0}" != 1 ]; then
            "$python" -m advisor profile show "$out/profile" --format json > "$out/show.json" 2> "$out/show.err"
        fi
        echo "$tag $name: exit $status" | tee -a "$results/summary.txt"
    done
done
exit $((failures > 0))
