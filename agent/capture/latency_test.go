package capture

import (
	"testing"

	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/cupti"
)

func TestDeviceLatencyFromBatches(t *testing.T) {
	c := newConverter(newCounters(), false)
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
		c.Convert(ev, nil)
	}
	p50, p99, ok := c.LatencyQuantiles()
	if !ok || p50 != 1_000_000 || p99 != 2_000_000 {
		t.Fatalf("quantiles = %d, %d, %v; want 1 ms and 2 ms", p50, p99, ok)
	}
}

// Device record times come from the training process: those after their
// batch's emission (the kernel's clock) or long before it are dropped and
// counted, never handed to the pipeline.
func TestImplausibleDeviceTimesAreDropped(t *testing.T) {
	const emit = uint64(10 * 3600 * 1e9) // ten hours of uptime
	for _, tc := range []struct {
		name       string
		start, end uint64
		kept       bool
	}{
		{"ended 1 ms before emission", emit - 2e6, emit - 1e6, true},
		{"ended within the clock-mapping lead", emit, emit + 5e8, true},
		{"ends in the far future", emit, 1 << 62, false},
		{"ends past int64", emit, 1 << 63, false},
		{"starts two hours before emission", emit - 2*3600*1e9, emit - 1e6, false},
		{"ends before it starts", emit - 1e6, emit - 2e6, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := newCounters()
			c := newConverter(cs, false)
			b := &cupti.Batch{Header: cupti.Header{Version: 1, Seq: 1},
				Kernels: []cupti.Kernel{{StartNs: tc.start, EndNs: tc.end}},
				Copies:  []cupti.Copy{{StartNs: tc.start, EndNs: tc.end}}}
			data, err := cupti.EncodeBatch(b)
			if err != nil {
				t.Fatal(err)
			}
			out := c.Convert(&bpf.BatchEvent{Header: bpf.Header{Type: bpf.EventBatch, PID: 7, StartNs: emit, EndNs: emit}, Data: data}, nil)
			devices := 0
			for _, in := range out {
				if _, ok := in.Device(); ok {
					devices++
				}
			}
			if want := map[bool]int{true: 2, false: 0}[tc.kept]; devices != want || cs.get("device_records_implausible") != int64(2-want) {
				t.Errorf("%d device intervals, %d implausible; want %d kept", devices, cs.get("device_records_implausible"), want)
			}
		})
	}
}
