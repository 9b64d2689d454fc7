package data

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// CIFAR image geometry.
const (
	CIFARSide     = 32                                    // image height and width
	CIFARChannels = 3                                     // R, G, B
	CIFARPixels   = CIFARChannels * CIFARSide * CIFARSide // 3,072 bytes per image
)

// CIFARKind selects CIFAR-10 or CIFAR-100.
type CIFARKind int

// The two CIFAR variants.
const (
	CIFAR10 CIFARKind = iota
	CIFAR100
)

// cifarKind holds the facts of a CIFAR variant. Mean and std are the
// usual per-channel (R, G, B) normalisation constants of the training set,
// as in the reference code (tasks/cifar.py).
type cifarKind struct {
	name, dir, download string
	labelBytes, classes int
	mean, std           [3]float32
}

var cifarKinds = [...]cifarKind{
	CIFAR10: {"CIFAR-10", "cifar-10-batches-bin", "cifar10", 1, 10,
		[3]float32{0.4914, 0.4822, 0.4465}, [3]float32{0.2023, 0.1994, 0.2010}},
	CIFAR100: {"CIFAR-100", "cifar-100-binary", "cifar100", 2, 100,
		[3]float32{0.5071, 0.4865, 0.4409}, [3]float32{0.2673, 0.2564, 0.2762}},
}

// facts are k's facts (CIFAR-10's for any kind but CIFAR100).
func (k CIFARKind) facts() cifarKind {
	if k == CIFAR100 {
		return cifarKinds[CIFAR100]
	}
	return cifarKinds[CIFAR10]
}

// String returns "CIFAR-10" or "CIFAR-100".
func (k CIFARKind) String() string { return k.facts().name }

// RecordSize is the size in bytes of one record of the binary format:
// 1 label byte + 3,072 pixels for CIFAR-10; coarse label, fine label + pixels
// for CIFAR-100.
func (k CIFARKind) RecordSize() int { return k.facts().labelBytes + CIFARPixels }

// Classes returns the number of (fine) classes: 10 or 100.
func (k CIFARKind) Classes() int { return k.facts().classes }

// DirName is the folder the official binary archive extracts to.
func (k CIFARKind) DirName() string { return k.facts().dir }

func (k CIFARKind) downloadName() string { return k.facts().download }

// Mean returns the per-channel means used for normalisation.
func (k CIFARKind) Mean() [3]float32 { return k.facts().mean }

// Std returns the per-channel standard deviations used for normalisation.
func (k CIFARKind) Std() [3]float32 { return k.facts().std }

// Split names a part of a data set.
type Split int

// The splits. CIFAR has no validation split.
const (
	Train Split = iota
	Valid
	Test
)

// String returns "train", "valid" or "test".
func (s Split) String() string {
	if n := [...]string{Train: "train", Valid: "valid", Test: "test"}; s >= 0 && int(s) < len(n) {
		return n[s]
	}
	return fmt.Sprintf("Split(%d)", int(s))
}

// CIFAR is a CIFAR-10 or CIFAR-100 split held in memory as raw bytes
// (3,072 per image, R plane, G plane, B plane, each 32×32 row-major).
type CIFAR struct {
	Kind   CIFARKind
	Pixels []byte  // Len()*CIFARPixels bytes
	Labels []int32 // the label (CIFAR-10) or fine label (CIFAR-100) of each image
	Coarse []int32 // CIFAR-100 coarse labels (20 classes); nil for CIFAR-10
}

// Len returns the number of images.
func (c *CIFAR) Len() int { return len(c.Labels) }

// CIFARFiles returns the file names (inside kind.DirName()) of a split of the
// official binary distribution, and the number of records each must hold.
func CIFARFiles(kind CIFARKind, split Split) ([]string, int, error) {
	switch {
	case kind == CIFAR10 && split == Train:
		return []string{"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"}, 10000, nil
	case kind == CIFAR10 && split == Test:
		return []string{"test_batch.bin"}, 10000, nil
	case kind == CIFAR100 && split == Train:
		return []string{"train.bin"}, 50000, nil
	case kind == CIFAR100 && split == Test:
		return []string{"test.bin"}, 10000, nil
	}
	return nil, 0, fmt.Errorf("data: %v has no %v split (use train or test)", kind, split)
}

// LoadCIFAR reads a split of the official binary distribution from root, which
// may be the folder that holds kind.DirName() or that folder itself. Every file
// must hold exactly the official number of records; to read a file of another
// size (such as a 1,000-image subset of the test set) use ReadCIFARFile.
func LoadCIFAR(root string, kind CIFARKind, split Split) (*CIFAR, error) {
	names, want, err := CIFARFiles(kind, split)
	if err != nil {
		return nil, err
	}
	dir := root
	if filepath.Base(filepath.Clean(root)) != kind.DirName() {
		dir = filepath.Join(root, kind.DirName())
	}
	out := &CIFAR{Kind: kind}
	total := want * len(names)
	out.Pixels = make([]byte, 0, total*CIFARPixels)
	out.Labels = make([]int32, 0, total)
	if kind == CIFAR100 {
		out.Coarse = make([]int32, 0, total)
	}
	for _, name := range names {
		path := filepath.Join(dir, name)
		part, err := ReadCIFARFile(path, kind)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, missing(err, kind.downloadName(), root)
			}
			return nil, err
		}
		if part.Len() != want {
			return nil, fmt.Errorf("data: %s: %d records, want %d (the official %v file; it is truncated or not the original — download it again, or read a subset with ReadCIFARFile)", path, part.Len(), want, kind)
		}
		out.Pixels = append(out.Pixels, part.Pixels...)
		out.Labels = append(out.Labels, part.Labels...)
		out.Coarse = append(out.Coarse, part.Coarse...)
	}
	return out, nil
}

// ReadCIFARFile reads one binary CIFAR file with any positive number of
// records. It checks the file size against the record size and every label
// against the number of classes, so a truncated file or a CIFAR-100 file read
// as CIFAR-10 (or the reverse) is an error naming the file and record.
func ReadCIFARFile(path string, kind CIFARKind) (*CIFAR, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("data: %s is a directory, want a %v binary file", path, kind)
	}
	if err := checkCIFARSize(path, st.Size(), kind); err != nil {
		return nil, err
	}
	return ParseCIFAR(bufio.NewReaderSize(f, 1<<20), path, kind, st.Size())
}

func checkCIFARSize(name string, size int64, kind CIFARKind) error {
	rec := int64(kind.RecordSize())
	if size == 0 {
		return fmt.Errorf("data: %s: empty file, want %v records of %d bytes", name, kind, rec)
	}
	if size%rec == 0 {
		return nil
	}
	other := CIFAR100
	if kind == CIFAR100 {
		other = CIFAR10
	}
	if size%int64(other.RecordSize()) == 0 {
		return fmt.Errorf("data: %s: %d bytes is not a whole number of %d-byte %v records but is %d %d-byte records: it looks like a %v file; read it as %v",
			name, size, rec, kind, size/int64(other.RecordSize()), other.RecordSize(), other, other)
	}
	return fmt.Errorf("data: %s: %d bytes is not a whole number of %d-byte %v records (%d whole records and %d extra bytes): the file is truncated or corrupt; download it again",
		name, size, rec, kind, size/rec, size%rec)
}

// ParseCIFAR parses size bytes of binary CIFAR records from r; name is used in
// errors. size must be a positive multiple of kind.RecordSize().
func ParseCIFAR(r io.Reader, name string, kind CIFARKind, size int64) (*CIFAR, error) {
	if err := checkCIFARSize(name, size, kind); err != nil {
		return nil, err
	}
	rec := kind.RecordSize()
	n := int(size / int64(rec))
	c := &CIFAR{Kind: kind, Pixels: make([]byte, n*CIFARPixels), Labels: make([]int32, n)}
	if kind == CIFAR100 {
		c.Coarse = make([]int32, n)
	}
	var lab [2]byte
	lb := kind.facts().labelBytes
	for i := 0; i < n; i++ {
		if _, err := io.ReadFull(r, lab[:lb]); err != nil {
			return nil, fmt.Errorf("data: %s: record %d of %d: %w (file truncated)", name, i, n, err)
		}
		if _, err := io.ReadFull(r, c.Pixels[i*CIFARPixels:(i+1)*CIFARPixels]); err != nil {
			return nil, fmt.Errorf("data: %s: record %d of %d: %w (file truncated)", name, i, n, err)
		}
		if kind == CIFAR100 {
			if lab[0] >= 20 {
				return nil, fmt.Errorf("data: %s: record %d (byte offset %d): coarse label %d, want 0..19: not a CIFAR-100 binary file", name, i, int64(i)*int64(rec), lab[0])
			}
			if lab[1] >= 100 {
				return nil, fmt.Errorf("data: %s: record %d (byte offset %d): fine label %d, want 0..99: not a CIFAR-100 binary file", name, i, int64(i)*int64(rec)+1, lab[1])
			}
			c.Coarse[i], c.Labels[i] = int32(lab[0]), int32(lab[1])
		} else {
			if lab[0] >= 10 {
				return nil, fmt.Errorf("data: %s: record %d (byte offset %d): label %d, want 0..9: not a CIFAR-10 binary file (a CIFAR-100 file? read it as CIFAR-100)", name, i, int64(i)*int64(rec), lab[0])
			}
			c.Labels[i] = int32(lab[0])
		}
	}
	return c, nil
}

// missing wraps a not-found error with a download hint.
func missing(err error, name, dir string) error {
	if _, lerr := LookupSource(name); lerr != nil {
		return fmt.Errorf("%w; the %s data set is not in %s and has no automatic download: fetch and extract it there by hand", err, name, dir)
	}
	return fmt.Errorf("%w; the %s data set is not in %s: download it with the -download flag or data.Download(ctx, %q, %q)", err, name, dir, name, dir)
}
