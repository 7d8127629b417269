package agent

import (
	"testing"

	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/cupti"
)

func TestDeviceLatencyFromBatches(t *testing.T) {
	c := newConverter(newCounters())
	for i := 0; i < 100; i++ {
		b := &cupti.Batch{Header: cupti.Header{Version: 1, Seq: uint64(i + 1)},
			Kernels: []cupti.Kernel{{StartNs: 1_000, EndNs: 2_000}, {StartNs: 1_500, EndNs: 5_000}}}
		data, err := cupti.EncodeBatch(b)
		if err != nil {
			t.Fatal(err)
		}
		// Emitted 1 ms after the newest kernel ended, 2 ms for the last one.
		lat := uint64(1_000_000)
		if i == 99 {
			lat = 2_000_000
		}
		ev := &bpf.BatchEvent{Header: bpf.Header{Type: bpf.EventBatch, PID: 7, StartNs: 5_000 + lat, EndNs: 5_000 + lat}, Data: data}
		c.convert(ev, nil)
	}
	p50, p99, ok := c.latencyQuantiles()
	if !ok || p50 != 1_000_000 || p99 != 2_000_000 {
		t.Fatalf("quantiles = %d, %d, %v; want 1 ms and 2 ms", p50, p99, ok)
	}
}
