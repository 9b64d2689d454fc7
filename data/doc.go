// Package data owns the project's data sets: readers for the real file formats
// users download (CIFAR-10/100 binary, WikiText-2 tokens, MovieLens u.data /
// ratings.dat / ratings.csv and NCF's preprocessed *.rating / *.negative files),
// deterministic per-rank sharding and shuffling, training augmentation, batch
// assembly into reusable buffers, and verified downloads of the official
// archives (Download).
//
// # Entry points
//
//   - CIFAR-10/100: LoadCIFAR (official files, exact counts) or ReadCIFARFile
//     (any number of records), then NewCIFARLoader for per-rank ImageBatch
//     values: float32 NCHW images normalised with the per-channel mean/std,
//     labels (fine and coarse for CIFAR-100), training augmentation
//     (CIFARAugment: random 32×32 crop of the 4-pixel zero-padded image and a
//     random horizontal flip).
//   - WikiText-2: LoadWikiText (one Vocab over the three splits, <eos> per
//     line), then NewBPTTLoader for per-rank BPTT windows (TokenBatch).
//   - MovieLens: ReadRatings / ParseRatings (u.data, ratings.dat, ratings.csv,
//     NCF *.rating), NewImplicit or LoadMovieLens for the leave-one-out
//     implicit-feedback Implicit with fixed evaluation candidates, then
//     NewRecLoader for per-rank RecBatch values with per-epoch negatives. LoadMovieLens refuses a ratings file of an
//     official data set (ml-100k, ml-1m, ml-20m) whose number of ratings or
//     known SHA-256 differs from the official file's (a copy cut short at a
//     line boundary parses).
//   - Download fetches an official archive (Sources lists them) with checksum
//     verification, a progress bar and an atomic move into place.
//
// Loaders reuse their buffers (Batch allocates nothing), may use several
// goroutines (LoaderConfig.Workers) and must be closed with Close.
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
// # Deviations from the reference code (on purpose)
//
//   - Sharding drops the remainder of each epoch's permutation; the reference
//     DistributedSampler pads it by repeating samples.
//   - CIFAR-100 training uses the CIFAR-10 augmentation (crop and flip); the
//     reference adds RandomRotation(15) for CIFAR-100, which is not
//     implemented here.
//   - WikiText-2 is tokenised by white space with <eos> per line (the PyTorch
//     word-language-model convention: 33,278 words), not with spaCy and
//     lower-casing as in the DEFT code (≈28,869 words).
//   - NCF: training negatives are drawn from the items the user has not rated
//     (the reference draws from all items), every worker gets a shuffled mix
//     of positives and negatives (the reference gives contiguous slices of
//     [positives; negatives]), and the evaluation candidates are the positive
//     first, then distinct unrated items (the reference puts 100 negatives,
//     which may repeat or equal the positive, before the positive).
//
// # Errors
//
// A bad file never trains silently: a reader returns an error that names the
// file, the record or line, and what was expected. A missing data set gives an
// error that wraps fs.ErrNotExist and says how to download it.
package data
