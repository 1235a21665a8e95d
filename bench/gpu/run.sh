#!/usr/bin/env bash
# The GPU recipe (issues #9, #6 and #41): on a CUDA host, builds the CUDA addon, runs the GPU tests,
# the GPU benchmark and the tiered cache's benchmark with L1 in GPU memory. Run from anywhere inside the checkout:
#
#   bench/gpu/run.sh [--quick] [--only build|tests|bench|cache|ncu]...
#
# --quick: no llama-8b in the benchmark, cache up to 512 tokens. --only (repeatable) runs those
# steps alone (the build always runs, incrementally), so a run can be split across calls of a
# limited length. The ncu step runs only when named: Nsight Compute's DRAM throughput, warps
# active, registers and stall reasons for each kernel of one decode layer of llama-1b
# (NCU_MODEL), from bench/gpu/ncu-decode.js, into $OUT/logs/ncu-<model>.txt (build/logs/
# without OUT). With OUT set (the device tool's output folder), the bench/results files this run
# wrote and a log of each step are copied there on exit, even after a failure or a timeout's TERM;
# calls append to one log, so `timeout 300 run.sh --only tests; timeout 120 run.sh --only cache`
# bounds each step.
#
# Needs: Node >= 20, the CUDA toolkit (nvcc, cuBLAS), CMake >= 3.18, node_modules (`npm ci`, or
# unpacked from bench/gpu/pack-for-device.sh on a host without network), and python3 with torch +
# transformers for the comparison columns (the benchmark notes their absence otherwise).
# It calls CMake directly rather than through cmake-js, which would download Node's headers:
# they are taken from NODE_INCLUDE, or found beside node, or in /usr/include/node.
# CUDA_ARCH builds one GPU architecture only (e.g. 90 for H100; default 80;86;89;90);
# DKI_CMAKE_ARGS adds CMake arguments (e.g. -DCUDA_cublas_LIBRARY=... for a cuBLAS outside the toolkit).
set -euo pipefail
cd "$(dirname "$0")/../.."

quick=()
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=(--quick) ;;
    --only) only="$only ${2:?--only needs a step}"; shift ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
step() { [[ " $only " == *" $1 "* ]] || { [ -z "$only" ] && [ "$1" != ncu ]; }; }

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT/logs" "$OUT/results"
  # Only the results this run wrote: the device tool brings back a few files per call, not all of bench/results.
  started="$(mktemp)"
  trap 'find bench/results -type f -newer "$started" -exec cp {} "$OUT/results/" \; 2>/dev/null || true' EXIT
  trap 'exit 143' TERM
  exec > >(tee -a "$OUT/logs/run.log") 2>&1
  echo "[run.sh] $(date -u +%FT%TZ) run.sh ${quick[*]-}${only:+ --only$only}"
fi

node_prefix="$(dirname "$(dirname "$(readlink -f "$(command -v node)")")")"
inc="${NODE_INCLUDE:-}"
for d in "$node_prefix/include/node" /usr/include/node; do
  if [ -z "$inc" ] && [ -f "$d/node_api.h" ]; then inc="$d"; fi
done
if [ -z "$inc" ]; then echo "Node's headers (node_api.h) not found: set NODE_INCLUDE" >&2; exit 1; fi
[ -d node_modules ] || npm ci --ignore-scripts

cmake -S . -B build -DDKI_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_JS_INC="$inc" \
  -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$PWD/build/Release" ${CUDA_ARCH:+-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH} ${DKI_CMAKE_ARGS:-}
cmake --build build -j "$(nproc)"
if [ -d node_modules/typescript ]; then npx tsc -p tsconfig.json; fi  # else dist/ came along

node -e "import('./dist/src/engine/native.js').then(({ native }) => { const c = native().cuda(); console.log(c); if (!c.devices) process.exit(1); })"
# A failing test does not stop the benchmarks (a GPU lease is short: get every number it can
# give); the script still exits with the tests' status.
# Each step's time goes to the log, to plan the next lease (device time is counted).
timed() { local t0=$SECONDS rc=0; "$@" || rc=$?; echo "[run.sh] $* took $((SECONDS - t0)) s (rc $rc)"; return $rc; }
echo "[run.sh] build took $SECONDS s"
tests=0
if step tests; then timed node_modules/.bin/vitest run test/cuda.test.ts test/device.test.ts test/hf-transformers.test.ts || tests=$?; fi
if step bench; then
  timed node bench/gpu.js ${quick[@]+"${quick[@]}"}
  timed node bench/gpu-dki-turn.js ${quick[@]+"${quick[@]}"}
fi
if step cache; then timed node bench/cache.js --device cuda ${quick[@]+"${quick[@]}"}; fi
if step ncu; then
  model="${NCU_MODEL:-llama-1b}"
  ncu_bin="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
  metrics=dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,l1tex__t_sector_hit_rate.pct
  read -ra select < <(node bench/gpu/ncu-decode.js --model "$model" --ncu-args)
  log="${OUT:-build}/logs/ncu-$model.txt"  # build/ is git-ignored
  mkdir -p "$(dirname "$log")"
  ncu_run() { "$ncu_bin" "${select[@]}" --metrics "$metrics" --section WarpStateStats node bench/gpu/ncu-decode.js --model "$model" > "$log" 2>&1; }
  timed ncu_run
fi
exit "$tests"
