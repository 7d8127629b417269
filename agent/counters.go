package agent

import "sync"

// counters are the agent's own health counters (events read, lost, attach
// failures, ...). Every loss is counted here and exported; none is silent.
// Safe for concurrent use.
type counters struct {
	mu sync.Mutex
	m  map[string]int64
}

func newCounters() *counters { return &counters{m: map[string]int64{}} }

func (c *counters) add(name string, n int64) {
	c.mu.Lock()
	c.m[name] += n
	c.mu.Unlock()
}

func (c *counters) set(name string, v int64) {
	c.mu.Lock()
	c.m[name] = v
	c.mu.Unlock()
}

func (c *counters) get(name string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[name]
}

// snapshot returns a copy.
func (c *counters) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.m))
	for k, v := range c.m {
		out[k] = v
	}
	return out
}
