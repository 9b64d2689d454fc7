package data_test

import (
	"context"
	"fmt"
	"log"

	"github.com/sparsegrad/sparsegrad/data"
)

// A trainer's CIFAR-10 input pipeline on rank 3 of 16 workers.
func ExampleNewCIFARLoader() {
	dir := "../shared/data"
	train, err := data.LoadCIFAR(dir, data.CIFAR10, data.Train)
	if err != nil {
		log.Fatal(err) // names the missing file and how to download it
	}
	l, err := data.NewCIFARLoader(train, data.LoaderConfig{Batch: 32, Rank: 3, Size: 16, Seed: 1, Train: true})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	for epoch := 0; epoch < 2; epoch++ {
		if err := l.SetEpoch(epoch); err != nil {
			log.Fatal(err)
		}
		for i := 0; i < l.Len(); i++ {
			b, err := l.Batch(i) // b.X: 32×3×32×32 float32, b.Labels: 32 labels
			if err != nil {
				log.Fatal(err)
			}
			_ = b
		}
	}
}

// WikiText-2 BPTT windows: 32 columns per worker, 30 steps per window.
func ExampleNewBPTTLoader() {
	w, err := data.LoadWikiText("../shared/data/wikitext-2")
	if err != nil {
		log.Fatal(err)
	}
	l, err := data.NewBPTTLoader(w.Train, data.BPTTConfig{Batch: 32, BPTT: 30, Rank: 0, Size: 16})
	if err != nil {
		log.Fatal(err)
	}
	for i := 0; i < l.Len(); i++ {
		b, _ := l.Batch(i) // b.Input, b.Target: b.Steps×32, time-major
		_ = b
	}
	fmt.Println(w.Vocab.Len())
}

// NCF training samples and fixed evaluation candidates from MovieLens.
func ExampleNewRecLoader() {
	ds, err := data.LoadMovieLens("../shared/data", "ml-100k", data.ImplicitConfig{Seed: 1})
	if err != nil {
		log.Fatal(err)
	}
	l, err := data.NewRecLoader(ds, data.LoaderConfig{Batch: 1 << 16, Rank: 0, Size: 1, Seed: 1, Train: true}, 4)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	b, _ := l.Batch(0) // b.Users, b.Items, b.Labels
	_ = b
	for u := 0; u < ds.Users; u++ {
		_ = ds.Candidates(u) // positive first, then 99 negatives
	}
}

// Fetching a data set with a verified checksum.
func ExampleDownload() {
	if err := data.Download(context.Background(), "ml-100k", "datasets"); err != nil {
		log.Fatal(err)
	}
}
