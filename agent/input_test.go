package agent

import (
	"testing"

	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/correlate"
)

// TestHostEventsDoNotAllocate: the reader goroutine's per-record path
// (convert into a recycled batch) allocates nothing for host calls, the
// records that come by the hundred thousand per second.
func TestHostEventsDoNotAllocate(t *testing.T) {
	conv := newConverter(newCounters(), false)
	pool := newBatchPool()
	coll := &bpf.CollEvent{Header: bpf.Header{Type: bpf.EventColl, Probe: bpf.ProbeNCCLAllReduce, PID: 7, StartNs: 1, EndNs: 2}, Count: 1024}
	sync := &bpf.SyncEvent{Header: bpf.Header{Type: bpf.EventSync, Probe: bpf.ProbeCUDAStreamSynchronize, PID: 7, StartNs: 3, EndNs: 4}}
	conv.convert(coll, nil) // the process's state exists from here on
	batch := pool.get()
	allocs := testing.AllocsPerRun(100, func() {
		for range inputBatch / 2 {
			batch = conv.convert(coll, batch)
			batch = conv.convert(sync, batch)
		}
		pool.put(batch)
		batch = pool.get()
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per %d host events", allocs, inputBatch)
	}
}

func TestInputKinds(t *testing.T) {
	h := correlate.HostCall{PID: 1, Op: "allreduce"}
	d := correlate.DeviceInterval{PID: 2, Name: "k"}
	o := correlate.CommInit{PID: 3}
	tests := []struct {
		in   input
		want any
	}{
		{hostInput(h), h},
		{deviceInput(d), d},
		{otherInput(o), o},
	}
	for _, tt := range tests {
		if got := tt.in.value(); got != tt.want {
			t.Errorf("value() = %#v, want %#v", got, tt.want)
		}
	}
}

func TestBatchPoolRecyclesOnlyFullSizeBatches(t *testing.T) {
	pool := newBatchPool()
	b := pool.get()
	b = append(b, otherInput(correlate.CommInit{PID: 1}))
	pool.put(b)
	if got := pool.get(); cap(got) != inputBatch || len(got) != 0 || got[:1][0].other != nil {
		t.Fatalf("recycled batch len %d cap %d, first %+v: want empty and cleared", len(got), cap(got), got[:1][0])
	}
	pool.put(make([]input, 3, 10)) // a copy of a small batch: left to the GC
	if len(pool) != 0 {
		t.Fatalf("pool took a batch of capacity 10")
	}
}
