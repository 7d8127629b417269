//go:build 386 || amd64

package bpf

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

func TestGeneratedEnums(t *testing.T) {
	types := map[slowrankSrEventType]EventType{
		slowrankSrEventTypeSR_EV_COLL:      EventColl,
		slowrankSrEventTypeSR_EV_COMM_INIT: EventCommInit,
		slowrankSrEventTypeSR_EV_SYNC:      EventSync,
		slowrankSrEventTypeSR_EV_GROUP:     EventGroup,
		slowrankSrEventTypeSR_EV_TORCH:     EventTorch,
		slowrankSrEventTypeSR_EV_BATCH:     EventBatch,
	}
	for c, g := range types {
		if uint32(c) != uint32(g) {
			t.Errorf("event type %v: C %d, Go %d", g, c, g)
		}
	}
	if slowrankSrCounterSR_CNT_MAX != 8 {
		t.Errorf("SR_CNT_MAX = %d: Stats reads 8 counters", slowrankSrCounterSR_CNT_MAX)
	}
	if slowrankSrCounterSR_CNT_EVENTS != 0 || slowrankSrCounterSR_CNT_RINGBUF_FULL != 1 ||
		slowrankSrCounterSR_CNT_BATCH_OVERSIZE != 2 || slowrankSrCounterSR_CNT_MISSING_ENTRY != 3 ||
		slowrankSrCounterSR_CNT_FILTERED != 4 || slowrankSrCounterSR_CNT_READ_FAULT != 5 ||
		slowrankSrCounterSR_CNT_ENTRY_OVERWRITTEN != 6 || slowrankSrCounterSR_CNT_INFLIGHT_FAILED != 7 {
		t.Error("counter indexes moved: update Stats")
	}
}

// TestHeaderConstants reads events.h so that a new probe id, a version bump
// or a batch size change cannot go unnoticed by the Go side.
func TestHeaderConstants(t *testing.T) {
	src, err := os.ReadFile("events.h")
	if err != nil {
		t.Fatal(err)
	}
	define := func(name string) int {
		m := regexp.MustCompile(`(?m)^#define ` + name + ` (\d+)$`).FindSubmatch(src)
		if m == nil {
			t.Fatalf("events.h lacks #define %s", name)
		}
		v, _ := strconv.Atoi(string(m[1]))
		return v
	}
	if v := define("SLOWRANK_EVENTS_VERSION"); v != EventsVersion {
		t.Errorf("SLOWRANK_EVENTS_VERSION = %d, EventsVersion = %d", v, EventsVersion)
	}
	if v := define("SLOWRANK_BATCH_MAX"); v != BatchMax {
		t.Errorf("SLOWRANK_BATCH_MAX = %d, BatchMax = %d", v, BatchMax)
	}
	if v := define("SR_BATCH_DATA_OFFSET"); v != batchDataOffset {
		t.Errorf("SR_BATCH_DATA_OFFSET = %d, want %d", v, batchDataOffset)
	}
	ids := regexp.MustCompile(`(?m)^\s*(SR_PROBE_\w+) = (\d+),`).FindAllSubmatch(src, -1)
	if len(ids) == 0 {
		t.Fatal("no SR_PROBE_ ids in events.h")
	}
	seen := map[ProbeID]bool{}
	for _, m := range ids {
		v, _ := strconv.Atoi(string(m[2]))
		id := ProbeID(v)
		seen[id] = true
		if id.info() == nil {
			t.Errorf("%s = %d has no ProbeSpec", m[1], v)
		}
	}
	for _, s := range specs {
		if !seen[s.ID] {
			t.Errorf("probe %s (%d) not in events.h", s.ID, uint32(s.ID))
		}
	}
	// The injection library's ABI header, when present, must agree.
	if abi, err := os.ReadFile("../cupti/slowrank_abi.h"); err == nil {
		m := regexp.MustCompile(`(?m)^#define SLOWRANK_BATCH_MAX\s+\(?(\d+)`).FindSubmatch(abi)
		if m == nil {
			t.Errorf("cupti/slowrank_abi.h lacks SLOWRANK_BATCH_MAX")
		} else if v, _ := strconv.Atoi(string(m[1])); v != BatchMax {
			t.Errorf("cupti SLOWRANK_BATCH_MAX = %d, bpf BatchMax = %d", v, BatchMax)
		}
	}
}
