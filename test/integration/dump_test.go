package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// dumpPath is where the capture records of test t go: SLOWRANK_IT_DUMP
// with t's name (and run, when a test runs several jobs) before its
// extension, so that every subtest of a run keeps its own (a failure under
// load is in one of them); "" when unset.
func dumpPath(t *testing.T, run ...int) string {
	path := os.Getenv("SLOWRANK_IT_DUMP")
	if path == "" {
		return ""
	}
	ext := filepath.Ext(path)
	name := strings.NewReplacer("/", "_", "+", "_", " ", "_").Replace(t.Name())
	for _, r := range run {
		name += fmt.Sprintf(".%d", r)
	}
	return strings.TrimSuffix(path, ext) + "." + name + ext
}

// dumpTo writes every capture record the agent's pipeline sees as JSONL
// ({"type": Go type, "record": fields}) to path, for replays in
// correlate's tests (SLOWRANK_IT_DUMP=FILE; debugging).
func dumpTo(t *testing.T, path string) func(any) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		encErr error // the first record that could not be written: a dump with a hole replays wrong
	)
	enc := json.NewEncoder(f)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if err := errors.Join(encErr, f.Close()); err != nil {
			t.Errorf("dump %s: %v", path, err)
		}
	})
	return func(v any) {
		mu.Lock()
		defer mu.Unlock()
		err := enc.Encode(struct {
			Type   string `json:"type"`
			Record any    `json:"record"`
		}{fmt.Sprintf("%T", v), v})
		if encErr == nil {
			encErr = err
		}
	}
}
