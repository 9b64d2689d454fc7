package reports

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/atomicfile"
)

// The ECharts script the pages embed: dist/echarts.min.js of the npm
// package echarts at EChartsVersion (Apache-2.0; its licence header stays in
// the script). The file is never part of the repository: ECharts obtains it
// once and keeps it in the user's cache directory.
const (
	// EChartsVersion is the pinned version of the npm package echarts.
	EChartsVersion = "5.6.0"
	// EChartsSHA256 is the SHA-256 of its dist/echarts.min.js.
	EChartsSHA256 = "bf4a223524e40b77c304bec67e1222cf551f14880cf42c69dc046558e11c07b1"
	// EChartsTarballIntegrity is the npm registry's integrity string of the
	// package's tarball (https://registry.npmjs.org/echarts/-/echarts-5.6.0.tgz).
	EChartsTarballIntegrity = "sha512-oTbVTsXfKuEhxftHqL5xprgLoc0k7uScAwtryCgWF6hPYFLRwOUHiFmHGCBKP5NPFNkDVopOieyUqYGH8Fa3kA=="
	// EChartsEnv names an environment variable that may hold the path of a
	// copy of echarts.min.js (checked against EChartsSHA256), for machines
	// without npm.
	EChartsEnv = "SPARSEGRAD_ECHARTS"
)

// ErrNoECharts is wrapped by the error of ECharts when the script can be
// neither found nor fetched.
var ErrNoECharts = errors.New("the ECharts script is not available")

// echartsHint tells a user how to get the script.
var echartsHint = "fixes: install npm (it fetches echarts@" + EChartsVersion + " from the npm registry once, into the cache directory), " +
	"or download https://registry.npmjs.org/echarts/-/echarts-" + EChartsVersion + ".tgz, extract package/dist/echarts.min.js and set " + EChartsEnv + " to its path, " +
	"or let the page load the script from a URL (train -report-assets https://cdn.jsdelivr.net/npm/echarts@" + EChartsVersion + "/dist/echarts.min.js)"

var (
	echartsMu     sync.Mutex
	echartsScript []byte
	echartsErr    error
	echartsErrAt  time.Time
)

// ECharts returns the ECharts script, verified against EChartsSHA256: from
// the file EChartsEnv names, else from the cache (os.UserCacheDir()/
// sparsegrad/echarts-EChartsVersion.min.js), else fetched with `npm pack`
// from the npm registry into the cache. A failure is remembered for a
// minute, so that a report refreshed every epoch does not retry each time.
func ECharts(ctx context.Context) ([]byte, error) {
	echartsMu.Lock()
	defer echartsMu.Unlock()
	if echartsScript != nil {
		return echartsScript, nil
	}
	if echartsErr != nil && time.Since(echartsErrAt) < time.Minute {
		return nil, echartsErr
	}
	b, err := loadECharts(ctx)
	if err != nil {
		echartsErr, echartsErrAt = err, time.Now()
		return nil, err
	}
	echartsScript, echartsErr = b, nil
	return b, nil
}

func checkECharts(b []byte, from string) error {
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != EChartsSHA256 {
		return fmt.Errorf("reports: %s is not echarts.min.js of echarts %s (SHA-256 %s, want %s): %w; %s", from, EChartsVersion, got, EChartsSHA256, ErrNoECharts, echartsHint)
	}
	return nil
}

func echartsCachePath() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "sparsegrad", "echarts-"+EChartsVersion+".min.js"), nil
}

func loadECharts(ctx context.Context) ([]byte, error) {
	if p := os.Getenv(EChartsEnv); p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("reports: reading %s=%s: %w (%w); %s", EChartsEnv, p, err, ErrNoECharts, echartsHint)
		}
		if err := checkECharts(b, EChartsEnv+"="+p); err != nil {
			return nil, err
		}
		return b, nil
	}
	cache, cerr := echartsCachePath()
	if cerr == nil {
		if b, err := os.ReadFile(cache); err == nil && checkECharts(b, cache) == nil {
			return b, nil
		}
	}
	b, err := fetchECharts(ctx)
	if err != nil {
		return nil, err
	}
	if cerr == nil {
		if err := writeAtomic(cache, "caching the ECharts script", b); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// fetchECharts runs `npm pack echarts@EChartsVersion` in a temporary
// directory and extracts dist/echarts.min.js from the verified tarball.
func fetchECharts(ctx context.Context) ([]byte, error) {
	npm, err := exec.LookPath("npm")
	if err != nil {
		return nil, fmt.Errorf("reports: npm is not installed and %s is not set: %w; %s", EChartsEnv, ErrNoECharts, echartsHint)
	}
	tmp, err := os.MkdirTemp("", "sparsegrad-echarts-")
	if err != nil {
		return nil, fmt.Errorf("reports: %w", err)
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "pack", "--silent", "echarts@"+EChartsVersion)
	cmd.Dir = tmp
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("reports: npm pack echarts@%s: %w (%s): %w; %s", EChartsVersion, err, bytes.TrimSpace(stderr.Bytes()), ErrNoECharts, echartsHint)
	}
	tgz, err := os.ReadFile(filepath.Join(tmp, "echarts-"+EChartsVersion+".tgz"))
	if err != nil {
		return nil, fmt.Errorf("reports: npm pack wrote no tarball: %w", err)
	}
	return extractECharts(tgz)
}

// extractECharts checks the tarball against EChartsTarballIntegrity and
// returns its package/dist/echarts.min.js, checked against EChartsSHA256.
func extractECharts(tgz []byte) ([]byte, error) {
	sum := sha512.Sum512(tgz)
	if got := "sha512-" + base64.StdEncoding.EncodeToString(sum[:]); got != EChartsTarballIntegrity {
		return nil, fmt.Errorf("reports: the echarts %s tarball has integrity %s, want %s: %w", EChartsVersion, got, EChartsTarballIntegrity, ErrNoECharts)
	}
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return nil, fmt.Errorf("reports: echarts tarball: %w", err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("reports: the echarts tarball has no package/dist/echarts.min.js: %w", ErrNoECharts)
		}
		if err != nil {
			return nil, fmt.Errorf("reports: echarts tarball: %w", err)
		}
		if h.Name != "package/dist/echarts.min.js" {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, 16<<20))
		if err != nil {
			return nil, fmt.Errorf("reports: echarts tarball: %w", err)
		}
		if err := checkECharts(b, "package/dist/echarts.min.js of the tarball"); err != nil {
			return nil, err
		}
		return b, nil
	}
}

// writeAtomic writes b to path (replaced atomically), creating its folder;
// its error says what it was doing.
func writeAtomic(path, doing string, b []byte) error {
	err := os.MkdirAll(filepath.Dir(path), 0o755)
	if err == nil {
		err = atomicfile.WriteFile(path, b)
	}
	if err != nil {
		return fmt.Errorf("reports: %s: %w", doing, err)
	}
	return nil
}
