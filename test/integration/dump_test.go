package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"testing"
)

// dumpTo writes every capture record the agent's pipeline sees as JSONL
// ({"type": Go type, "record": fields}) to path, for replays in
// correlate's tests (SLOWRANK_IT_DUMP=FILE; debugging).
func dumpTo(t *testing.T, path string) func(any) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	enc := json.NewEncoder(f)
	t.Cleanup(func() { mu.Lock(); f.Close(); mu.Unlock() })
	return func(v any) {
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(struct {
			Type   string `json:"type"`
			Record any    `json:"record"`
		}{fmt.Sprintf("%T", v), v})
	}
}
