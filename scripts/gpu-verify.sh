#!/usr/bin/env bash
# The GPU checks, in one call of a GPU machine. Prepare on any x86-64
# machine first (no GPU or CUDA needed):
#
#   scripts/gpu-prepare          # .device: stripped binaries (gzip), ml-100k
#
# then run on the GPU machine, from the repository root, carrying .device
# (the `device` tool: carry [".device"], timeout_s 420):
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
#                    same batches, TF32 off
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
cd "$(dirname "$0")/.." || exit 2
repo=$PWD
out=${OUT:-gpu-results}
mkdir -p "$out"
summary=$out/summary.txt
budget=${SPARSEGRAD_GPU_BUDGET:-400}
t_start=$(date +%s)
bin=/tmp/sparsegrad-bin
export SPARSEGRAD_GPU=require TRAIN_DATA_DIR=$repo/.device/data PYTHONUNBUFFERED=1

say() { echo "$*" | tee -a "$summary"; }
elapsed() { echo $(($(date +%s) - t_start)); }
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
  say "sparsegrad GPU proof, $(date -u +%FT%TZ), revision $(git rev-parse --short HEAD 2>/dev/null || echo unknown), budget ${budget} s"
  say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
  unpack
  local ct="$bin/ct" v="-test.v -test.count=1"
  want 1 && run 1 probe 60 1-probe.txt probe
  want 2 && run 2 "correctness (1e-4, TF32 off)" 150 2-correct.txt \
    "$ct" -test.run '^(TestGPUMathMatchesCPU|TestGPUOpsMatchCPU|TestGPUGraphReplay|TestGPUModelStepsMatchCPU|TestConvAlgorithmChoice)$' $v
  want 3 && run 3 "selection, 11,173,962 elements" 90 3-select.txt \
    "$ct" -test.run '^(TestGPUSelectLarge|TestGPUTopKMatchesCPU|TestGPUSelectAboveMatchesCPU)$' $v
  want 4 && run 4 "step time: ours" 100 4-steps.txt "$ct" -test.run '^$' -test.bench GPUStep -test.benchtime 30x
  want 4 && run 4 "step time: PyTorch eager" 90 4-steps.txt python3 scripts/gpu-step-torch.py --steps 30 --warmup 5
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
  local args=(-device cuda -model ncf -dataset ml-100k -data-dir .device/data -sparsifier topk -density 0.05 -steps 20 -quiet)
  rm -rf /tmp/np2-local /tmp/np2-mpi
  "$bin/train" "${args[@]}" -workers 2 -out /tmp/np2-local || return 1
  "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$bin/train" "${args[@]}" -comm mpi -out /tmp/np2-mpi || return 1
  diff <(grep -o '"loss":[^,]*' /tmp/np2-local/metrics.jsonl) <(grep -o '"loss":[^,]*' /tmp/np2-mpi/metrics.jsonl) &&
    echo "mpirun -np 2 -comm mpi: the losses of -workers 2, every step ($(grep -c '"loss"' /tmp/np2-mpi/metrics.jsonl) steps)"
}

export bin repo out
export -f probe mpi_same_losses

case "${1:-}" in
proof) proof ;;
*)
  echo "usage: $0 proof   (after scripts/gpu-prepare; see the comment at the top)" >&2
  exit 2
  ;;
esac
