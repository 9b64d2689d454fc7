package comm

// rules are the traffic rules of Traffic, one sentence per Op, for pages
// that state how their byte counts came about.
var rules = [numOps]string{
	OpAllReduce:     "ring reduce-scatter then ring all-gather: rank r sends 2L − c(r) − c(r+1) and receives 2L − c(r−1) − c(r) bytes (L the buffer's size, c(i) the size of its chunk i), about 2(n−1)/n·L each way",
	OpAllGather:     "ring: (n−1)·L sent and received (L the rank's own part)",
	OpAllGatherV:    "ring: rank r forwards every rank's block but rank r+1's and receives every block but its own",
	OpBroadcast:     "binomial tree: every rank but the root receives L once; each rank sends L once per child",
	OpReduceScatter: "ring: rank r sends every block but its own and receives every block but rank r−1's",
	OpSend:          "the message's size",
	OpRecv:          "the message's size",
	OpSendRecv:      "both messages' sizes",
	OpBarrier:       "nothing",
}

// Rule says in one sentence how Traffic counts the bytes of a call of o:
// the algorithm it assumes and the formula it applies to the call's real
// buffer sizes.
func (o Op) Rule() string {
	if o < numOps {
		return rules[o]
	}
	return ""
}
