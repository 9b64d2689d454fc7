// Package advise owns the sparsifier advisor: it measures on this machine
// what it can (one training step of a model, each method's selection cost on
// the model's real layout and real gradients, the host's collectives) and
// projects each method's time per iteration at P workers on a given network
// with the α-β model of comm/netmodel, ranking the methods against dense
// all-reduce.
package advise
