package capture

import (
	"maps"
	"sync"
)

// testCounts keeps what a Converter counts, as the agent's counters do.
type testCounts struct {
	mu sync.Mutex
	m  map[string]int64
}

func newCounters() *testCounts { return &testCounts{m: map[string]int64{}} }

func (c *testCounts) add(name string, n int64) {
	c.mu.Lock()
	c.m[name] += n
	c.mu.Unlock()
}

func (c *testCounts) get(name string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[name]
}

func (c *testCounts) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.m)
}

// testConverter is a Converter with the counts it fed.
type testConverter struct {
	*Converter
	counters *testCounts
}

func newConverter(c *testCounts, ncclPlugin bool) *testConverter {
	return &testConverter{New(Config{Count: c.add, NCCLPlugin: ncclPlugin}), c}
}
