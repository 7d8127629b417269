// Command metricsdoc writes docs/metrics.md (export.MetricsDoc) to the path
// it is given: go generate ./otel/export/ runs it.
package main

import (
	"fmt"
	"os"

	"github.com/slowrank/slowrank/otel/export"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: metricsdoc PATH")
		os.Exit(2)
	}
	if err := os.WriteFile(os.Args[1], []byte(export.MetricsDoc()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "metricsdoc:", err)
		os.Exit(1)
	}
}
