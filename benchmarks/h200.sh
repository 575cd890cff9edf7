#!/usr/bin/env bash
# Everything that needs the H200, run there from the repo root after `source .device/prelude.sh`:
#   benchmarks/h200.sh OUT_DIR [tests] [tune] [ops] [steps]
# tests: the gpu-marked pytest suite; tune[:ARGS]: `make tune` + `make build` on CUDA for a shape (the logs come
# back as a tarball); ops: the op benchmark with the dlight column, and a tuned column for the shapes tuned first
# (qwen3.5-4b: "tune:--preset qwen3.5-4b --max-len 32768", "tune:--preset qwen3.5-4b --batch 32 --max-len 4096");
# steps: the step benchmark.
# fla-core (a wheel in .device/, see README "GPU work") is installed for the delta-rule baseline when present;
# .device/bench.tar.xz (`make bench-prebuild` here) holds prebuilt CUDA modules: then nothing compiles there.
set -uo pipefail
out=${1:?usage: benchmarks/h200.sh OUT_DIR [tests] [tune] [ops] [steps]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null || exit 1  # maps schedules/ into the package
if compgen -G ".device/fla_core-*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target .device/extra .device/fla_core-*.whl &&
        export PYTHONPATH="$PWD/.device/extra:$PYTHONPATH"
fi
library=()
if [ -f .device/bench.tar.xz ]; then
    mkdir -p build && tar xJf .device/bench.tar.xz -C build && library=(--library build/bench)
fi
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(tests ops steps)
status=0
for part in "${parts[@]}"; do
    case $part in
    tests) python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$out/gpu_tests.log" || status=1 ;;
    ops)
        tuned=()
        [ -d build/tuned ] && tuned=(--tuned build/tuned)
        python3 -m benchmarks.run ${library[@]+"${library[@]}"} ${tuned[@]+"${tuned[@]}"} --dlight \
            --out "$out/h200_ops.json" 2>&1 | tee "$out/bench_ops.log" || status=1
        ;;
    steps) python3 -m benchmarks.steps ${library[@]+"${library[@]}"} --out "$out/h200_steps.json" 2>&1 | tee "$out/bench_steps.log" || status=1 ;;
    tune*)  # "tune" = the default preset; "tune:ARGS" = other shapes, e.g. "tune:--preset qwen3.5-4b --max-len 32768"
        shape=${part#tune}
        # shellcheck disable=SC2086
        python3 -m gdn_tvm.tune --target cuda ${shape#:} 2>&1 | tee -a "$out/tune.log" || status=1
        # shellcheck disable=SC2086
        python3 -m gdn_tvm.build --target cuda ${shape#:} --out build/tuned 2>&1 | tail -1 | tee -a "$out/tune.log"
        tar czf "$out/tuning_logs_cuda.tgz" tuning_logs/cuda
        ;;
    *) echo "unknown part $part" >&2; status=2 ;;
    esac
done
exit $status
