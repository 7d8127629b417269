package cupti

import (
	"reflect"
	"testing"
)

func sampleNCCL() *Batch {
	return &Batch{
		Header: Header{PID: 5, Seq: 1},
		NCCLComms: []NCCLComm{
			{Version: 5, ID: 3, Hash: 0xabcdef, Rank: 1, NRanks: 8, NNodes: 1, InitNs: 10},
			{Version: 5, Finalized: true, ID: 3, Hash: 0xabcdef, Rank: 1, NRanks: 8, NNodes: 1, InitNs: 10, FinalizeNs: 99},
		},
		NCCLColls: []NCCLColl{
			{Func: NCCLFuncAllReduce, Datatype: 10, Algo: 2, Proto: 3, CommHash: 0xabcdef, Rank: 1, NRanks: 8, Seq: 41,
				Count: 1 << 20, Root: -1, NChannels: 4, Version: 5, HasAPI: true, APIStartNs: 100, APIEndNs: 110,
				LaunchStartNs: 120, LaunchEndNs: 130, TID: 77, CommID: 3},
			{Func: NCCLFuncSend, Datatype: 1, CommHash: 0xabcdef, Rank: 1, NRanks: 8, Count: 77, Root: 2, P2P: true,
				Graph: true, Version: 4, LaunchStartNs: 200, LaunchEndNs: 210},
			{Func: NCCLFuncAllGather, Datatype: 8, CommHash: 0xabcdef, Rank: 1, NRanks: 8, Seq: 6, Count: 512, Root: -1,
				Version: 6, CE: true, HasAPI: true, APIStartNs: 300, APIEndNs: 305, LaunchStartNs: 310, LaunchEndNs: 330},
		},
		NCCLKernels: []NCCLKernel{
			{Func: NCCLFuncAllReduce, Channels: 4, NChannels: 4, CommHash: 0xabcdef, Seq: 41, Rank: 1, CommID: 3,
				GPUStartNs: 140, GPUEndNs: 190, HostSeenNs: 195, ClockOffsetNs: -1700000000000000000},
			{Func: NCCLFuncRecv, P2P: true, Partial: true, ClockSuspect: true, Channels: 1, NChannels: 2},
		},
	}
}

func TestNCCLRoundTrip(t *testing.T) {
	in := sampleNCCL()
	raw := mustEncode(t, in)
	got, err := DecodeBatch(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := *in
	want.Header.Version = ABIVersion
	want.Header.Count = 7
	want.Header.Len = uint32(len(raw))
	if !reflect.DeepEqual(normalize(got), normalize(want)) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, want)
	}
	if b := got.NCCLColls[0].Bytes(); b != 2<<20 {
		t.Errorf("bytes %d", b)
	}
}

func TestNCCLRecordSizes(t *testing.T) {
	for _, kind := range []uint16{recNCCLComm, recNCCLColl, recNCCLKernel} {
		if _, err := DecodeBatch(rawBatch(record(kind, minSize(kind)-8))); err == nil {
			t.Errorf("kind %d: short record accepted", kind)
		}
		grown := record(kind, minSize(kind)+16) // a newer library appended fields
		if b, err := DecodeBatch(rawBatch(grown)); err != nil || b.Skipped != 0 {
			t.Errorf("kind %d: grown record: %v %+v", kind, err, b)
		}
	}
}

// TestNCCLPluginBatches decodes batches that the real library emitted as
// NCCL's profiler plugin, driven by the fake NCCL (cupti/test_nccl.c, v5
// scenario, saved with TEST_NCCL_SAVE): 4 comms on 4 threads, GPU times
// from a proxy thread. The C test checked them record by record; the Go
// decoder must agree.
func TestNCCLPluginBatches(t *testing.T) {
	raws := readBatches(t, "testdata/nccl-plugin.batches")
	var colls, kernels, comms int
	joined := map[[4]uint64]bool{}
	var last Stats
	for i, raw := range raws {
		b, err := DecodeBatch(raw)
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		if b.Skipped != 0 {
			t.Fatalf("batch %d: %d unknown records", i, b.Skipped)
		}
		for _, c := range b.NCCLColls {
			if c.Version != 5 || !c.HasAPI || c.APIEndNs < c.APIStartNs || c.LaunchStartNs < c.APIEndNs ||
				c.LaunchEndNs < c.LaunchStartNs || c.NRanks != 8 {
				t.Fatalf("coll %+v", c)
			}
			if !c.P2P {
				joined[[4]uint64{c.CommHash, uint64(c.Rank), uint64(c.Func), c.Seq}] = true
			}
			colls++
		}
		for _, k := range b.NCCLKernels {
			if k.Partial || k.ClockSuspect || k.GPUEndNs < k.GPUStartNs || k.GPUEndNs > k.HostSeenNs+1e6 {
				t.Fatalf("kernel %+v", k)
			}
			if !k.P2P && !joined[[4]uint64{k.CommHash, uint64(k.Rank), uint64(k.Func), k.Seq}] {
				t.Fatalf("kernel %+v before (or without) its collective", k)
			}
			kernels++
		}
		comms += len(b.NCCLComms)
		if len(b.Stats) > 0 {
			last = b.Stats[len(b.Stats)-1]
		}
	}
	if colls == 0 || kernels != colls || comms != 12 {
		t.Errorf("%d colls, %d kernels, %d comm records", colls, kernels, comms)
	}
	if last.Get(StatNCCLColls) != uint64(colls) || last.Get(StatNCCLRingFull) != 0 || last.Get(StatNCCLComms) != 4 {
		t.Errorf("final stats %v", last.Counters[StatNCCLEvents:])
	}
}
