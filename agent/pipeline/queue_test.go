package pipeline

import (
	"testing"

	"github.com/slowrank/slowrank/correlate"
)

func filled(q *Queue, n int) []Input {
	b := q.Get()
	for i := range n {
		b = append(b, HostInput(correlate.HostCall{PID: uint32(i)}))
	}
	return b
}

func TestQueueIsBoundedInRecordsAndNeverBlocks(t *testing.T) {
	tests := []struct {
		name    string
		limit   int
		batches []int // sizes offered in turn
		want    []bool
		queued  int64
	}{
		{"within the bound", 2 * Batch, []int{Batch, Batch}, []bool{true, true}, 2 * Batch},
		{"a batch over the bound is refused whole", Batch + 10, []int{Batch, 20}, []bool{true, false}, Batch},
		{"small batches count their records", 30, []int{10, 10, 10, 1}, []bool{true, true, true, false}, 30},
		{"an empty batch is no hand-over", 1, []int{0, 0}, []bool{true, true}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := NewQueue(tt.limit)
			for i, n := range tt.batches {
				next, ok := q.Offer(filled(q, n))
				if ok != tt.want[i] {
					t.Fatalf("offer %d of %d records: ok %v, want %v", i, n, ok, tt.want[i])
				}
				if len(next) != 0 || cap(next) < Batch/4 {
					t.Fatalf("offer %d: next batch len %d cap %d, want an empty one to fill", i, len(next), cap(next))
				}
			}
			if q.Len() != tt.queued {
				t.Fatalf("Len %d, want %d", q.Len(), tt.queued)
			}
			for q.Len() > 0 {
				q.Done(<-q.C())
			}
		})
	}
}

// A small batch travels as a copy of its size and the reader keeps filling
// its own buffer; a full one travels as it is and the reader gets another.
func TestQueueCopiesSmallBatchesAndHandsOverFullOnes(t *testing.T) {
	q := NewQueue(1 << 16)
	small := filled(q, 3)
	next, _ := q.Offer(small)
	if got := <-q.C(); len(got) != 3 || cap(got) != 3 || &next[:1][0] != &small[:1][0] {
		t.Fatalf("small batch: sent cap %d, reader kept its buffer %v", cap(got), &next[:1][0] == &small[:1][0])
	}
	full := filled(q, Batch)
	next, _ = q.Offer(full)
	got := <-q.C()
	if &got[0] != &full[0] || &next[:1][0] == &full[0] {
		t.Fatal("full batch: not handed over as it is, or the reader still fills it")
	}
	q.Done(got)
	if recycled := q.Get(); cap(recycled) != Batch || recycled[:1][0].kind != inputOther || &recycled[:1][0] != &full[0] {
		t.Fatalf("the batch given back was not recycled cleared")
	}
}

func TestBatchPoolRecyclesOnlyFullSizeBatches(t *testing.T) {
	pool := make(batchPool, 16)
	b := pool.get()
	b = append(b, OtherInput(correlate.CommInit{PID: 1}))
	pool.put(b)
	if got := pool.get(); cap(got) != Batch || len(got) != 0 || got[:1][0].other != nil {
		t.Fatalf("recycled batch len %d cap %d, first %+v: want empty and cleared", len(got), cap(got), got[:1][0])
	}
	pool.put(make([]Input, 3, 10)) // a copy of a small batch: left to the GC
	if len(pool) != 0 {
		t.Fatalf("pool took a batch of capacity 10")
	}
}
