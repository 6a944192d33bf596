#!/usr/bin/env bash
# The GPU half of issue 9, verified in two device calls on an H100 / H200 (image: torch 2.11 + CUDA 13,
# Triton, no network, no plotly / gradio). What the next session with a GPU runs, in this order:
#
#   0. Here, on a machine with PyPI, from the repo root (about 110 MB in .whl/, git-ignored, never committed):
#        bash benchmarks/gpu_session.sh fetch
#      It downloads, as CPython 3.12 manylinux wheels, flash-attn-4==4.0.0b36 (FlashAttention-4, CuTe DSL;
#      the version whose interface models/attention.py was written against), nvidia-cutlass-dsl==4.8.1 with
#      its libs-base and libs-cu13 (CUDA 13 driver on the image), apache-tvm-ffi, torch-c-dlpack-ext,
#      quack-kernels, and plotly (for the explorer-view GPU tests). The CuTe DSL compiler wheel alone is
#      92 MB and a call carries at most 64 MiB, so the wheels are split into .whl/part1 and .whl/part2.
#   1. run(command="bash benchmarks/gpu_session.sh call1", carry=[".whl/part1"], timeout_s=600)
#      parks part 1 in /tmp on the machine, runs every GPU test (FA4 not yet installed: it is skipped with
#      its reason), then the benchmark for the backends on the image.
#   2. At once (a machine stays warm ~30 s after a call; /tmp survives only on the same machine):
#      run(command="bash benchmarks/gpu_session.sh call2", carry=[".whl/part2"], timeout_s=600)
#      joins and installs the wheels, reruns every GPU test with fa4 present, then fa4's benchmark points
#      (plus naive, the error reference), merged into call 1's results file.
#   3. Back here: copy the JSON from each call's files_at into benchmarks/results/, then
#        python -m benchmarks.attention --replot benchmarks/results/<file>.json && python scripts/readme_tables.py
#      and commit the results (device, date and commit are in the file) with the regenerated README.
#
# Benchmark cases (bf16, recsys mask with causal and bidirectional prefix, tanh cap and cap off):
# phoenix-prod at B=32 and at the production batch B=256 (preset phoenix-prod-b256, when the benchmark
# module has it), and the long sweep T = 512 ... 32768 (naive's OOM recorded, the flash paths continue).
# flash-attn 2 is not built here (source only, tens of minutes); its varlen path is covered by CPU
# stand-in tests until a session carries a build.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:$PWD"
step=${1:-}
park=/tmp/gpu-session          # survives between the two calls on a warm machine
site=/tmp/site                 # carried wheels are installed here

fetch() {
    git check-ignore -q .whl/x || { echo ".whl/ must be git-ignored (it is in .gitignore)"; return 1; }
    rm -rf .whl && mkdir -p .whl/all .whl/part1 .whl/part2
    local plat="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
                --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
                --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
    # shellcheck disable=SC2086
    python3 -m pip download -q --pre --no-deps --only-binary=:all: $plat -d .whl/all \
        flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
        nvidia-cutlass-dsl-libs-cu13==4.8.1 'apache-tvm-ffi>=0.1.11,<0.2' torch-c-dlpack-ext==0.1.5 \
        quack-kernels==0.6.5 plotly==6.5.0 || return 1
    # part1: the first 48 MB of the compiler wheel + plotly; part2: the rest of it + every other wheel
    split -b 48000000 .whl/all/nvidia_cutlass_dsl_libs_cu13-*.whl .whl/part1/libs-cu13.chunk.
    mv .whl/part1/libs-cu13.chunk.ab .whl/part2/
    basename .whl/all/nvidia_cutlass_dsl_libs_cu13-*.whl > .whl/part2/libs-cu13.name
    mv .whl/all/plotly-*.whl .whl/part1/
    find .whl/all -name '*.whl' ! -name 'nvidia_cutlass_dsl_libs_cu13-*' -exec mv {} .whl/part2/ \;
    rm -rf .whl/all
    local tree; tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
    for part in part1 part2; do
        local bytes=$(( $(du -sb .whl/$part | cut -f1) + tree ))
        echo "$part + working tree: $(( bytes / 1048576 )) MiB (a call carries at most 64)"
        [ "$bytes" -lt $(( 64 * 1048576 )) ] || { echo "$part is too large to carry"; return 1; }
    done
}

header() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'capability', torch.cuda.get_device_capability())"
}

install_wheels() {   # $@: wheel files
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$@" \
        && export PYTHONPATH="$site:$PYTHONPATH"
}

gpu_tests() {
    python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention.py tests/test_device.py -rs
}

bench() {   # $1: backends; $2: seconds for the whole set
    local stop=$(( $(date +%s) + $2 )) presets=(phoenix-prod)
    python3 -m benchmarks.attention --help | grep -q phoenix-prod-b256 && presets+=(phoenix-prod-b256)
    presets+=(long)
    for p in "${presets[@]}"; do
        local left=$(( stop - $(date +%s) ))
        [ "$left" -gt 20 ] || { echo "no time left for $p"; continue; }
        python3 -m benchmarks.attention --device cuda --preset "$p" --backends "$1" --no-plot \
            --budget-s $(( left / 2 > 60 ? left / 2 : left ))
    done
}

collect() {
    mkdir -p "$park/results"
    find benchmarks/results -name '*.json' -newer "$park/start" -exec cp {} "$park/results/" \;
    if [ -n "${OUT:-}" ]; then cp "$park"/results/*.json "$OUT"/ 2>/dev/null; cp "$park"/*.log "$OUT"/ 2>/dev/null; fi
    ls -la "$park/results"
}

case "$step" in
fetch)
    fetch ;;
call1)
    mkdir -p "$park" && touch "$park/start"
    exec > >(tee -a "$park/call1.log") 2>&1
    header
    cp .whl/part1/* "$park/"                                    # for call 2
    install_wheels "$park"/plotly-*.whl || echo "plotly not installed: the explorer-view GPU test skips"
    gpu_tests
    bench naive,sdpa,sdpa-flash,sdpa-efficient,sdpa-cudnn,flex,structured 420
    collect ;;
call2)
    exec > >(tee -a "$park/call2.log") 2>&1
    header
    if ! ls "$park"/libs-cu13.chunk.aa >/dev/null 2>&1; then
        echo "part 1 of the wheels is not on this machine (a fresh one: call 1 ran elsewhere or too long ago)."
        echo "Run call 1 again and call 2 straight after it."
        exit 1
    fi
    cp "$park"/results/*.json benchmarks/results/ 2>/dev/null          # merge into call 1's file
    touch "$park/start"
    cat "$park"/libs-cu13.chunk.aa .whl/part2/libs-cu13.chunk.ab > "$park/$(cat .whl/part2/libs-cu13.name)"
    install_wheels "$park"/plotly-*.whl "$park"/nvidia_cutlass_dsl_libs_cu13-*.whl .whl/part2/*.whl || exit 1
    python3 -c "from models.attention import fa4_missing; print('fa4:', fa4_missing() or 'available')"
    gpu_tests
    bench naive,fa4 480
    collect ;;
*)
    sed -n '2,30p' "$0"; exit 2 ;;
esac
