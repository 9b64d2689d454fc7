package main

import "errors"

// errNoReports is returned while the reports package is not part of the
// build.
var errNoReports = errors.New("HTML reports are not available in this build (package reports is missing); the run's metrics.jsonl and run.json are written regardless")

// writeReport writes runDir/report.html (reports.WriteRun).
func writeReport(runDir string) error { return errNoReports }

// compareReports writes one HTML file comparing runs (reports.Compare).
func compareReports(out string, runDirs []string) error { return errNoReports }
