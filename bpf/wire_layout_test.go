package bpf

import (
	"testing"
	"unsafe"
)

// The decoder reads records at the offsets of the generated mirrors of
// events.h (wire_gen.go, from bpf2go's); these pin them to the ABI: the
// offsets in events.h's comments and its _Static_assert sizes. A layout
// change must be deliberate (and bump SLOWRANK_EVENTS_VERSION).
func TestLayout(t *testing.T) {
	type field struct {
		name      string
		got, want uintptr
	}
	var (
		h  wireEventHdr
		c  wireCollEvent
		ci wireCommInitEvent
		s  wireSyncEvent
		g  wireGroupEvent
		to wireTorchEvent
		cc wireCuptiCallEvent
		b  wireBatchEvent
	)
	checks := []field{
		{"sizeof(sr_event_hdr)", unsafe.Sizeof(h), 32},
		{"hdr.type", unsafe.Offsetof(h.Type), 0},
		{"hdr.probe_id", unsafe.Offsetof(h.ProbeId), 4},
		{"hdr.pid", unsafe.Offsetof(h.Pid), 8},
		{"hdr.tid", unsafe.Offsetof(h.Tid), 12},
		{"hdr.start_ns", unsafe.Offsetof(h.StartNs), 16},
		{"hdr.end_ns", unsafe.Offsetof(h.EndNs), 24},

		{"sizeof(sr_coll_event)", unsafe.Sizeof(c), 72},
		{"coll.count", unsafe.Offsetof(c.Count), 32},
		{"coll.comm", unsafe.Offsetof(c.Comm), 40},
		{"coll.stream", unsafe.Offsetof(c.Stream), 48},
		{"coll.datatype", unsafe.Offsetof(c.Datatype), 56},
		{"coll.redop", unsafe.Offsetof(c.Redop), 60},
		{"coll.peer", unsafe.Offsetof(c.Peer), 64},
		{"coll.ret", unsafe.Offsetof(c.Ret), 68},

		{"sizeof(sr_comm_init_event)", unsafe.Sizeof(ci), 88},
		{"comm_init.id_hash", unsafe.Offsetof(ci.IdHash), 32},
		{"comm_init.comm", unsafe.Offsetof(ci.Comm), 40},
		{"comm_init.parent_comm", unsafe.Offsetof(ci.ParentComm), 48},
		{"comm_init.nranks", unsafe.Offsetof(ci.Nranks), 56},
		{"comm_init.rank", unsafe.Offsetof(ci.Rank), 60},
		{"comm_init.color", unsafe.Offsetof(ci.Color), 64},
		{"comm_init.key", unsafe.Offsetof(ci.Key), 68},
		{"comm_init.ret", unsafe.Offsetof(ci.Ret), 72},
		{"comm_init.flags", unsafe.Offsetof(ci.Flags), 76},
		{"comm_init.n_ids", unsafe.Offsetof(ci.N_ids), 80},

		{"sizeof(sr_sync_event)", unsafe.Sizeof(s), 48},
		{"sync.handle", unsafe.Offsetof(s.Handle), 32},
		{"sync.ret", unsafe.Offsetof(s.Ret), 40},

		{"sizeof(sr_group_event)", unsafe.Sizeof(g), 40},
		{"group.ret", unsafe.Offsetof(g.Ret), 32},
		{"group.flags", unsafe.Offsetof(g.Flags), 36},

		{"sizeof(sr_torch_event)", unsafe.Sizeof(to), 48},
		{"torch.arg0", unsafe.Offsetof(to.Arg0), 32},
		{"torch.arg1", unsafe.Offsetof(to.Arg1), 40},

		{"sizeof(sr_cupti_call_event)", unsafe.Sizeof(cc), 48},
		{"cupti_call.arg", unsafe.Offsetof(cc.Arg), 32},
		{"cupti_call.arg2", unsafe.Offsetof(cc.Arg2), 40},

		{"sizeof(sr_batch_event)", unsafe.Sizeof(b), 40 + 16384},
		{"batch.len", unsafe.Offsetof(b.Len), 32},
		{"batch.data", unsafe.Offsetof(b.Data), 40},
	}
	for _, f := range checks {
		if f.got != f.want {
			t.Errorf("%s = %d, want %d", f.name, f.got, f.want)
		}
	}
}
