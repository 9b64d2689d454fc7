package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/sparsegrad/sparsegrad/internal/atomicfile"
	"github.com/sparsegrad/sparsegrad/reports"
)

// reportAssets is the -report-assets flag of train and train report: where
// report pages load ECharts from (empty: inline the pinned, checksum-verified
// copy, so pages work offline).
var reportAssets string

// reportTarget is train report's -target flag.
var reportTarget float64

func addReportAssetsFlag(fs *flag.FlagSet) {
	fs.StringVar(&reportAssets, "report-assets", "", "URL of echarts.min.js for report pages, e.g. a CDN (default: inline the pinned copy, fetched once with npm or from $SPARSEGRAD_ECHARTS; pages then work offline)")
}

// writeReport writes runDir/report.html.
func writeReport(runDir string) error {
	return reports.WriteRunWith(context.Background(), runDir, reports.Options{AssetsURL: reportAssets})
}

// runPage writes the page of the run in runDir to out.
func runPage(out, runDir string) error {
	r, err := reports.ReadRun(runDir)
	if err != nil {
		return err
	}
	b, err := reports.RunPage(context.Background(), r, reports.Options{AssetsURL: reportAssets})
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(out, b); err != nil {
		return fmt.Errorf("train report: %w", err)
	}
	return nil
}
