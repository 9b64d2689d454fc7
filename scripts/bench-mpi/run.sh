#!/usr/bin/env bash
# Benchmarks the Open MPI backend (comm/mpi) against Open MPI's own
# MPI_Allreduce on 11,173,962 float32 (ResNet-18's gradient), with 2 and 4
# processes, plus a plain memory copy of the same bytes as a yardstick.
#
# Usage: scripts/bench-mpi/run.sh [iterations]   (from the repository root)
# Needs: Go, Open MPI (apt-get install openmpi-bin libopenmpi-dev: mpirun, mpicc).
# The C program is written to a temporary directory and built there with mpicc.
set -euo pipefail

ITERS=${1:-20}
NPS=${NPS:-"2 4"}
LEN=11173962
cd "$(dirname "$0")/../.."
for tool in mpirun mpicc go; do
	command -v "$tool" >/dev/null || { echo "run.sh: $tool not found; install Open MPI (apt-get install openmpi-bin libopenmpi-dev) and Go" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)

cat >"$tmp/allreduce.c" <<'C'
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

/* Times MPI_Allreduce (sum, in place) of n floats: iters timed calls after
   two warm-up calls; prints the slowest rank's mean time per call. */
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long n = atol(argv[1]);
    int iters = atoi(argv[2]);
    float *x = malloc(n * sizeof(float));
    for (long i = 0; i < n; i++) x[i] = (float)(i % 97) * 1e-3f;
    for (int i = 0; i < 2; i++) MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t = MPI_Wtime();
    for (int i = 0; i < iters; i++) MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    t = (MPI_Wtime() - t) / iters;
    double tmax;
    MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("c_allreduce np=%d ns/op=%.0f\n", size, tmax * 1e9);
    free(x);
    MPI_Finalize();
    return 0;
}
C
mpicc -O2 -o "$tmp/allreduce" "$tmp/allreduce.c"
go test -c -o "$tmp/mpi.test" ./comm/mpi

echo "machine: $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p')), $(nproc) cores, $(free -g | awk '/^Mem:/ { print $2 }') GiB; $(mpirun --version | head -1); $(go version)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# ns/op of a Go benchmark line whose name starts with $1.
nsop() { awk -v name="$1" 'index($1, name) == 1 { for (i = 2; i < NF; i++) if ($(i+1) == "ns/op") { print $i; exit } }'; }
copy_ns=$("$tmp/mpi.test" -test.run '^$' -test.bench '^BenchmarkMemcpy$' -test.benchtime=${ITERS}x | nsop BenchmarkMemcpy)
add_ns=$("$tmp/mpi.test" -test.run '^$' -test.bench '^BenchmarkAddF32$' -test.benchtime=${ITERS}x | nsop BenchmarkAddF32)

printf '\n%-4s %-32s %12s %10s\n' np "operation ($LEN float32)" "ms/op" "vs C"
for np in $NPS; do
	c_ns=$("${MPIRUN[@]}" -np "$np" "$tmp/allreduce" "$LEN" "$ITERS" | sed -n 's/.*ns\/op=//p')
	# Open MPI's own ring algorithms, forced (4: ring, 5: segmented ring).
	tuned() { "${MPIRUN[@]}" --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm "$1" -np "$np" "$tmp/allreduce" "$LEN" "$ITERS" | sed -n 's/.*ns\/op=//p'; }
	c4_ns=$(tuned 4)
	c5_ns=$(tuned 5)
	out=$("${MPIRUN[@]}" -np "$np" "$tmp/mpi.test" -test.run '^$' -test.bench 'AllReduce|AllGatherV' -test.benchtime=${ITERS}x)
	# Small calls: rank 0's output only.
	rm -rf "$tmp/lat"
	"${MPIRUN[@]}" --output-filename "$tmp/lat" -np "$np" "$tmp/mpi.test" -test.run '^$' -test.bench 'Latency' -test.benchtime=1000x >/dev/null
	lat=$(cat "$tmp"/lat/*/rank.0/stdout)
	ring_ns=$(echo "$out" | nsop "BenchmarkAllReduce/ring/np=$np")
	raw_ns=$(echo "$out" | nsop "BenchmarkAllReduce/mpi/np=$np")
	agv_ns=$(echo "$out" | nsop "BenchmarkAllGatherV/np=$np")
	row() { awk -v np="$np" -v name="$1" -v ns="$2" -v c="$c_ns" 'BEGIN { printf "%-4s %-32s %12.2f %9.2fx\n", np, name, ns/1e6, ns/c }'; }
	row "C MPI_Allreduce (default)" "$c_ns"
	row "C MPI_Allreduce (alg 4 ring)" "$c4_ns"
	row "C MPI_Allreduce (alg 5 segring)" "$c5_ns"
	row "Go AllReduce (ring)" "$ring_ns"
	row "Go raw MPI_Allreduce" "$raw_ns"
	row "Go AllGatherV" "$agv_ns"
	for op in Barrier AllReduce1000 AllGather100 SendRecv1000; do
		awk -v np="$np" -v name="BenchmarkLatency/$op/np=$np" 'index($1, name) == 1 { for (i = 2; i < NF; i++) if ($(i+1) == "ns/op") printf "%-4s %-32s %12.3f\n", np, "Go " substr(name, 18, length(name) - 17 - length(np) - 4), $i/1e6 }' <<<"$lat"
	done
	row "memcpy (1 process)" "$copy_ns"
	row "addF32 (1 process)" "$add_ns"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "vs C: time relative to the default C MPI_Allreduce of the same process count (lower is faster)"
