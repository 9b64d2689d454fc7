package data

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

type entry struct {
	name string
	body string // "" with a trailing "/" in name: a folder
}

func makeTarGz(t testing.TB, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg}
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func makeZip(t testing.TB, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range entries {
		w, err := zw.Create(e.name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sums(b []byte) (sha, md string) {
	s, m := sha256.Sum256(b), md5.Sum(b)
	return hex.EncodeToString(s[:]), hex.EncodeToString(m[:])
}

// archiveServer serves the given archives by path, plus failure modes.
func archiveServer(t *testing.T, files map[string][]byte) (*httptest.Server, *atomic.Int32) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		switch r.URL.Path {
		case "/error":
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		case "/truncated":
			b := files["/ok.tar.gz"]
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
			w.Write(b[:len(b)/2])
			return // the server closes the connection: the client sees a short body
		case "/stall":
			w.Header().Set("Content-Length", "1000")
			w.Write([]byte("x"))
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
			return
		}
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func quiet() DownloadOptions {
	return DownloadOptions{Progress: io.Discard, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// noLeftovers checks that dir holds exactly the given names.
func noLeftovers(t *testing.T, dir string, want ...string) {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("%s holds %v, want %v", dir, got, want)
	}
}

func TestDownload(t *testing.T) {
	tgz := makeTarGz(t, []entry{{"cifar-10-batches-bin/", ""}, {"cifar-10-batches-bin/data_batch_1.bin", "pixels"}, {"cifar-10-batches-bin/batches.meta.txt", "airplane\n"}})
	zp := makeZip(t, []entry{{"ml-100k/u.data", "1\t2\t3\t4\n"}, {"ml-100k/sub/u.item", "x"}})
	evil := makeZip(t, []entry{{"ml-100k/u.data", "1"}, {"ml-100k/../../evil.txt", "pwned"}})
	abs := makeTarGz(t, []entry{{"/etc/evil", "pwned"}})
	files := map[string][]byte{"/ok.tar.gz": tgz, "/ok.zip": zp, "/evil.zip": evil, "/abs.tar.gz": abs, "/garbage.zip": []byte("not a zip at all")}
	srv, hits := archiveServer(t, files)
	tgzSHA, tgzMD5 := sums(tgz)
	zipSHA, zipMD5 := sums(zp)
	ctx := context.Background()

	t.Run("tar.gz with SHA-256", func(t *testing.T) {
		dir := t.TempDir()
		src := Source{Name: "c", URL: srv.URL + "/ok.tar.gz", SHA256: tgzSHA, Archive: "tar.gz", Dir: "cifar-10-batches-bin",
			Files: map[string]string{"data_batch_1.bin": mustSHA([]byte("pixels"))}}
		var progress bytes.Buffer
		opt := quiet()
		opt.Progress = &progress
		if err := DownloadSource(ctx, src, dir, opt); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "cifar-10-batches-bin", "data_batch_1.bin"))
		if err != nil || string(b) != "pixels" {
			t.Fatalf("extracted file: %q %v", b, err)
		}
		noLeftovers(t, dir, "cifar-10-batches-bin")
		if !strings.Contains(progress.String(), "c") {
			t.Errorf("no progress bar output: %q", progress.String())
		}
		// Present already: no request.
		before := hits.Load()
		if err := DownloadSource(ctx, src, dir, quiet()); err != nil || hits.Load() != before {
			t.Fatalf("second download: %v, %d requests", err, hits.Load()-before)
		}
	})
	t.Run("zip with MD5 and a mirror URL", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "new", "data")
		src := Source{Name: "ml", URL: "http://127.0.0.1:1/unused", MD5: zipMD5, Archive: "zip", Dir: "ml-100k"}
		opt := quiet()
		opt.URL = srv.URL + "/ok.zip"
		if err := DownloadSource(ctx, src, dir, opt); err != nil {
			t.Fatal(err)
		}
		rs, err := ReadRatings(filepath.Join(dir, "ml-100k", "u.data"), FormatAuto)
		if err != nil || len(rs) != 1 {
			t.Fatalf("%v %v", rs, err)
		}
		noLeftovers(t, dir, "ml-100k")
	})
	failures := []struct {
		name string
		src  Source
		opt  func(*DownloadOptions)
		want string
	}{
		{"wrong SHA-256", Source{URL: "/ok.zip", SHA256: tgzSHA, Archive: "zip", Dir: "ml-100k"}, nil, "SHA-256 " + zipSHA},
		{"wrong MD5", Source{URL: "/ok.tar.gz", SHA256: tgzSHA, MD5: zipMD5, Archive: "tar.gz", Dir: "cifar-10-batches-bin"}, nil, "MD5 " + tgzMD5},
		{"server error", Source{URL: "/error", MD5: zipMD5, Archive: "zip", Dir: "ml-100k"}, nil, "500 Internal Server Error"},
		{"not found", Source{URL: "/nothing.zip", MD5: zipMD5, Archive: "zip", Dir: "ml-100k"}, nil, "404 Not Found"},
		{"truncated body", Source{URL: "/truncated", SHA256: tgzSHA, Archive: "tar.gz", Dir: "cifar-10-batches-bin"}, nil, "unexpected EOF"},
		{"stalled body", Source{URL: "/stall", SHA256: tgzSHA, Archive: "tar.gz", Dir: "cifar-10-batches-bin"},
			func(o *DownloadOptions) { o.StallTimeout = 200 * time.Millisecond }, "no data received for 200ms"},
		{"path traversal", Source{URL: "/evil.zip", SHA256: mustSHA(evil), Archive: "zip", Dir: "ml-100k"}, nil, "unsafe entry name"},
		{"absolute path", Source{URL: "/abs.tar.gz", SHA256: mustSHA(abs), Archive: "tar.gz", Dir: "x"}, nil, "unsafe entry name"},
		{"wrong folder", Source{URL: "/ok.zip", SHA256: zipSHA, Archive: "zip", Dir: "ml-1m"}, nil, "has no folder ml-1m/"},
		{"not a zip", Source{URL: "/garbage.zip", SHA256: mustSHA(files["/garbage.zip"]), Archive: "zip", Dir: "ml-1m"}, nil, "not a zip file"},
		{"tar.gz is a zip", Source{URL: "/ok.zip", SHA256: zipSHA, Archive: "tar.gz", Dir: "ml-100k"}, nil, "not a gzip file"},
		{"extraction limit", Source{URL: "/ok.zip", SHA256: zipSHA, Archive: "zip", Dir: "ml-100k"},
			func(o *DownloadOptions) { o.MaxExtract = 3 }, "extraction limit"},
		{"extracted file differs", Source{URL: "/ok.tar.gz", MD5: tgzMD5, Archive: "tar.gz", Dir: "cifar-10-batches-bin",
			Files: map[string]string{"batches.meta.txt": mustSHA([]byte("airplane\n")), "data_batch_1.bin": mustSHA([]byte("pixelz"))}}, nil, "not the official file"},
		{"extracted file missing", Source{URL: "/ok.tar.gz", MD5: tgzMD5, Archive: "tar.gz", Dir: "cifar-10-batches-bin",
			Files: map[string]string{"data_batch_2.bin": mustSHA([]byte("pixels"))}}, nil, "data_batch_2.bin: no such file"},
		{"no checksum", Source{URL: "/ok.zip", Archive: "zip", Dir: "ml-100k"}, nil, "no checksum known"},
		{"bad folder name", Source{URL: "/ok.zip", MD5: zipMD5, Archive: "zip", Dir: "../x"}, nil, "bad target folder"},
	}
	for _, c := range failures {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "data")
			c.src.Name = "set"
			c.src.URL = srv.URL + c.src.URL
			opt := quiet()
			if c.opt != nil {
				c.opt(&opt)
			}
			start := time.Now()
			err := DownloadSource(ctx, c.src, dir, opt)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			if time.Since(start) > 5*time.Second {
				t.Errorf("took %v", time.Since(start))
			}
			// Nothing is left where a reader would look, nor outside.
			if _, err := os.Stat(filepath.Join(dir, c.src.Dir)); err == nil {
				t.Errorf("%s exists after a failed download", c.src.Dir)
			}
			if es, _ := os.ReadDir(dir); len(es) != 0 {
				t.Errorf("left in %s: %v", dir, es)
			}
			noLeftovers(t, root, dirIf(dir))
		})
	}
	t.Run("cancelled context", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		go func() { time.Sleep(100 * time.Millisecond); cancel() }()
		dir := t.TempDir()
		err := DownloadSource(cctx, Source{Name: "s", URL: srv.URL + "/stall", MD5: zipMD5, Archive: "zip", Dir: "ml-100k"}, dir, quiet())
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%v, want context.Canceled", err)
		}
		noLeftovers(t, dir)
	})
}

func dirIf(dir string) string {
	if _, err := os.Stat(dir); err == nil {
		return filepath.Base(dir)
	}
	return ""
}

func mustSHA(b []byte) string { s, _ := sums(b); return s }

func TestSourcesTable(t *testing.T) {
	names := map[string]bool{}
	for _, s := range Sources() {
		if names[s.Name] {
			t.Errorf("duplicate source %s", s.Name)
		}
		names[s.Name] = true
		if s.SHA256 == "" && s.MD5 == "" {
			t.Errorf("%s has no checksum", s.Name)
		}
		if s.MD5 != "" && len(s.MD5) != 32 || s.SHA256 != "" && len(s.SHA256) != 64 {
			t.Errorf("%s: malformed checksum", s.Name)
		}
		if !strings.HasPrefix(s.URL, "https://") || s.Dir == "" || (s.Archive != "zip" && s.Archive != "tar.gz") {
			t.Errorf("%s: incomplete entry %+v", s.Name, s)
		}
	}
	for _, n := range []string{"cifar10", "cifar100", "wikitext2", "ml-100k", "ml-1m", "ml-20m"} {
		if _, err := LookupSource(n); err != nil {
			t.Error(err)
		}
	}
	if _, err := LookupSource("imagenet"); err == nil || !strings.Contains(err.Error(), "cifar10") {
		t.Errorf("unknown source: %v", err)
	}
	if err := Download(context.Background(), "imagenet", t.TempDir()); err == nil {
		t.Error("Download(imagenet): no error")
	}
}

func TestSourcesFilesMatchRealCopies(t *testing.T) {
	needReal(t, "")
	if testing.Short() {
		t.Skip("hashes 170 MB; skipped with -short")
	}
	renamed := map[string]string{"wiki.train.tokens": "train.txt", "wiki.valid.tokens": "valid.txt", "wiki.test.tokens": "test.txt"}
	checked := 0
	for _, s := range Sources() {
		dir := filepath.Join(realData, s.Dir)
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		files := map[string]string{}
		for n, sum := range s.Files {
			if r, ok := renamed[n]; ok {
				n = r // the shared copy uses other names
			}
			files[n] = sum
		}
		if err := VerifyFiles(dir, files); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
		checked += len(files)
	}
	if checked != 9 {
		t.Errorf("checked %d files, want 9", checked)
	}
}
