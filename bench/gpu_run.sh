#!/usr/bin/env bash
# One command for a GPU machine (see bench/GPU.md): build both backends for sm_90, a one-rank
# NCCL smoke test (bench/nccl_smoke.ts), the kernel tests (also under compute-sanitizer), the
# measurements the next decision needs (one CIFAR step's per-op device times, the cost of one
# enqueue, the step with and without CUDA graphs, a two-epoch CIFAR-shaped run with its
# steady-state epoch, the PyTorch twins eager
# and compiled with nvidia-smi dmon beside each, the data-path peers, nvJPEG), then the whole test
# suite with what time is left, within 10 minutes (this script keeps to about 9). Run from
# the project root:
#
#   source .gpu/env.sh && bash bench/gpu_run.sh
#
# Everything lands in ./gpu-logs/ (GPU_LOGS to choose): summary.log first
# (date, GPU, driver, commit, then one line per step with its status and seconds), one log
# per step, and a copy of the benchmarks' bench/out/*.json and charts; with OUT set, also
# "$OUT/gpu-logs.tgz" and "$OUT/summary.log". Data sets are generated here, never carried.
# A step that fails does not stop the others; a step that would overrun the budget is
# skipped and says so.
set -uo pipefail

BUDGET_S=${GPU_RUN_BUDGET_S:-540}
START=$(date +%s)
LOGS="${GPU_LOGS:-$PWD/gpu-logs}"
mkdir -p "$LOGS"
SUMMARY="$LOGS/summary.log"
: >"$SUMMARY"

# One arch: half the nvcc time of the default "80,90", and the SASS the H100/H200 runs.
export PINSTREAM_CUDA_ARCHS=${PINSTREAM_CUDA_ARCHS:-90}
export NO_COLOR=1

say() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(($(date +%s) - START)); }

commit() {
  # A copied checkout may carry no .git, or a stale one: .gpu/commit (bench/GPU.md writes it
  # just before the copy) names the tree that was sent, so it comes first.
  cat .gpu/commit 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown
}

# step NAME MAX_SECONDS CMD...: runs CMD with its output in $LOGS/NAME.log, bounded by both
# MAX_SECONDS and what is left of the budget; records status and time in the summary.
step() {
  local name=$1 max=$2
  shift 2
  local left=$((BUDGET_S - $(elapsed)))
  local limit=$((max < left ? max : left))
  if [ "$limit" -lt 15 ]; then
    say "$(printf '%-22s SKIPPED (budget: %ss left)' "$name" "$left")"
    return 0
  fi
  local t0=$(date +%s) rc
  echo ">>> $name (limit ${limit}s): $*" >"$LOGS/$name.log"
  timeout --kill-after=10 "$limit" "$@" >>"$LOGS/$name.log" 2>&1
  rc=$?
  local status="ok"
  [ "$rc" -ne 0 ] && status="FAILED rc=$rc"
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && status="TIMED OUT after ${limit}s"
  say "$(printf '%-22s %-26s %4ss' "$name" "$status" "$(($(date +%s) - t0))")"
  return 0
}

# ---- header -----------------------------------------------------------------------------
say "pinstream GPU run"
say "date:    $(date -u '+%Y-%m-%dT%H:%M:%SZ')"
say "commit:  $(commit)"
if [ -s .gpu/status ]; then say "dirty:   $(tr '\n' ' ' <.gpu/status)"; fi
say "gpu:     $(nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
say "driver:  $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
say "nvcc:    $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'no nvcc')"
say "deno:    $(deno --version 2>/dev/null | head -1)"
say "cpu:     $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') x $(nproc)"
say "archs:   $PINSTREAM_CUDA_ARCHS"
say ""
nvidia-smi >"$LOGS/nvidia-smi.log" 2>&1 || true
cat "$LOGS/nvidia-smi.log"

# The benchmarks prefer /usr/bin/python3 (a distribution's PyTorch); here the python3 on PATH
# is the one to use when it has PyTorch with CUDA (and numpy, which bench/pipeline_torch.py reads).
TORCH_FLAG=--no-torch
if python3 -c 'import numpy, torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
  TORCH_FLAG=""
  export PYTHON=${PYTHON:-$(command -v python3)}
fi

# ---- build, then make sure the cuda backend really opens (else every [cuda] test is skipped)
step build 150 deno task build --require cpu,cuda
step cuda-probe 30 deno eval '
  import { Device } from "./ffi/device.ts";
  using d = Device.open("cuda");
  console.log(JSON.stringify({ kind: d.kind, props: d.props, mem: d.memInfo() }, (_, v) =>
    typeof v === "bigint" ? String(v) : v));'

# ---- the nccl backend, one rank on the one GPU (no machine here has several): NCCL from
# PINSTREAM_NCCL_LIB, else the loader's path, else the copy a PyTorch CUDA wheel carries
NCCL_LIB=${PINSTREAM_NCCL_LIB:-}
if [ -z "$NCCL_LIB" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
  NCCL_LIB=$(python3 -c 'import glob, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
print(next((p for d in dirs for p in sorted(glob.glob(d + "/nvidia/nccl/lib/libnccl.so*"))), ""))' \
    2>/dev/null)
fi
step nccl-smoke 40 env ${NCCL_LIB:+PINSTREAM_NCCL_LIB="$NCCL_LIB"} deno run -A bench/nccl_smoke.ts

# ---- the kernel tests on their own first: short, and the ones that matter most here
step test-kernels 90 deno test -A tests/nn_kernels_test.ts tests/gemm_shapes_test.ts \
  tests/image_kernel_test.ts tests/device_test.ts tests/nn_bf16_test.ts
# ---- the CUDA kernel tests under compute-sanitizer memcheck (out-of-bounds, misaligned
# accesses, API errors): the kernels were written without a GPU, so this comes early
SANITIZER=$(command -v compute-sanitizer ||
  ls "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")/compute-sanitizer" \
    /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer \
    2>/dev/null | head -1)
if [ -n "$SANITIZER" ]; then
  step sanitize-memcheck 100 "$SANITIZER" --tool memcheck --leak-check no \
    deno test -A --filter '[cuda]' tests/nn_kernels_test.ts tests/gemm_shapes_test.ts \
    tests/image_kernel_test.ts
else
  say "compute-sanitizer not found: sanitizer steps skipped"
fi
# ---- measurements first (the suite below takes whatever time is left; each benchmark writes
# bench/out/<name>.json and .svg). One CIFAR step read closely: per-op device times from the
# profiler's events, host ns per enqueue (empty FFI call, FFI + launch, TS wrapper + launch,
# one graph launch), and ms per step after warm-up with and without CUDA graphs.
step bench-step 90 deno run -A bench/step.ts --device cuda
# fp16, bf16 (tensor-core bf16 on sm_80+) and fp32 steps of the same models, one table.
step bench-precision 75 deno run -A bench/precision.ts --device cuda
step bench-transfer 40 deno run -A bench/transfer.ts --device cuda --max-mib 256
step bench-kernels 40 deno run -A bench/kernels.ts --device cuda

# dmon STEP: samples the GPU every second into $LOGS/STEP-dmon.log while the next command runs.
dmon_start() {
  nvidia-smi dmon -s um -d 1 >"$LOGS/$1-dmon.log" 2>&1 &
  DMON=$!
}
dmon_stop() {
  kill "$DMON" 2>/dev/null
  wait "$DMON" 2>/dev/null
}

# ---- training on generated CIFAR-shaped data: 2 epochs of 150 steps of 128, so epoch 2's
# line (samples/s, input-wait share) is the steady state, after start-up and warm-up.
dmon_start cifar
step cifar 100 deno run -A examples/cifar.ts --synthetic --device cuda --epochs 2 \
  --limit 19200 --batch-size 128 --quiet
dmon_stop
# Its PyTorch twins (same network, batch and optimizer, AMP), where PyTorch with CUDA exists:
# eager, then torch.compile(mode="reduce-overhead") with fused SGD, the stronger peer.
if [ -z "$TORCH_FLAG" ] && [ -f bench/train_cifar_torch.py ]; then
  dmon_start cifar-torch
  step cifar-torch 60 python3 bench/train_cifar_torch.py --device cuda --steps 300
  dmon_stop
  dmon_start cifar-torch-compile
  step cifar-torch-compile 150 python3 bench/train_cifar_torch.py --device cuda --steps 300 \
    --compile
  dmon_stop
fi

# The data path, with PyTorch's GPU peers: resident (eager and compiled) and streamed through
# a reused pinned ring (bench/pipeline_torch.py).
step bench-pipeline 150 deno run -A bench/pipeline.ts --epochs 3 $TORCH_FLAG
# The seeds' claims on the GPU: PyTorch-default input path against pinstream's defaults,
# every augmentation on against off, pinned against pageable (bench/seed_claims.ts).
step bench-seed-claims 45 deno run -A bench/seed_claims.ts --device cuda --limit 16384 --epochs 2

# JPEG decoding on the GPU (bench/nvjpeg.ts): nvJPEG (PINSTREAM_NVJPEG_LIB, the toolkit's,
# or a PyTorch wheel's) against libjpeg-turbo on one host thread; says so where nvJPEG is absent.
step bench-nvjpeg 30 deno run -A bench/nvjpeg.ts --count 1024 --size 224 --batch 128

# ---- the whole suite (cpu and cuda cases) on the GPU: 3-5 minutes on a 16-core host, so it
# gets what is left. The emulator passes of `deno task test` are left to CI (the same on
# every machine); run `deno task test` alone for them.
PINSTREAM_TEST_GPU_ONLY=1 step test-all 330 deno task test

# ---- shared-memory races in the GEMM and the block reductions, with what time is left
if [ -n "$SANITIZER" ]; then
  step sanitize-racecheck 90 "$SANITIZER" --tool racecheck \
    deno test -A --filter '[cuda]' tests/nn_kernels_test.ts tests/nn_fp32_test.ts \
    tests/gemm_shapes_test.ts
fi

# ---- collect ----------------------------------------------------------------------------
cp bench/out/*.json bench/out/*.svg "$LOGS/" 2>/dev/null || true
say ""
say "total: $(elapsed)s"
for t in test-kernels test-all; do
  [ -f "$LOGS/$t.log" ] || continue
  say "$t: $(grep -E '^(ok|FAILED) \|' "$LOGS/$t.log" | tail -1)"
  say "$t: [cuda] cases ignored: $(grep -cE '\[cuda\].* \.\.\. ignored' "$LOGS/$t.log")" \
    "(all of them when the cuda backend did not open: see cuda-probe.log)"
  grep -E '\[cuda\].*( \.\.\. FAILED| => )' "$LOGS/$t.log" | head -30 | tee -a "$SUMMARY"
done
for t in sanitize-memcheck sanitize-racecheck; do
  [ -f "$LOGS/$t.log" ] && say "$t: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/$t.log" | tail -1)"
done
[ -f "$LOGS/nccl-smoke.log" ] &&
  say "nccl-smoke: $(grep -E '^(NCCL |nccl smoke|Cannot|error)' "$LOGS/nccl-smoke.log" | tr '\n' ';')"
[ -f "$LOGS/bench-nvjpeg.log" ] &&
  say "bench-nvjpeg: $(grep -E '^(JPEG decoding stays|  (nvjpeg|turbojpeg|bytes))' "$LOGS/bench-nvjpeg.log" | tr '\n' ';')"
[ -f "$LOGS/bench-step.log" ] && say "bench-step: $(grep -E '^(sum of the nn|op by op|graphs \()' "$LOGS/bench-step.log" | tr '\n' ';')"
[ -f "$LOGS/cifar.log" ] && say "cifar (steady state): $(grep -E '^epoch 2/2' "$LOGS/cifar.log")"
[ -f "$LOGS/cifar-torch.log" ] && say "cifar-torch: $(tail -1 "$LOGS/cifar-torch.log")"
[ -f "$LOGS/cifar-torch-compile.log" ] &&
  say "cifar-torch-compile: $(tail -1 "$LOGS/cifar-torch-compile.log" | cut -c1-400)"
for d in cifar cifar-torch cifar-torch-compile; do
  # dmon's sm column (the 2nd after gpu): the share of time a kernel ran, per second.
  [ -s "$LOGS/$d-dmon.log" ] &&
    say "$d dmon sm%: $(awk '!/^#/ && NF > 2 { printf "%s ", $2 }' "$LOGS/$d-dmon.log")"
done
say ""
say "logs in $LOGS: $(ls "$LOGS" | tr '\n' ' ')"
# Where the caller collects results from a folder OUT (a remote runner that returns a few
# files): the logs in one archive, the summary beside it.
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp "$SUMMARY" "$OUT/summary.log"
  tar czf "$OUT/gpu-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")"
  say "packed: $OUT/gpu-logs.tgz"
fi
# The failures, at the end of the output where a remote runner's tail shows them.
if [ -f "$LOGS/test-all.log" ]; then
  echo "---- failures (test-all) ----"
  sed -n '/^ERRORS/,$p' "$LOGS/test-all.log" | head -120
fi
