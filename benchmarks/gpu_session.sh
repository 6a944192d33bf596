#!/usr/bin/env bash
# One GPU session's attention checks, run from the repo root on a CUDA machine (H100/H200):
#   bash benchmarks/gpu_session.sh [seconds] [flash-only]   (default 540 s: fits a 10-minute command;
#   flash-only: a second call on the still-warm machine, waiting for the build and skipping step 2)
# 1. starts building flash-attn from the carried sdist (.whl/flash_attn-*.tar.gz) in the background;
# 2. meanwhile: GPU exactness tests, then the phoenix-prod and long benchmarks for every other backend;
# 3. if the build finished in time: flash_attn's GPU tests and benchmark points, merged into the same file.
# Before the call, on a machine with PyPI (flash-attn has only an sdist there; the GPU machine has no network):
#   FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE pip download --no-deps --no-build-isolation --no-binary=:all: -d .whl flash-attn==2.8.3
# then run this with .whl carried; afterwards `python -m benchmarks.attention --replot <file>` and
# `python scripts/readme_tables.py` where plotly is installed, and commit the results.
# Results (JSON, HTML, PNG when plotly/kaleido are there) go to benchmarks/results/ and, when $OUT is
# set, are copied there. Copy benchmarks/results/ back into a later call's tree to merge into it.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:$PWD"
deadline=$(( $(date +%s) + ${1:-540} ))
touch /tmp/gpu-session-start
out=${OUT:-/tmp/gpu-session-out}; mkdir -p "$out"
log="$out/gpu-session.log"
exec > >(tee -a "$log") 2>&1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

if [ ! -e /tmp/fa-build.log ] && ! python3 -c "import flash_attn" 2>/dev/null && ls .whl/flash_attn-*.tar.gz >/dev/null 2>&1; then
    echo "building flash-attn in the background (sm90 only)"
    ( FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=90 MAX_JOBS=10 NVCC_THREADS=1 \
      setsid python3 -m pip install --no-build-isolation --no-deps --no-cache-dir --target /tmp/fa \
      .whl/flash_attn-*.tar.gz > /tmp/fa-build.log 2>&1; echo "exit $?" >> /tmp/fa-build.log ) &
fi

if [ "${2:-}" != "flash-only" ]; then
    python3 -m pytest -q -p no:cacheprovider -m "gpu or not slow" tests/test_attention.py tests/test_benchmarks_attention.py
    others=naive,sdpa,sdpa-flash,sdpa-efficient,sdpa-cudnn,flex,structured
    python3 -m benchmarks.attention --device cuda --preset phoenix-prod --backends $others --budget-s 200
    python3 -m benchmarks.attention --device cuda --preset long --backends $others --budget-s 150
fi

while [ -e /tmp/fa-build.log ] && ! grep -q "^exit" /tmp/fa-build.log && [ "$(date +%s)" -lt $(( deadline - 150 )) ]; do
    sleep 10
done
tail -3 /tmp/fa-build.log 2>/dev/null
if PYTHONPATH="$PYTHONPATH:/tmp/fa" python3 -c "import flash_attn; print('flash_attn', flash_attn.__version__)"; then
    export PYTHONPATH="$PYTHONPATH:/tmp/fa"
    python3 -m pytest -q -p no:cacheprovider tests/test_attention.py -m gpu
    python3 -m benchmarks.attention --device cuda --preset phoenix-prod --preset long \
        --backends naive,flash_attn --budget-s $(( deadline - $(date +%s) - 20 ))
else
    echo "flash_attn not available in time: its backend stays unverified on this GPU"
fi
find benchmarks/results -type f -newer /tmp/gpu-session-start -exec cp {} "$out"/ \;   # this run's files only
ls -la "$out"
