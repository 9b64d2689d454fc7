#!/usr/bin/env bash
# The GPU checks of the device-neutral core and the cuda package, in one
# command for a GPU machine (the `device` tool runs it in the repository
# root). Build first on any x86-64 machine (no GPU or CUDA needed):
#
#   scripts/gpu-verify.sh build      # writes .device/bin/{cuda.test,train}
#
# then carry .device to the GPU machine and run there:
#
#   scripts/gpu-verify.sh check      # every op and model step against the CPU, graphs, train -device cuda
#   scripts/gpu-verify.sh bench      # step and selection times: ours, then PyTorch eager, same GPU, TF32 off
#   scripts/gpu-verify.sh cifar      # ResNet-18 on CIFAR-10, one GPU, dense, one-cycle (the 93 % in 10 min proof)
#   scripts/gpu-verify.sh methods    # ResNet-18, 4 workers on one GPU, per sparsifier; mpirun -comm mpi vs -workers
#
# Results go to $OUT (or ./gpu-results). The shared data folder does not
# travel: checks that need real data read it from .device/data (copy the
# ml-100k folder there before carrying). CIFAR-10 (150 MB) is larger than
# one carry (64 MiB): carry .device/data/cifar-10-batches-bin in parts over
# back-to-back calls on the warm machine (a path not named in a carry stays).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-results}
mkdir -p "$out"
case "${1:-}" in
build)
  mkdir -p .device/bin
  go test -c -o .device/bin/cuda.test ./cuda
  go build -o .device/bin/train ./cmd/train
  ls -la .device/bin
  ;;
check)
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
  # Every GPU test must run (SPARSEGRAD_GPU=require: no skipping).
  (cd cuda && SPARSEGRAD_GPU=require TRAIN_DATA_DIR=$PWD/../.device/data ../.device/bin/cuda.test -test.v -test.count=1 -test.timeout 20m) 2>&1 | tee "$out/cuda-tests.txt"
  ;;
bench)
  (cd cuda && ../.device/bin/cuda.test -test.run XXX -test.bench GPUStep -test.benchtime 50x -test.timeout 20m) 2>&1 | tee "$out/go-steps.txt"
  python3 scripts/gpu-step-torch.py --steps 50 2>&1 | tee "$out/torch-steps.txt"
  (cd cuda && ../.device/bin/cuda.test -test.run XXX -test.bench GPUSelect -test.benchtime 200x -test.timeout 10m) 2>&1 | tee "$out/go-select.txt"
  python3 scripts/gpu-select-torch.py --reps 200 2>&1 | tee "$out/torch-select.txt"
  ;;
cifar)
  # One cycle over 30 epochs peaking at 0.4 for batch 512 (0.1 per 128
  # images), SGD with Nesterov momentum 0.9 and weight decay 5e-4 (BatchNorm
  # exempt), random crops and flips; -max-time stops it at 10 minutes.
  .device/bin/train -device cuda -model resnet18 -data-dir .device/data -batch 512 -eval-batch 1000 \
    -lr-schedule onecycle -lr 0.4 -nesterov -wd 5e-4 -epochs 30 -max-time 10m -out "$out/resnet18-cifar10" 2>&1 | tee "$out/resnet18-cifar10.txt"
  ;;
methods)
  # Four workers sharing the GPU (device buffers staged through host
  # memory), 60 steps each: report.html's time breakdown shows each
  # method's selection and communication share of the iteration.
  for sp in dense deft micro topk spardl lags; do
    .device/bin/train -device cuda -model resnet18 -data-dir .device/data -workers 4 -sparsifier "$sp" -density 0.01 \
      -steps 60 -max-eval-batches 2 -quiet -out "$out/methods/$sp" 2>&1 | tail -3 | tee "$out/methods-$sp.txt"
  done
  # The same losses in one process and under mpirun (-comm mpi, staged).
  .device/bin/train -device cuda -model ncf -data-dir .device/data -workers 2 -sparsifier topk -steps 20 -quiet -out "$out/np2-local" > /dev/null
  mpirun --allow-run-as-root --oversubscribe -np 2 .device/bin/train -device cuda -comm mpi -model ncf -data-dir .device/data \
    -sparsifier topk -steps 20 -quiet -out "$out/np2-mpi" > /dev/null
  diff <(grep -o '"loss":[^,]*' "$out/np2-local/metrics.jsonl") <(grep -o '"loss":[^,]*' "$out/np2-mpi/metrics.jsonl") && echo "mpirun -comm mpi: same losses as -workers 2"
  ;;
*)
  echo "usage: $0 build|check|bench|cifar|methods" >&2
  exit 2
  ;;
esac
