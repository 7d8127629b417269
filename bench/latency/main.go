// Command latency is the measuring side of bench/latency/run.sh (end-to-end
// latency, issue 18 item 4) and bench/volume/run.sh (export volume, item 6).
// It is a benchmark tool, never part of the agent:
//
//	latency probe --listen 127.0.0.1:P --upstream http://127.0.0.1:Q [--logs-upstream URL]
//	        [--jaeger http://127.0.0.1:J] [--prom http://127.0.0.1:M/metrics] --ranks 4 --out probe.jsonl
//	latency summarize --raw DIR --out latency.json      (after run.sh)
//	latency volume --raw DIR --out volume.json          (after bench/volume/run.sh)
//
// probe is an OTLP/HTTP recording proxy between the agent and the
// collector: it forwards every request unchanged, counts its body bytes per
// signal, decodes it (spans per job and step with their end times,
// slowrank.straggler gauge points of 1, forwarded fact records) and writes one
// JSON line per request. With --jaeger it polls Jaeger's HTTP API for the
// traces the proxy saw until each has every rank's train.step span; with
// --prom it scrapes the collector's Prometheus endpoint for the first
// slowrank_straggler sample of 1 of each (job, rank, phase). On SIGTERM or
// SIGINT it writes a totals line (bytes by span name, attribute key, metric
// name) and exits. Every address must be loopback.
//
// summarize and volume are pure: they read the probe's lines, the agent's
// log and the fake trainer's truth files (CLOCK_MONOTONIC, mapped to wall
// time by the probe's clock lines) and write the figures.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: latency probe|summarize|volume [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "probe":
		err = probeMain(os.Args[2:])
	case "summarize":
		err = summarizeMain(os.Args[2:])
	case "volume":
		err = volumeMain(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want probe, summarize or volume", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "latency:", err)
		os.Exit(1)
	}
}
