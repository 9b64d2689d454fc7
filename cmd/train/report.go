package main

import "github.com/sparsegrad/sparsegrad/reports"

// writeReport writes runDir/report.html.
func writeReport(runDir string) error { return reports.WriteRun(runDir) }

// compareReports writes one HTML file comparing runs.
func compareReports(out string, runDirs []string) error { return reports.Compare(out, runDirs) }
