#!/usr/bin/env bash
# The GPU session: FlashAttention-4 and every other backend tested and timed on one device machine, with the whole
# trunk forward per backend and every explorer view. First run: NVIDIA H100 80GB HBM3, 2026-11-26, commit 801f962
# (benchmarks/results/gpu-run-2026-11-26/README.md says what ran). What can be is checked on CPU by
# tests/test_gpu_wheels.py (the wheel set, the install into a venv python like the device's, the preflight, the
# streamed results, the plan of `all` with DRY_RUN=1 and its commands' arguments).
#
#   0. Here, on a machine with the package registry, from the repo root (about 110 MB in .whl/, git-ignored):
#        bash benchmarks/gpu_session.sh fetch
#      downloads benchmarks/gpu-wheels.txt (FlashAttention-4 and plotly, and what pip adds that the device image
#      lacks: the CuTe DSL and its cu13 libs, tvm-ffi, quack) as one tar cut into .whl/part1 ... .whl/partN, each
#      small enough to carry (a call carries at most 64 MiB with the working tree).
#   1. For each part but the last, straight after one another (a machine stays warm only ~30 s):
#        run(command="bash benchmarks/gpu_session.sh park", carry=[".whl/partI"], timeout_s=120)
#      parks the part in /tmp on the machine.
#   2. run(command="EXPLORER_COMMIT=<git rev-parse --short HEAD here> bash benchmarks/gpu_session.sh all",
#          carry=[".whl/partN"], timeout_s=600) — the machine's copy of the tree sits over a git folder of another
#      commit, so the results name the commit they ran as told (models/runinfo.git_commit) — which in order:
#      a. prints the GPU (nvidia-smi), writes $OUT/session.json (the commit as told, the GPU, the step, the time:
#         the Flash tab pairs the tests with the results file of the same commit and GPU), parks the part it carried;
#      b. joins the parts, checks them against the fetched tar, checks python3 matches the wheels' cp tags, and
#         installs them with pip --target into $park/site, put ahead of python3's own site-packages by one .pth
#         file there: the carried wheels win, their .pth files run (the CuTe DSL's puts `cutlass` on the path),
#         and nothing of the image is shadowed (no PYTHONPATH, no sitecustomize). python3 on the device is
#         itself a venv, so a venv made from it would see the base interpreter's packages, not its torch;
#      c. points FA4's CuTe compile cache (off by default), CuTe DSL's, inductor's, Triton's and tvm-ffi's caches
#         at $park/cache, so a later call on the warm machine loads kernels instead of compiling them;
#      d. preflight (benchmarks/gpu_preflight.py, to $OUT/preflight.json): versions (torch 2.11 there, 2.13
#         here), every torch and FA4 API the GPU path calls, the image's packages against the carried wheels'
#         requirements, torch's own DLPack exchange API (why torch-c-dlpack-ext is not carried);
#      e. every GPU test with ATTN_REQUIRE_BACKENDS=fa4 (fa4 not loading, or loading and not running, fails),
#         every view at every GPU preset included, TESTS_SHARE % of the budget left at most; each outcome (and
#         the measured softcap tanh error) is streamed to $OUT/gpu-tests.jsonl as it finishes, the log and
#         JUnit file beside it;
#      f. the attention at phoenix-prod, the Flash tab's headline, every point checked against the fp32 reference
#         computed in pieces (naive fitting or not; a wrong kernel fails the run): first, because on 2026-11-27
#         (gpu-run-2026-11-27-2) the tests took 218 of their 225 s and the views and trunk before it left it no
#         time, so the kernels needed a second call;
#      g. the whole trunk forward per backend at phoenix-prod (grok, tanh cap and none) and phoenix-2026 (xrex),
#         with attention's share and the error against the fp32 trunk, then every explorer view timed at five
#         presets (first call and warm, figure JSON included): TRUNK_S and VIEWS_S seconds at most, less where the
#         call has less left; then every view at phoenix-prod and phoenix-2026 split into the model's build, its
#         forward and each view's first and warm calls (benchmarks/view_cost.py --production, repeats while
#         VIEW_COST_S lasts) to $OUT/results/view-cost-production-<device>-<date>.json, rewritten after each repeat;
#      h. the other attention presets until the budget is spent (phoenix-2026, phoenix-prod-b256, long).
#         f to h write each record to $OUT/results/<device>-<date>.json as measured.
#      The whole call is budgeted from its start: CALL_BUDGET_S (default 540 of the 600 s limit) less a margin
#      for a FlexAttention / CuTe compile, which cannot be interrupted. "tests" runs e alone and "bench" f to h
#      (after a to d); "install" runs b alone. DRY_RUN=1 prints each step's command and budget instead.
#   3. Back here: copy $OUT's results JSON into benchmarks/results/, then
#        python -m benchmarks.attention --replot benchmarks/results/<file>.json && python scripts/readme_tables.py
#      and commit it (device, date and commit are in the file) with the regenerated README.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
step=${1:-}
start=$(date +%s)
budget=${CALL_BUDGET_S:-540}     # of the device tool's 600 s per call: the rest is the margin
park=${GPU_SESSION_DIR:-/tmp/gpu-session}   # survives between calls on a warm machine
whl=${WHL_DIR:-.whl}
out=${OUT:-$park/out}
PART_BYTES=56000000              # + the working tree (~5 MB) stays under the 64 MiB a call carries

TESTS_SHARE=${TESTS_SHARE:-50}     # % of what is left when the tests start: about 260 s. All 47 GPU tests took 167 s on
                                   # the fourth session's H100, 218 of 225 s (45 %) on the fifth's, 115 s on the second's;
                                   # the third's, with 35 % = 173 s, stopped 3 short on a slower CPU side
VIEWS_S=${VIEWS_S:-60}            # every view at VIEW_PRESETS
VIEW_COST_S=${VIEW_COST_S:-120}   # repeats of benchmarks/view_cost.py --production (one fresh process per preset each)
KERNELS_S=${KERNELS_S:-150}       # the kernels at phoenix-prod (the sixth session's, uncapped, took the trunk's time)
TRUNK_S=${TRUNK_S:-100}           # the trunk forward per backend at TRUNK_PRESETS
VIEW_PRESETS=lecture,phoenix-nano,phoenix-2026-nano,phoenix-prod,phoenix-2026
read -ra TRUNK_PRESETS <<< "${TRUNK_PRESETS:-phoenix-prod phoenix-2026}"   # phoenix-prod's alone took the
                                  # step's 100 s in the seventh session: a later call can time the other alone
BENCH_PRESETS=(phoenix-prod phoenix-2026 phoenix-prod-b256 long)

left() { echo $(( start + budget - $(date +%s) )); }

step() {   # $1: seconds at most, then the command: run it under timeout, or print it (DRY_RUN=1)
    local s=$1; shift
    if [ -n "${DRY_RUN:-}" ]; then echo "DRY RUN ($s s): $(printf '%q ' "$@")"; return 0; fi
    timeout "$s" "$@"
}

fetch() {
    git check-ignore -q "$whl/x" || { echo "$whl/ must be git-ignored (it is in .gitignore)"; return 1; }
    rm -rf "$whl" && mkdir -p "$whl/all"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$whl/all" -r benchmarks/gpu-wheels.txt \
        || return 1
    pack || return 1
    local tree; tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
    [ $(( PART_BYTES + tree )) -lt $(( 64 * 1048576 )) ] || { echo "a part + the working tree exceeds 64 MiB"; return 1; }
}

pack() {   # $whl/all/*.whl -> $whl/part1 .. partN: one tar in pieces, each with the count and the tar's sha256
    tar -C "$whl/all" -cf "$whl/wheels.tar" . && rm -rf "$whl/all"
    split -b "$PART_BYTES" -d -a 2 "$whl/wheels.tar" "$whl/wheels.tar."
    local chunks=("$whl"/wheels.tar.??) i=1
    local sum; sum=$(sha256sum "$whl/wheels.tar" | cut -d' ' -f1)
    for c in "${chunks[@]}"; do
        mkdir -p "$whl/part$i" && mv "$c" "$whl/part$i/" && echo "${#chunks[@]} $sum" > "$whl/part$i/manifest"
        i=$(( i + 1 ))
    done
    rm "$whl/wheels.tar"
    echo "${#chunks[@]} parts: park each of $whl/part1 .. part$(( ${#chunks[@]} - 1 )) (a call each), then run 'all' with $whl/part${#chunks[@]}"
}

park_parts() {   # copy whatever part this call carried to $park
    mkdir -p "$park"
    for d in "$whl"/part*; do [ -d "$d" ] && cp "$d"/* "$park/"; done
    ls "$park"/wheels.tar.?? 2>/dev/null | wc -l | xargs echo "parts parked on this machine:"
}

header() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
}

install_wheels() {   # -> 0 when the parked wheels are importable by python3, ahead of its own packages
    [ -f "$park/installed" ] && { echo "wheels: installed by an earlier call on this machine"; return 0; }
    [ -f "$park/manifest" ] || { echo "NOT INSTALLED: no wheels parked here (run 'park' for each part first)"; return 1; }
    read -r n sum < "$park/manifest"
    local have; have=$(ls "$park"/wheels.tar.?? 2>/dev/null | wc -l)
    [ "$have" -eq "$n" ] || { echo "NOT INSTALLED: $have of $n parts on this machine (a fresh one: park them again)"; return 1; }
    cat "$park"/wheels.tar.?? > "$park/wheels.tar"
    [ "$(sha256sum "$park/wheels.tar" | cut -d' ' -f1)" = "$sum" ] || { echo "NOT INSTALLED: the joined wheels differ from the fetched ones"; return 1; }
    rm -rf "$park/wheels" && mkdir -p "$park/wheels" && tar -C "$park/wheels" -xf "$park/wheels.tar"
    local tag need
    tag=$(python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
    need=$(ls "$park"/wheels/*.whl | sed -n 's/.*-\(cp3[0-9]*\)-\1-.*/\1/p' | sort -u | tr '\n' ' ')
    for t in $need; do
        [ "$t" = "$tag" ] || { echo "NOT INSTALLED: the carried wheels are built for $need, python3 is $tag"; return 1; }
    done
    rm -rf "$park/site"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$park/site" "$park"/wheels/*.whl \
        || { echo "NOT INSTALLED: pip could not install the wheels"; return 1; }
    # One .pth in python3's own site dir (processed first there: "00-"): adds $park/site as a site dir (so its
    # .pth files run) and moves it just before that site dir, so a carried wheel wins over the image's copy.
    python3 - "$park/site" <<'EOF' || { echo "NOT INSTALLED: could not write the .pth"; return 1; }
import site, sys
from pathlib import Path
carried, own = sys.argv[1], site.getsitepackages()[0]
line = (f"import site, sys; site.addsitedir({carried!r}); sys.path.remove({carried!r}); "
        f"sys.path.insert(sys.path.index({own!r}) if {own!r} in sys.path else 0, {carried!r})\n")
(Path(own) / "00-gpu-session-wheels.pth").write_text(line)
print("wheels:", carried, "ahead of", own)
EOF
    touch "$park/installed"
}

session_json() {   # what this call ran at, beside what it leaves (explorer.gpu_results pairs the tests with a
                   # results file of the same commit and GPU): the commit as told, the GPU, the step, when
    python3 - "$step" "$(header | cut -d, -f1)" > "$out/session.json" <<'EOF'
import datetime, json, sys
from models.runinfo import git_commit
print(json.dumps(dict(commit=git_commit(), device=sys.argv[2].strip(), step=sys.argv[1],
                      started=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))))
EOF
}

caches() {   # compiled kernels kept under $park: a second call on a warm machine loads them
    export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$park/cache/fa4" \
        CUTE_DSL_CACHE_DIR="$park/cache/cute-dsl" TORCHINDUCTOR_CACHE_DIR="$park/cache/inductor" \
        TRITON_CACHE_DIR="$park/cache/triton" TVM_FFI_CACHE_DIR="$park/cache/tvm-ffi"
    mkdir -p "$park/cache"
}

gpu_tests() {   # $1: seconds
    echo "== GPU tests ($1 s at most)"
    step "$1" python3 -m pytest -q -p no:cacheprovider -p benchmarks.pytest_stream \
        --stream-jsonl "$out/gpu-tests.jsonl" -m gpu tests/test_attention.py tests/test_device.py -rs \
        --junitxml "$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.log"
}

benchmark() {   # $1: its budget in seconds, then benchmarks.attention's arguments; results to $out/results
    local b=$1; shift
    step $(( b + 45 )) python3 -m benchmarks.attention --device cuda --no-plot --out-dir "$out/results" \
        --budget-s "$b" --note "gpu_session.sh, $(date -u +%FT%TZ)" "$@"
}

capped() {   # $1: a step's own cap in seconds: what is left of the call for it (a start and a write kept), or 0
    local l=$(( $(left) - 60 )); echo $(( l < $1 ? (l > 20 ? l : 0) : $1 ))
}

model_timing() {   # the trunk forward per backend (what flash buys the model), then every view
    local b
    b=$(capped "$TRUNK_S")
    if [ "$b" -gt 0 ]; then
        echo "== trunk forward at ${TRUNK_PRESETS[*]} ($b s)"
        benchmark "$b" --parts trunk "${TRUNK_PRESETS[@]/#/--preset=}"
    else echo "no time left for the trunk forward"; fi
    b=$(capped "$VIEWS_S")
    if [ "$b" -gt 0 ]; then
        echo "== views at $VIEW_PRESETS ($b s)"
        benchmark "$b" --parts= --views "$VIEW_PRESETS"
    else echo "no time left for the views"; fi
    local l=$(( $(left) - 120 ))          # the attention presets keep a start
    b=$(( l < VIEW_COST_S ? l : VIEW_COST_S ))
    [ "$b" -gt 30 ] || { echo "no time left for the view cost ($l s)"; return 0; }
    echo "== view cost at the production presets ($b s)"    # the step's limit: a repeat past the budget
    step $(( b * 3 / 2 )) python3 -m benchmarks.view_cost --production --device cuda --repeats 5 --budget-s "$b" \
        --out-dir "$out/results"
}

bench() {   # $1: the most seconds one preset gets; then attention presets, until the call's budget is spent
    local cap=$1 margin=90        # margin: one uninterruptible compile, and the time to write what was measured
    shift
    for p in "$@"; do
        local l b; l=$(left); b=$(( l - margin < cap ? l - margin : cap ))
        [ "$b" -gt 30 ] || { echo "no time left for $p ($l s)"; break; }
        echo "== benchmark $p ($b s)"
        benchmark "$b" --parts attention --preset "$p"
    done
}

timings() {   # the Flash tab's evidence first (the kernels at phoenix-prod, then the trunk), the rest as time allows
    bench "$KERNELS_S" "${BENCH_PRESETS[0]}"
    model_timing
    bench "$budget" "${BENCH_PRESETS[@]:1}"     # the rest: capped by what the call has left only
}

case "$step" in
fetch) fetch ;;
pack) pack ;;
park) park_parts ;;
install) park_parts && install_wheels ;;
all|tests|bench)
    mkdir -p "$out/results" "$park"
    exec > >(tee -a "$out/session.log") 2>&1
    header
    session_json
    park_parts
    install_wheels || echo "the GPU tests will fail on fa4 with the reason it does not load"
    caches
    python3 -m benchmarks.gpu_preflight --json "$out/preflight.json" || echo "the preflight found the above missing"
    export ATTN_REQUIRE_BACKENDS=fa4      # fa4 not loading, or loading and never run, fails the tests
    python3 -c "from models.attention import fa4_missing; print('fa4:', fa4_missing() or 'available')"
    case "$step" in
    all) gpu_tests $(( $(left) * TESTS_SHARE / 100 )); timings ;;
    tests) gpu_tests $(( $(left) - 15 )) ;;
    bench) timings ;;
    esac
    echo "== done in $(( $(date +%s) - start )) s; in \$OUT: $(cd "$out" && find . -type f | tr '\n' ' ')" ;;
*)
    sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2 ;;
esac
