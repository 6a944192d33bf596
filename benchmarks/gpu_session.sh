#!/usr/bin/env bash
# The GPU session: FlashAttention-4 and every other backend tested and timed on one device machine.
# NOT YET RUN ON A GPU: no session so far has had one; everything below is checked on CPU only (the wheel
# set by tests/test_gpu_wheels.py, the GPU tests' failure checks by tests/test_attention.py).
#
#   0. Here, on a machine with the package registry, from the repo root (about 210 MB in .whl/, git-ignored):
#        bash benchmarks/gpu_session.sh fetch
#      downloads benchmarks/gpu-wheels.txt (FlashAttention-4 and what pip's resolver adds for CPython 3.12:
#      the CuTe DSL compiler and its libs, einops, cuda-bindings, protobuf ...) as one tar cut into .whl/part1
#      ... .whl/partN, each small enough to carry (a call carries at most 64 MiB with the working tree).
#   1. For each part but the last, straight after one another (a machine stays warm only ~30 s):
#        run(command="bash benchmarks/gpu_session.sh park", carry=[".whl/partI"], timeout_s=120)
#      parks the part in /tmp on the machine.
#   2. run(command="bash benchmarks/gpu_session.sh all", carry=[".whl/partN"], timeout_s=600)
#      checks the device's Python is 3.12 (the wheels are cp312), joins the parts, installs them into a venv
#      with --system-site-packages (the image's torch; .pth files such as the CuTe DSL's are processed),
#      runs every GPU test with ATTN_REQUIRE_BACKENDS=fa4 (fa4 not loading, or loading and not running,
#      fails), then the benchmark. Every result lands in $OUT as it is produced: the session log, the test
#      log and JUnit file (with the measured softcap tanh error), and the results JSON after each record.
#      The whole call is budgeted from its start: CALL_BUDGET_S (default 540 of the 600 s limit) less a margin
#      for a FlexAttention / CuTe compile, which cannot be interrupted. "tests" and "bench" run one half.
#   3. Back here: copy $OUT's results JSON into benchmarks/results/, then
#        python -m benchmarks.attention --replot benchmarks/results/<file>.json && python scripts/readme_tables.py
#      and commit it (device, date and commit are in the file) with the regenerated README.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:$PWD"
step=${1:-}
start=$(date +%s)
budget=${CALL_BUDGET_S:-540}     # of the device tool's 600 s per call: the rest is the margin
park=${GPU_SESSION_DIR:-/tmp/gpu-session}   # survives between calls on a warm machine
venv=$park/venv
out=${OUT:-$park/out}
PART_BYTES=56000000              # + the working tree (~5 MB) stays under the 64 MiB a call carries

left() { echo $(( start + budget - $(date +%s) )); }

fetch() {
    git check-ignore -q .whl/x || { echo ".whl/ must be git-ignored (it is in .gitignore)"; return 1; }
    rm -rf .whl && mkdir -p .whl/all
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl/all -r benchmarks/gpu-wheels.txt \
        || return 1
    tar -C .whl/all -cf .whl/wheels.tar . && rm -rf .whl/all
    split -b "$PART_BYTES" -d -a 2 .whl/wheels.tar .whl/wheels.tar.
    local chunks=(.whl/wheels.tar.??) i=1
    local sum; sum=$(sha256sum .whl/wheels.tar | cut -d' ' -f1)
    for c in "${chunks[@]}"; do
        mkdir -p ".whl/part$i" && mv "$c" ".whl/part$i/" && echo "${#chunks[@]} $sum" > ".whl/part$i/manifest"
        i=$(( i + 1 ))
    done
    rm .whl/wheels.tar
    local tree; tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
    [ $(( PART_BYTES + tree )) -lt $(( 64 * 1048576 )) ] || { echo "a part + the working tree exceeds 64 MiB"; return 1; }
    echo "${#chunks[@]} parts: park .whl/part1 .. part$(( ${#chunks[@]} - 1 )), then run 'all' with .whl/part${#chunks[@]}"
}

park_parts() {   # copy whatever part this call carried to /tmp
    mkdir -p "$park"
    for d in .whl/part*; do [ -d "$d" ] && cp "$d"/* "$park/"; done
    ls "$park"/wheels.tar.?? 2>/dev/null | wc -l | xargs echo "parts parked on this machine:"
}

header() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda, '| capability', torch.cuda.get_device_capability())"
}

install_fa4() {   # -> 0 and $PY set to the venv's python when FlashAttention-4 is installed
    PY=python3
    local pyver; pyver=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$pyver" != "3.12" ]; then
        echo "NOT INSTALLED: the device's Python is $pyver and the carried wheels are cp312"; return 1
    fi
    case "$(cat "$park/installed" 2>/dev/null)" in      # an earlier call on this machine installed them
    venv) PY=$venv/bin/python; return 0 ;;
    site) export PYTHONPATH="$park/boot:$PYTHONPATH"; return 0 ;;
    esac
    [ -f "$park/manifest" ] || { echo "NOT INSTALLED: no wheels parked here (run 'park' for each part first)"; return 1; }
    read -r n sum < "$park/manifest"
    local have; have=$(ls "$park"/wheels.tar.?? 2>/dev/null | wc -l)
    [ "$have" -eq "$n" ] || { echo "NOT INSTALLED: $have of $n parts on this machine (a fresh one: park them again)"; return 1; }
    cat "$park"/wheels.tar.?? > "$park/wheels.tar"
    [ "$(sha256sum "$park/wheels.tar" | cut -d' ' -f1)" = "$sum" ] || { echo "NOT INSTALLED: the joined wheels differ from the fetched ones"; return 1; }
    mkdir -p "$park/wheels" && tar -C "$park/wheels" -xf "$park/wheels.tar"
    # The wheels' .pth files (the CuTe DSL's puts `cutlass` on the path) run only from a site dir, never from
    # PYTHONPATH: a venv over the image's packages, or else site.addsitedir from a sitecustomize.
    if python3 -m venv --system-site-packages --without-pip "$venv" && "$venv/bin/python" -c "import torch"; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$venv/lib/python3.12/site-packages" \
            "$park"/wheels/*.whl || { echo "NOT INSTALLED: pip could not install the wheels"; return 1; }
        PY=$venv/bin/python
        echo venv > "$park/installed.new"
    else
        echo "no venv over the image's torch here: site.addsitedir from $park/boot/sitecustomize.py instead"
        rm -rf "$venv"
        python3 -c "import sitecustomize" 2>/dev/null && echo "warning: the image's own sitecustomize is shadowed"
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$park/site" "$park"/wheels/*.whl \
            || { echo "NOT INSTALLED: pip could not install the wheels"; return 1; }
        mkdir -p "$park/boot" && echo "import site; site.addsitedir('$park/site')" > "$park/boot/sitecustomize.py"
        export PYTHONPATH="$park/boot:$PYTHONPATH"
        echo site > "$park/installed.new"
    fi
    "$PY" -c "import cutlass, flash_attn.cute" || { echo "NOT LOADED: the wheels are installed but do not import"; return 1; }
    mv "$park/installed.new" "$park/installed"
}

gpu_tests() {   # $1: seconds
    echo "== GPU tests ($1 s at most)"
    timeout "$1" "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_attention.py tests/test_device.py -rs \
        --junitxml "$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.log"
}

bench() {   # benchmark presets until the call's budget is spent, results to $out/results as produced
    local margin=90               # one uninterruptible compile, and the time to write what was measured
    for p in phoenix-2026 phoenix-prod phoenix-prod-b256 long; do
        local l; l=$(left)
        [ "$l" -gt $(( margin + 30 )) ] || { echo "no time left for $p ($l s)"; break; }
        echo "== benchmark $p ($(( l - margin )) s)"
        timeout $(( l - 15 )) "$PY" -m benchmarks.attention --device cuda --preset "$p" --no-plot \
            --out-dir "$out/results" --budget-s $(( l - margin )) --note "gpu_session.sh, $(date -u +%FT%TZ)"
    done
}

case "$step" in
fetch) fetch ;;
park) park_parts ;;
all|tests|bench)
    mkdir -p "$out/results" "$park"
    exec > >(tee -a "$out/session.log") 2>&1
    header
    park_parts
    install_fa4 || echo "the GPU tests will fail on fa4 with the reason it does not load"
    export ATTN_REQUIRE_BACKENDS=fa4      # fa4 not loading, or loading and never run, fails the tests
    "$PY" -c "from models.attention import fa4_missing; print('fa4:', fa4_missing() or 'available')"
    case "$step" in
    all) gpu_tests $(( $(left) / 2 )); bench ;;
    tests) gpu_tests $(( $(left) - 15 )) ;;
    bench) bench ;;
    esac
    echo "== done in $(( $(date +%s) - start )) s; in \$OUT: $(cd "$out" && find . -type f | tr '\n' ' ')" ;;
*)
    sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2 ;;
esac
