#!/usr/bin/env bash
# Everything that needs the H200, run there from the repo root after `source .device/prelude.sh`:
#   benchmarks/h200.sh OUT_DIR [setup] [tests] [tune] [ops] [steps] [sweep:...] [swap:...] [ncu:...]
# tests[:ARGS]: the gpu-marked pytest suite (or pytest ARGS instead of the tests folder, e.g. one file per GPU);
# tune[:ARGS]: `make tune` on CUDA for a shape, stopped H200_SECONDS after the start if set (the logs come back as
# a tarball, also after a stop; a later run resumes them); ops[:ARGS]: the op benchmark (ARGS: more of its
# arguments, e.g. --batches 32 256) with dlight and tuned columns where prebuilt; steps: the step benchmark;
# sweep:ARGS: a knob sweep (benchmarks/sweep.py ARGS) into OUT_DIR/sweeps.jsonl;
# swap:ARGS: one launch of the step's plan on the step's buffers and with each swapped for the op benchmark's
# (benchmarks/swap.py ARGS) into OUT_DIR/swap.jsonl;
# ncu:OP BATCH [POSITION [ARGS]]: an Nsight Compute report of one op's hand kernel (benchmarks/profile.py) into OUT_DIR.
# Several GPUs: one h200.sh per GPU (CUDA_VISIBLE_DEVICES), each with its own OUT_DIR.
# Wheels in .device/ are installed there (README "GPU work"): fla-core for the delta-rule baseline (or its contents
# as .device/fla-core.tar.xz), pytest-xdist and execnet to run the GPU tests in H200_TEST_JOBS (default 6) workers;
# .device/bench.tar.xz (`make bench-prebuild` here) holds prebuilt CUDA modules: then nothing compiles there.
set -uo pipefail
out=${1:?usage: benchmarks/h200.sh OUT_DIR [setup] [tests] [tune] [ops] [steps]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -z "${H200_READY:-}" ]; then  # once per machine; parallel runs of this script set H200_READY=1 after it
    python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null || exit 1  # maps schedules/ in
    [ -f .device/bench.tar.xz ] && mkdir -p build && tar xJf .device/bench.tar.xz -C build
fi
if [ ! -d .device/extra ]; then  # once per copy of .device/ (a new call's copy replaces the unpacked extras)
    if compgen -G ".device/*.whl" >/dev/null; then  # fla-core; pytest-xdist + execnet (parallel GPU tests)
        python3 -m pip install -q --no-index --no-deps --target .device/extra .device/*.whl
    fi
    if [ -f .device/fla-core.tar.xz ]; then  # fla-core's wheel contents repacked (xz: half the wheel's size)
        mkdir -p .device/extra && tar xJf .device/fla-core.tar.xz -C .device/extra
    fi
fi
# Prebuilt modules (`make bench-prebuild`) under $H200_BUILD/bench (default build/bench): hand, tuned where logs exist,
bench=${H200_BUILD:-build}/bench  # dlight
library=() tuned=()
[ -d "$bench/hand" ] && library=(--library "$bench/hand")
[ -d "$bench/tuned" ] && tuned=(--tuned "$bench/tuned")
[ -d .device/extra ] && export PYTHONPATH="$PWD/.device/extra:$PYTHONPATH"
deadline=${H200_SECONDS:-100000}  # tune parts stop (and resume next time) this many seconds after the start
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(tests ops steps)
status=0
for part in "${parts[@]}"; do
    case $part in
    setup) ;;  # the installs above alone
    tests*)  # "tests" = every gpu-marked test; "tests:ARGS" = pytest ARGS instead of the tests folder
        args=${part#tests}
        jobs=()  # compiles dominate the op tests: H200_TEST_JOBS workers share the GPU where xdist is installed
        python3 -c "import xdist" 2>/dev/null && jobs=(-n "${H200_TEST_JOBS:-6}")
        # shellcheck disable=SC2086
        python3 -m pytest -q -m gpu -p no:cacheprovider ${jobs[@]+"${jobs[@]}"} ${args#:} $([ -n "${args#:}" ] || echo tests) 2>&1 |
            tee -a "$out/gpu_tests.log" || status=1
        ;;
    ops*)  # "ops" = every batch; "ops:ARGS" = more benchmarks.run arguments, e.g. "ops:--batches 32 256"
        args=${part#ops}
        dlight=(--dlight)
        [ -d "$bench/dlight" ] && dlight=(--dlight-library "$bench/dlight")
        [ "${H200_DLIGHT:-1}" = 0 ] && dlight=()  # H200_DLIGHT=0: no dlight column
        # shellcheck disable=SC2086
        python3 -m benchmarks.run ${library[@]+"${library[@]}"} ${tuned[@]+"${tuned[@]}"} ${dlight[@]+"${dlight[@]}"} ${args#:} \
            --out "$out/h200_ops.json" 2>&1 | tee -a "$out/bench_ops.log" || status=1
        ;;
    steps) python3 -m benchmarks.steps ${library[@]+"${library[@]}"} ${tuned[@]+"${tuned[@]}"} --out "$out/h200_steps.json" 2>&1 | tee "$out/bench_steps.log" || status=1 ;;
    tune*)  # "tune" = the default preset; "tune:ARGS" = other shapes, e.g. "tune:--preset qwen3.5-4b --max-len 32768"
        shape=${part#tune}
        left=$((deadline - SECONDS))
        [ "$left" -gt 0 ] || { echo "tune${shape}: not started, H200_SECONDS passed" | tee -a "$out/tune.log"; status=1; continue; }
        # shellcheck disable=SC2086
        timeout "$left" python3 -m gdn_tvm.tuning --target cuda ${shape#:} 2>&1 | tee -a "$out/tune.log" ||
            status=1
        tar czf "$out/tuning_logs_cuda.tgz" tuning_logs/cuda  # also after a timeout: the next run resumes
        ;;
    sweep:*)  # "sweep:ARGS": benchmarks.sweep ARGS (--op OP --batches ... [--max-len --split-len --position])
        # shellcheck disable=SC2086
        python3 -m benchmarks.sweep ${part#sweep:} --out "$out/sweeps.jsonl" >>"$out/sweep.log" 2>&1 || status=1
        ;;
    swap:*)  # "swap:--op OP [--preset P --batch B]": the op timed on the step's buffers and on the benchmark's
        # shellcheck disable=SC2086
        python3 -m benchmarks.swap ${part#swap:} ${library[@]+"${library[@]}"} ${tuned[@]+"${tuned[@]}"} \
            --out "$out/swap.jsonl" >>"$out/swap.log" 2>&1 || status=1
        ;;
    ncu:*)  # "ncu:OP BATCH [POSITION [ARGS]]": Nsight Compute on OP's kernels at that batch (the op benchmark's
        # shapes; ARGS more benchmarks.profile arguments, e.g. --preset qwen3.5-0.8b --max-len 4096)
        read -r op batch position more <<<"${part#ncu:}"
        # shellcheck disable=SC2086
        ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
            --section LaunchStats --section WarpStateStats --section SchedulerStats --section SourceCounters \
            python3 -m benchmarks.profile --op "$op" --batch "${batch:-1}" ${position:+--position "$position"} \
            ${library[@]+"${library[@]}"} ${more:-} >"$out/ncu_${op}_b${batch:-1}.txt" 2>&1 || status=1
        ;;
    *) echo "unknown part $part" >&2; status=2 ;;
    esac
done
exit $status
