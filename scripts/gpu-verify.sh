#!/usr/bin/env bash
# The GPU checks, in one call of a GPU machine. Prepare on any x86-64
# machine first (no GPU or CUDA needed):
#
#   scripts/gpu-prepare          # .device: stripped binaries (gzip), ml-100k
#
# then run on the GPU machine, from the repository root, carrying .device
# (the `device` tool: carry [".device/bin", ".device/data",
# ".device/echarts.min.js", ".device/REVISION"], timeout_s 330):
#
#   scripts/gpu-verify.sh measure
#
# measures again what docs/bench/gpu.md and docs/bench/gpu-budget.md still
# lack, in under 5 minutes (SPARSEGRAD_GPU_BUDGET, default 280 s), one
# output file per step and measure.txt, the summary:
#
#   M1 step time     ours (BenchmarkGPUStep: ms/step, whether the step
#                    replayed as a CUDA graph, launches and host waits per
#                    step) then PyTorch eager: ResNet-18 b128, LSTM
#                    default, NCF b256 and b65536, TF32 off
#   M2 selection     ours (BenchmarkGPUSelect) then torch.topk
#   M3 host counts   TestStepBudgets -short on the GPU (NCF, dense,
#                    top-k and DEFT, 1 and 4 workers): the counts the emulator
#                    measured, from the real driver
#   M4 methods       ResNet-18, 4 workers sharing the GPU, 40 steps of
#                    dense, deft, micro, topk, spardl, lags at ρ = 0.01, on
#                    synthetic CIFAR-10-format data (random pixels, made on
#                    the machine: the timing needs no real images): each
#                    method's iteration, selection and communication
#
# The full proof, run once (docs/bench/gpu.md), is:
#
#   scripts/gpu-verify.sh proof
#
# proof runs, in order, each step with its own time limit and output file,
# within a budget of SPARSEGRAD_GPU_BUDGET seconds (default 400: a step
# that would not fit is skipped, and says so):
#
#   1 probe          nvidia-smi, the libraries loaded (files, versions),
#                    the cuDNN algorithm of each ResNet-18 convolution
#   2 correctness    every op kind forward and backward, graph replay, one
#                    training step of each model, against the CPU (1e-4)
#   3 selection      exact top-k (ρ = 0.01, 0.001) and threshold selection
#                    on 11,173,962 elements, the CPU's index sets
#   4 step time      ours (BenchmarkGPUStep), then PyTorch eager, same GPU,
#                    same batches, TF32 off; then each instruction of one
#                    step of ours timed (TestGPUProfileSteps)
#   5 selection time ours (BenchmarkGPUSelect), then torch.topk, and the
#                    device-to-device copy bandwidth
#   6 the rest       the reducers against the CPU, training and resuming on
#                    the GPU, NCCL
#   7 mpirun         mpirun -np 2 -device cuda -comm mpi against -workers 2
#                    (same losses), where the machine has mpirun
#
# Results go to $OUT (or ./gpu-results): summary.txt, written first and
# appended after every step (so a late failure or the call's time limit
# still returns the earlier results), and one file per step: eight files
# in all. ONLY=3,5 runs only those steps (a rerun of what failed). No
# `set -e`: a failing step does not stop the next.
#
# After the proof (scripts/gpu-prepare cifar first; CIFAR-10 travels in
# three parts, the machine kept warm between the calls):
#
#   call 1: carry [".device/bin", ".device/data", ".device/echarts.min.js", ".device/REVISION",
#           ".device/cifar/part-1", ".device/cifar/SHA256"]   scripts/gpu-verify.sh proof
#   call 2: carry [".device/cifar/part-2"]                    true
#   call 3: carry [".device/cifar/part-3"]                    scripts/gpu-verify.sh cifar
#   call 4: (nothing carried)                                 scripts/gpu-verify.sh methods
#
#   cifar    joins the parts (checked against SHA256), times 30 steps at
#            batch 512, sizes a one-cycle schedule to end within 5 minutes
#            of training, trains ResNet-18 dense on one GPU (-max-time 5m),
#            samples the GPU's utilisation every second meanwhile: cifar.txt
#            (summary), cifar-steps.txt, the run's report.html, metrics.jsonl
#            and run.json, gpu-util.txt
#   methods  ResNet-18, 4 workers sharing the GPU, 60 steps of dense, deft,
#            micro, topk, spardl, lags at ρ = 0.01: each method's selection
#            and communication share of the iteration and actual density
#            (methods.txt, methods-steps.txt, the runs' reports in
#            methods-runs.tar.gz), and mpirun -np 2 -comm mpi against
#            -workers 2 (same losses; mpi.txt); METHODS="micro" and
#            METHOD_STEPS=300 run other methods or lengths
#
# SPARSEGRAD_REHEARSE=1 runs the training of cifar, methods and measure's
# M4 on the CPU with a few steps, the cuda package's steps on its emulator,
# and skips PyTorch (scripts/gpu-rehearse plays the calls here).
cd "$(dirname "$0")/.." || exit 2
repo=$PWD
out=${OUT:-gpu-results}
mkdir -p "$out"
summary=$out/summary.txt
budget=${SPARSEGRAD_GPU_BUDGET:-400}
t_start=$(date +%s)
bin=/tmp/sparsegrad-bin
export SPARSEGRAD_REQUIRE=gpu,nvrtc TRAIN_DATA_DIR=$repo/.device/data PYTHONUNBUFFERED=1

say() { echo "$*" | tee -a "$summary"; }
# revision is the commit the binaries were built from (gpu-prepare writes
# it: the machine's copy of the tree has no .git).
revision() { cat .device/REVISION 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown; }
elapsed() { echo $(($(date +%s) - t_start)); }
# gpu_name is the GPU's name, driver and memory (nvidia-smi), or why not.
gpu_name() {
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1
  else
    echo "no nvidia-smi on this machine${rehearse:+ (a rehearsal: the GPU steps run on the emulator)}"
  fi
}
want() { [ -z "${ONLY:-}" ] || [[ ",$ONLY," == *",$1,"* ]]; }

# run NUM NAME LIMIT FILE CMD...: CMD with its own time limit (cut to what
# the budget has left), its output appended to FILE, one summary line.
run() {
  local num=$1 name=$2 limit=$3 file=$4
  shift 4
  local left=$((budget - $(elapsed) - 5))
  if [ "$left" -lt 15 ]; then
    say "$(printf '%s %-30s skipped: %d s of the %d s budget used' "$num" "$name" "$(elapsed)" "$budget")"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0 rc verdict
  t0=$(date +%s)
  echo "\$ $*" >>"$out/$file"
  # bash -c: the step may be one of this script's functions (exported).
  timeout -k 5 "$limit" bash -c '"$@"' step "$@" >>"$out/$file" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    verdict=ok
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    verdict="TIMED OUT (${limit} s)"
  else
    verdict="FAILED (exit $rc)"
  fi
  say "$(printf '%s %-30s %-18s %4d s  %s' "$num" "$name" "$verdict" $(($(date +%s) - t0)) "$file")"
}

unpack() {
  mkdir -p "$bin"
  for b in cuda.test train; do
    if [ ! -f ".device/bin/$b.gz" ]; then
      say "missing .device/bin/$b.gz: run scripts/gpu-prepare first and carry .device"
      exit 2
    fi
    gunzip -c ".device/bin/$b.gz" >"$bin/$b" && chmod +x "$bin/$b"
  done
  # The tests run in the package's folder, as go test runs them.
  printf '#!/bin/sh\ncd %s/cuda && exec %s/cuda.test "$@"\n' "$repo" "$bin" >"$bin/ct"
  chmod +x "$bin/ct"
}

probe() {
  nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
  echo "kernel: $(uname -r)"
  ls -d /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null
  ls /opt/*/.venv/lib/python3*/site-packages/nvidia/cudnn/lib 2>/dev/null
  python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version(), "NCCL", torch.cuda.nccl.version())'
  echo "mpirun: $(command -v mpirun || echo none)"
  "$bin/ct" -test.run '^(TestGPUProbe|TestLibrariesReportsNVRTC|TestGPUMemoryAndStreams)$' -test.v -test.count=1
}

proof() {
  : >"$summary"
  say "sparsegrad GPU proof, $(date -u +%FT%TZ), revision $(revision), budget ${budget} s"
  say "$(gpu_name)"
  unpack
  local ct="$bin/ct" v="-test.v -test.count=1"
  want 1 && run 1 probe 60 1-probe.txt probe
  want 2 && run 2 "correctness (1e-4, TF32 off)" 150 2-correct.txt \
    "$ct" -test.run '^(TestGPUMathMatchesCPU|TestGPUOpsMatchCPU|TestGPUGraphReplay|TestGPUModelStepsMatchCPU|TestConvAlgorithmChoice)$' $v
  want 3 && run 3 "selection, 11,173,962 elements" 90 3-select.txt \
    "$ct" -test.run '^(TestGPUSelectLarge|TestGPUTopKMatchesCPU|TestGPUSelectAboveMatchesCPU)$' $v
  want 4 && run 4 "step time: ours" 100 4-steps.txt "$ct" -test.run '^$' -test.bench GPUStep -test.benchtime 30x
  want 4 && run 4 "step time: PyTorch eager" 90 4-steps.txt python3 scripts/gpu-step-torch.py --steps 30 --warmup 5
  want 4 && run 4 "step profile: where it goes" 60 4-steps.txt "$ct" -test.run '^TestGPUProfileSteps$' $v
  want 5 && run 5 "selection time: ours" 60 5-select-speed.txt "$ct" -test.run '^$' -test.bench GPUSelect -test.benchtime 100x
  want 5 && run 5 "selection time: torch.topk" 60 5-select-speed.txt python3 scripts/gpu-select-torch.py --reps 100
  want 6 && run 6 "reducers, training, NCCL" 150 6-more.txt \
    "$ct" -test.run '^(TestGPUReducersMatchCPU|TestTrainOnGPU|TestResumeOnGPU|TestTrainOverNCCL|TestStagedDeviceBuffers|TestNCCLConformance|TestNCCLIDPassedByValue|TestGPUAccumulateAndNorms|TestGPUGatherScatter|TestGPUHashSelect|TestGPUUnionAndScatter|TestGPUIndexOps)$' $v
  want 7 && run 7 "mpirun -comm mpi = -workers 2" 90 7-mpi.txt mpi_same_losses
  # The numbers the docs need, from the step files.
  {
    echo "--- errors (max relative, GPU against CPU)"
    grep -h 'max relative error' "$out"/2-correct.txt 2>/dev/null | sed 's/^ *//'
    echo "--- selections"
    grep -h 'equal the CPU' "$out"/3-select.txt 2>/dev/null | sed 's/^ *//'
    echo "--- times"
    grep -hE 'ms/step|µs/op|"ms_per_step"|"us"' "$out"/4-steps.txt "$out"/5-select-speed.txt 2>/dev/null
    echo "--- failures"
    grep -hE '^\s*--- FAIL|^FAIL|panic:' "$out"/*.txt 2>/dev/null | grep -v summary | head -20
  } >>"$summary"
  say "done in $(elapsed) s"
}

# mpi_same_losses runs NCF with two workers on the GPU in one process and
# under mpirun (-comm mpi: device buffers staged through host memory) and
# compares every step's loss.
mpi_same_losses() {
  local mpirun
  mpirun=$(command -v mpirun) || { echo "no mpirun on this machine: step 7 cannot run here"; return 3; }
  local args=($(device_flags) -model ncf -dataset ml-100k -data-dir .device/data -sparsifier topk -density 0.05 -steps 20 -quiet)
  rm -rf /tmp/np2-local /tmp/np2-mpi
  "$bin/train" "${args[@]}" -workers 2 -out /tmp/np2-local || return 1
  "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$bin/train" "${args[@]}" -comm mpi -out /tmp/np2-mpi || return 1
  diff <(grep -o '"loss":[^,]*' /tmp/np2-local/metrics.jsonl) <(grep -o '"loss":[^,]*' /tmp/np2-mpi/metrics.jsonl) &&
    echo "mpirun -np 2 -comm mpi: the losses of -workers 2, every step ($(grep -c '"loss"' /tmp/np2-mpi/metrics.jsonl) steps)"
}

# rehearse is set for a stand-in run on the CPU.
rehearse=${SPARSEGRAD_REHEARSE:-}
device_flags() {
  if [ -n "$rehearse" ]; then echo "-device cpu"; else echo "-device cuda"; fi
}

# join_cifar puts CIFAR-10 together from the carried parts, once.
join_cifar() {
  local dir=.device/data/cifar-10-batches-bin
  if [ -f "$dir/data_batch_5.bin" ]; then return 0; fi
  ls .device/cifar/part-* >/dev/null 2>&1 || { echo "no .device/cifar/part-*: carry the parts (scripts/gpu-prepare cifar)"; return 1; }
  local got
  got=$(cat .device/cifar/part-* | tee >(tar -xf - -C .device/data) | sha256sum | cut -d' ' -f1)
  sleep 1 # the tar of the process substitution finishes
  if [ "$got" != "$(cat .device/cifar/SHA256)" ]; then
    echo "CIFAR-10's parts join to SHA-256 $got, not $(cat .device/cifar/SHA256): a part is missing or damaged ($(ls .device/cifar))"
    rm -rf "$dir"
    return 1
  fi
  echo "CIFAR-10 joined from $(ls .device/cifar/part-* | wc -l) parts, SHA-256 verified"
}

# synth_cifar writes CIFAR-10's files (the training batches and the test
# sample) with random pixels and labels cycling 0-9 into
# .device/synth/cifar-10-batches-bin, once: data for timing only.
synth_cifar() {
  local dir=.device/synth/cifar-10-batches-bin
  [ -f "$dir/test_batch.first1000.bin" ] && return 0
  mkdir -p "$dir"
  python3 - "$dir" <<'PY'
import os, sys
d = sys.argv[1]
def write(name, n):
    rec = bytearray()
    for i in range(n):
        rec.append(i % 10)
        rec += os.urandom(3072)
    with open(os.path.join(d, name), "wb") as f:
        f.write(rec)
for b in range(1, 6):
    write(f"data_batch_{b}.bin", 10000)
write("test_batch.first1000.bin", 1000)
PY
  echo "synthetic CIFAR-10 (random pixels) in $dir"
}

# methods_table DIR prints each method's median iteration and its
# selection and communication shares from the runs under DIR.
methods_table() {
  python3 - "$1" <<'PY'
import json, os, statistics, sys
root = sys.argv[1]
# Communication as the reports' time breakdown counts it: t_comm, at most
# t_wait, for a sequential reduction; the reduction's wall time
# t_comm_wall for one that overlapped the backward pass (LAGS pipelining:
# t_comm_wall > t_wait), whose calls overlap so that t_comm adds up more
# than the time they took.
def comm(r):
    if (r.get("t_comm_wall") or 0) > (r.get("t_wait") or 0):
        return r["t_comm_wall"]
    return min(r.get("t_comm") or 0, r.get("t_wait") or 0)
print(f"{'method':8} {'t_iter ms':>10} {'select ms':>10} {'select %':>9} {'comm ms':>8} {'comm %':>7} {'actual/setup density':>21}")
for m in ["dense", "deft", "micro", "topk", "spardl", "lags"]:
    try:
        rs = [json.loads(l) for l in open(os.path.join(root, m, "metrics.jsonl")) if '"t_iter"' in l]
    except OSError:
        print(f"{m:8} (no run)")
        continue
    rs = rs[len(rs) // 6:] or rs  # after the first sixth (warm-up)
    med = lambda k: statistics.median(r.get(k, 0) or 0 for r in rs)
    it, sel, cm = med("t_iter"), med("t_select"), statistics.median(comm(r) for r in rs)
    dens = statistics.mean((r.get("actual_density") or 0) / (r.get("density") or 1) for r in rs)
    print(f"{m:8} {1e3 * it:10.1f} {1e3 * sel:10.2f} {100 * sel / it:9.1f} {1e3 * cm:8.2f} {100 * cm / it:7.1f} {dens:21.3f}")
PY
}

# torch_or_skip runs a PyTorch script, or says that a rehearsal skips it.
torch_or_skip() {
  if [ -n "$rehearse" ]; then
    echo "rehearsal: PyTorch's side skipped (no GPU here)"
    return 0
  fi
  python3 "$@"
}

measure() {
  summary=$out/measure.txt
  : >"$summary"
  budget=${SPARSEGRAD_GPU_BUDGET:-280}
  # A rehearsal's emulator and CPU are slow; its times mean nothing.
  local x=1
  [ -n "$rehearse" ] && x=5 budget=${SPARSEGRAD_GPU_BUDGET:-1400}
  say "sparsegrad GPU measurements, $(date -u +%FT%TZ), revision $(revision), budget ${budget} s"
  say "$(gpu_name)"
  unpack
  local ct="$bin/ct" v="-test.v -test.count=1"
  local bench=30x sel=100x steps=40 batch=()
  [ -n "$rehearse" ] && bench=2x sel=2x steps=2 batch=(-batch 2)
  want M1 && run M1 "step time: ours" $((75 * x)) m1-steps.txt "$ct" -test.run '^$' -test.bench GPUStep -test.benchtime "$bench"
  want M1 && run M1 "step time: PyTorch eager" $((70 * x)) m1-steps.txt torch_or_skip scripts/gpu-step-torch.py --steps 30 --warmup 5
  want M2 && run M2 "selection time: ours" $((30 * x)) m2-select.txt "$ct" -test.run '^$' -test.bench GPUSelect -test.benchtime "$sel"
  want M2 && run M2 "selection time: torch.topk" $((30 * x)) m2-select.txt torch_or_skip scripts/gpu-select-torch.py --reps 100
  want M3 && run M3 "host counts per step (NCF)" $((60 * x)) m3-budget.txt "$ct" -test.run '^TestStepBudgets$' -test.short $v
  if want M4; then
    run M4 "synthetic CIFAR-10" $((30 * x)) m4-methods.txt synth_cifar
    rm -rf /tmp/measure-methods
    local m
    for m in ${METHODS:-dense deft micro topk spardl lags}; do
      run M4 "methods: $m" $((60 * x)) m4-methods.txt "$bin/train" $(device_flags) -model resnet18 -dataset cifar10 -data-dir .device/synth -workers 4 \
        -sparsifier "$m" -density 0.01 -steps "$steps" "${batch[@]}" -max-eval-batches 1 -quiet -out "/tmp/measure-methods/$m"
    done
  fi
  {
    echo "--- step times (ours: ms/step, graphs/step 1 = replayed as a CUDA graph; PyTorch: ms_per_step)"
    grep -hE 'ms/step|"ms_per_step"' "$out"/m1-steps.txt 2>/dev/null
    echo "--- selection times"
    grep -hE 'µs/op|"us"' "$out"/m2-select.txt 2>/dev/null
    echo "--- host counts per worker and step (TestStepBudgets)"
    grep -h '^ *|' "$out"/m3-budget.txt 2>/dev/null | sed 's/^ *//' | awk '/^\| model \|/ {t = ""} {t = t $0 "\n"} END {printf "%s", t}'
    echo "--- ResNet-18, 4 workers on one GPU, ρ = 0.01 (synthetic data)"
    methods_table /tmp/measure-methods 2>&1
    echo "--- failures"
    grep -hE '^\s*--- FAIL|^FAIL|panic:' "$out"/m*.txt 2>/dev/null | head -20
  } >>"$summary"
  say "done in $(elapsed) s"
}

# median_iter prints the median t_iter (seconds) of a run's metrics.jsonl.
median_iter() {
  python3 -c 'import json,sys,statistics; v=[json.loads(l)["t_iter"] for l in open(sys.argv[1]) if "\"t_iter\"" in l]; print(statistics.median(v[3:] or v))' "$1"
}

cifar() {
  summary=$out/cifar.txt
  : >"$summary"
  say "ResNet-18 on CIFAR-10, one GPU, dense, $(date -u +%FT%TZ), revision $(revision)"
  unpack
  budget=${SPARSEGRAD_GPU_BUDGET:-500}
  run c "join CIFAR-10" 60 cifar-steps.txt join_cifar
  export SPARSEGRAD_ECHARTS=$repo/.device/echarts.min.js
  local batch=512 steps=30 budget_s=280 tmax=5m
  [ -n "$rehearse" ] && batch=16 steps=3 budget_s=20 tmax=20s
  # One-cycle (peak 0.4 for batch 512, i.e. 0.1 per 128 images), Nesterov
  # momentum 0.9, weight decay 5e-4 (batch norm exempt), label smoothing
  # 0.1, random crops and flips; the 1,000 test images of the data folder
  # every epoch.
  local common=(-model resnet18 -dataset cifar10 -data-dir .device/data -batch "$batch" -eval-batch 1000
    -lr-schedule onecycle -lr 0.4 -nesterov -wd 5e-4 -label-smoothing 0.1 $(device_flags))
  rm -rf /tmp/cifar-timing /tmp/resnet18-cifar10
  run c "time $steps steps" 120 cifar-steps.txt "$bin/train" "${common[@]}" -steps "$steps" -quiet -out /tmp/cifar-timing
  local t_iter per_epoch epochs
  t_iter=$(median_iter /tmp/cifar-timing/metrics.jsonl 2>/dev/null || echo 0.1)
  # + the evaluation and the epoch's turn: 0.26 s on an H200 (55 epochs of
  # 97 steps at 41.4 ms took 4.28 s each, 2026-11-26)
  per_epoch=$(python3 -c "print($t_iter * (50000 // $batch) + 0.3)")
  epochs=$(python3 -c "print(max(1, int($budget_s / $per_epoch)))")
  say "median step $t_iter s at batch $batch: about $per_epoch s per epoch; $epochs epochs fit $budget_s s"
  if [ -z "$rehearse" ]; then
    nvidia-smi dmon -s u -d 1 >"$out/gpu-util.txt" 2>&1 &
  fi
  local dmon=$!
  run c "train $epochs epochs (-max-time $tmax)" 420 cifar-steps.txt "$bin/train" "${common[@]}" -epochs "$epochs" -max-time "$tmax" -out /tmp/resnet18-cifar10
  [ -z "$rehearse" ] && kill "$dmon" 2>/dev/null
  for f in report.html metrics.jsonl run.json; do cp "/tmp/resnet18-cifar10/$f" "$out/" 2>/dev/null; done
  {
    echo "--- evaluations (the 1,000-image test sample)"
    grep '"accuracy"' /tmp/resnet18-cifar10/metrics.jsonl 2>/dev/null | tail -5
    echo "--- GPU utilisation while training (nvidia-smi dmon, sm %): mean over samples"
    awk '$1 ~ /^[0-9]+$/ {s+=$2; n++} END {if (n) printf "%.1f %% busy over %d s: idle share %.1f %%\n", s/n, n, 100-s/n}' "$out/gpu-util.txt" 2>/dev/null
  } >>"$summary"
  say "done in $(elapsed) s"
}

methods() {
  summary=$out/methods.txt
  : >"$summary"
  say "ResNet-18, 4 workers on one GPU, ${METHOD_STEPS:-60} steps per method, ρ = 0.01, $(date -u +%FT%TZ)"
  unpack
  join_cifar >/dev/null || { say "no CIFAR-10: run the cifar sequence first"; return 1; }
  export SPARSEGRAD_ECHARTS=$repo/.device/echarts.min.js
  local steps=${METHOD_STEPS:-60} batch=()
  [ -n "$rehearse" ] && steps=2 batch=(-batch 2)
  rm -rf /tmp/methods
  for m in ${METHODS:-dense deft micro topk spardl lags}; do
    run m "$m" 120 methods-steps.txt "$bin/train" $(device_flags) -model resnet18 -dataset cifar10 -data-dir .device/data -workers 4 \
      -sparsifier "$m" -density 0.01 -steps "$steps" "${batch[@]}" -max-eval-batches 1 -quiet -out "/tmp/methods/$m"
  done
  methods_table /tmp/methods >>"$summary"
  tar -czf "$out/methods-runs.tar.gz" --exclude=checkpoints -C /tmp methods 2>/dev/null
  run m "mpirun -comm mpi = -workers 2" 90 mpi.txt mpi_same_losses
  say "done in $(elapsed) s"
}

export bin repo out rehearse
export -f probe mpi_same_losses join_cifar device_flags synth_cifar torch_or_skip

case "${1:-}" in
measure) measure ;;
proof) proof ;;
cifar) cifar ;;
methods) methods ;;
*)
  echo "usage: $0 measure|proof|cifar|methods   (after scripts/gpu-prepare; see the comment at the top)" >&2
  exit 2
  ;;
esac
