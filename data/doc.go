// Package data owns the project's data sets: readers for the real file formats
// users download (CIFAR-10/100 binary, WikiText-2 tokens, MovieLens u.data /
// ratings.dat / ratings.csv and NCF's preprocessed *.rating / *.negative files),
// deterministic per-rank sharding and shuffling, training augmentation, batch
// assembly into reusable buffers, and verified downloads of the official
// archives (Download).
//
// # Determinism and sharding
//
// Every random choice is a pure function of (seed, epoch, sample index): the
// per-epoch shuffle is a keyed pseudo-random permutation (Perm) that every rank
// computes identically, so all ranks agree on it without communicating. Rank r
// of n takes positions r, r+n, r+2n, ... of the permutation, floor(N/n)
// positions in all; the last N mod n positions of each epoch's permutation are
// dropped (a different remainder every epoch), so all ranks hold disjoint,
// equal-sized shares and run the same number of iterations. Augmentation
// (CIFAR crops and flips) and negative sampling (MovieLens) are keyed by the
// sample's global index, so the result does not depend on how many goroutines
// assemble a batch.
//
// Evaluation loaders do not shuffle and do not drop: rank r takes samples
// r, r+n, ... of the split in file order, so the ranks together cover it once.
//
// # Errors
//
// A bad file never trains silently: a reader returns an error that names the
// file, the record or line, and what was expected. A missing data set gives an
// error that wraps fs.ErrNotExist and says how to download it.
package data
