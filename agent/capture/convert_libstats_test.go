package capture

import (
	"testing"

	"github.com/slowrank/slowrank/cupti"
)

func TestLibraryCountersExportedAsGrowth(t *testing.T) {
	c := newConverter(newCounters(), false)
	p := &convProc{}
	stats := func(yields, orphaned uint64) cupti.Stats {
		var s cupti.Stats
		s.N = cupti.NumStats
		s.Counters[cupti.StatYields] = yields
		s.Counters[cupti.StatBuffersOrphaned] = orphaned
		return s
	}
	c.libStats(p, stats(2, 1))
	c.libStats(p, stats(3, 1)) // cumulative: one more yield
	c.libStats(p, stats(1, 0)) // a new library instance starts from 0
	if got := c.counters.get("cupti_lib_yields"); got != 4 {
		t.Errorf("cupti_lib_yields = %d, want 4 (2, +1, then +1 from a restart)", got)
	}
	if got := c.counters.get("cupti_lib_buffers_orphaned"); got != 1 {
		t.Errorf("cupti_lib_buffers_orphaned = %d, want 1", got)
	}
	older := cupti.Stats{N: 1}
	older.Counters[0] = 5
	c.libStats(&convProc{}, older) // an older library sends fewer counters
	if got := c.counters.get("cupti_lib_yields"); got != 4 {
		t.Errorf("a shorter record changed yields: %d", got)
	}
}
