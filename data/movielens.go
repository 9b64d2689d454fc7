package data

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// RatingFormat is a MovieLens ratings file format.
type RatingFormat int

// The rating formats.
const (
	// FormatAuto picks the format from the file name (ReadRatings only).
	FormatAuto RatingFormat = iota
	// FormatUData is ml-100k's u.data: "user<TAB>item<TAB>rating<TAB>timestamp", 1-based ids.
	FormatUData
	// FormatDat is ml-1m's ratings.dat: "UserID::MovieID::Rating::Timestamp", 1-based ids.
	FormatDat
	// FormatCSV is ml-20m's and ml-latest's ratings.csv: a header
	// "userId,movieId,rating,timestamp", then one rating per line, 1-based ids.
	FormatCSV
	// FormatNCF is NCF's preprocessed *.train.rating / *.test.rating:
	// "user<TAB>item<TAB>rating<TAB>timestamp", 0-based ids.
	FormatNCF
)

// String names the format.
func (f RatingFormat) String() string {
	if s := [...]string{FormatAuto: "auto", FormatUData: "u.data", FormatDat: "ratings.dat", FormatCSV: "ratings.csv", FormatNCF: "NCF .rating"}; f >= 0 && int(f) < len(s) {
		return s[f]
	}
	return fmt.Sprintf("RatingFormat(%d)", int(f))
}

func (f RatingFormat) layout() string {
	switch f {
	case FormatUData, FormatNCF:
		return "user<TAB>item<TAB>rating<TAB>timestamp"
	case FormatDat:
		return "UserID::MovieID::Rating::Timestamp"
	case FormatCSV:
		return "userId,movieId,rating,timestamp"
	}
	return "?"
}

func (f RatingFormat) sep() []byte {
	switch f {
	case FormatDat:
		return []byte("::")
	case FormatCSV:
		return []byte(",")
	}
	return []byte("\t")
}

// FormatOf returns the format of a ratings file from its name: u.data,
// ratings.dat, *.csv, *.rating.
func FormatOf(path string) (RatingFormat, error) {
	base := filepath.Base(path)
	switch {
	case base == "u.data" || strings.HasPrefix(base, "u") && strings.HasSuffix(base, ".base") || strings.HasSuffix(base, ".test") && strings.HasPrefix(base, "u"):
		return FormatUData, nil
	case strings.HasSuffix(base, ".dat"):
		return FormatDat, nil
	case strings.HasSuffix(base, ".csv"):
		return FormatCSV, nil
	case strings.HasSuffix(base, ".rating"):
		return FormatNCF, nil
	}
	return 0, fmt.Errorf("data: %s: cannot tell the ratings format from the name (want u.data, ratings.dat, ratings.csv or *.rating); pass the format explicitly", path)
}

// Rating is one explicit rating.
type Rating struct {
	User, Item int32 // ids as in the file
	Rating     float32
	Time       int64 // Unix seconds
}

// ReadRatings reads a ratings file; FormatAuto picks the format from the name.
func ReadRatings(path string, format RatingFormat) ([]Rating, error) {
	if format == FormatAuto {
		var err error
		if format, err = FormatOf(path); err != nil {
			return nil, err
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	hint := 0
	if st, err := f.Stat(); err == nil {
		// The shortest real lines (ml-100k) are about 20 bytes long.
		hint = int(min(st.Size()/20, 1<<28))
	}
	return parseRatings(f, path, format, hint)
}

// ParseRatings parses ratings in the given format from r; name is used in
// errors. Blank lines are skipped; a malformed line, an id out of range
// (below 1, or below 0 for FormatNCF, or above 2^31-1), a rating outside
// [0, 5] or a negative timestamp is an error naming the line.
func ParseRatings(r io.Reader, name string, format RatingFormat) ([]Rating, error) {
	return parseRatings(r, name, format, 0)
}

// parseRatings is ParseRatings with a capacity hint for the result.
func parseRatings(r io.Reader, name string, format RatingFormat, hint int) ([]Rating, error) {
	if format < FormatUData || format > FormatNCF {
		return nil, fmt.Errorf("data: %s: unknown ratings format %v", name, format)
	}
	minID := int64(1)
	if format == FormatNCF {
		minID = 0
	}
	sep := format.sep()
	out := make([]Rating, 0, hint)
	var fields [4][]byte
	err := eachLine(r, name, func(line int, b []byte) error {
		if len(bytes.TrimSpace(b)) == 0 {
			return nil
		}
		if format == FormatCSV && len(out) == 0 && bytes.HasPrefix(b, []byte("userId")) {
			if string(bytes.TrimSpace(b)) != "userId,movieId,rating,timestamp" {
				return fmt.Errorf("header %q, want userId,movieId,rating,timestamp", b)
			}
			return nil
		}
		n := splitN(b, sep, fields[:])
		if n != 4 {
			return fmt.Errorf("%d fields, want 4 (%s)", n, format.layout())
		}
		var rt Rating
		for k, lim := range [2]*int32{&rt.User, &rt.Item} {
			v, ok := atoi(fields[k])
			if !ok {
				return fmt.Errorf("%s %q is not an integer (%s)", [2]string{"user id", "item id"}[k], fields[k], format.layout())
			}
			if v < minID || v > math.MaxInt32 {
				return fmt.Errorf("%s %d out of range (want %d..%d)", [2]string{"user id", "item id"}[k], v, minID, math.MaxInt32)
			}
			*lim = int32(v)
		}
		if f := fields[2]; len(f) == 1 && f[0] >= '0' && f[0] <= '5' {
			rt.Rating = float32(f[0] - '0') // the common case, without strconv
		} else {
			v, err := strconv.ParseFloat(string(f), 32)
			if err != nil || math.IsNaN(v) || v < 0 || v > 5 {
				return fmt.Errorf("rating %q, want a number in [0, 5]", f)
			}
			rt.Rating = float32(v)
		}
		t, ok := atoi(fields[3])
		if !ok || t < 0 {
			return fmt.Errorf("timestamp %q, want a non-negative integer (Unix seconds)", fields[3])
		}
		rt.Time = t
		out = append(out, rt)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("data: %s: no ratings (want lines of %s)", name, format.layout())
	}
	return out, nil
}

// splitN splits b (without its line ending) at sep into dst and returns the
// number of fields (which may exceed len(dst); extra fields are not stored).
func splitN(b, sep []byte, dst [][]byte) int {
	n := 0
	for {
		i := bytes.Index(b, sep)
		f := b
		if i >= 0 {
			f = b[:i]
		}
		if n < len(dst) {
			dst[n] = bytes.TrimSpace(f)
		}
		n++
		if i < 0 {
			return n
		}
		b = b[i+len(sep):]
	}
}

// eachLine calls fn for each line of r without its line ending (\n or \r\n).
// Errors are wrapped with the file name and line number. A NUL byte or a line
// over 1 MiB is an error: the input is not a text file of the expected kind.
func eachLine(r io.Reader, name string, fn func(line int, b []byte) error) error {
	br := bufio.NewReaderSize(r, 256<<10)
	line := 0
	var long []byte
	for {
		b, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long[:0], b...)
			for errors.Is(err, bufio.ErrBufferFull) {
				b, err = br.ReadSlice('\n')
				long = append(long, b...)
				if len(long) > maxLineBytes {
					return fmt.Errorf("data: %s: line %d is longer than %d bytes: not a text file of the expected format", name, line+1, maxLineBytes)
				}
			}
			b = long
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("data: %s: line %d: %w", name, line+1, err)
		}
		if len(b) == 0 && errors.Is(err, io.EOF) {
			return nil
		}
		line++
		if bytes.IndexByte(b, 0) >= 0 {
			return fmt.Errorf("data: %s: line %d contains a NUL byte: a binary file, not text", name, line)
		}
		b = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
		if ferr := fn(line, b); ferr != nil {
			return fmt.Errorf("data: %s: line %d: %w", name, line, ferr)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
	}
}

// atoi parses an optionally signed decimal integer of at most 18 digits
// without allocating.
func atoi(b []byte) (int64, bool) {
	neg := false
	if len(b) > 0 && (b[0] == '-' || b[0] == '+') {
		neg = b[0] == '-'
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}
