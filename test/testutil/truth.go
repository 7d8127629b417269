package testutil

import (
	"bufio"
	"encoding/json"
	"os"
	"sort"
	"testing"
	"time"
)

// TruthRecord is one line of the fake trainer's ground truth (--truth):
// the fields of its "step", "rank", "burst" and "done" records that tests
// read.
type TruthRecord struct {
	Kind       string         `json:"kind"`
	Job        string         `json:"job"`
	Rank       int            `json:"rank"`
	Step       int64          `json:"step"`
	StartNS    int64          `json:"start_ns"`
	EndNS      int64          `json:"end_ns"`
	StepMS     float64        `json:"step_ms"`
	HostMS     float64        `json:"host_ms"`
	SyncWaitMS float64        `json:"sync_wait_ms"`
	Calls      map[string]int `json:"calls"`
	Steps      int            `json:"steps"` // done: steps completed
	Exit       *int           `json:"exit"`  // done: exit status
	What       string         `json:"what"`  // burst: init or eval
	PID        int            `json:"pid"`   // rank, done: the rank's process
	Comm       string         `json:"comm"`  // rank: the ncclComm_t of its collectives ("0x..." as %p)
}

// ReadTruth reads a ground-truth file and returns its records by kind
// ("step", "rank", "burst", "done"), each kind in file order.
func ReadTruth(t testing.TB, path string) map[string][]TruthRecord {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read only
	out := map[string][]TruthRecord{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r TruthRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("truth line %q: %v", sc.Text(), err)
		}
		out[r.Kind] = append(out[r.Kind], r)
	}
	return out
}

// NearestStep returns the step of steps (sorted by EndNS) whose end is
// nearest to endNS, and whether it lies within 1 ms.
func NearestStep(steps []TruthRecord, endNS int64) (TruthRecord, bool) {
	i := sort.Search(len(steps), func(i int) bool { return steps[i].EndNS >= endNS })
	best, bestD := TruthRecord{}, int64(1<<62)
	for _, j := range []int{i - 1, i} {
		if j >= 0 && j < len(steps) {
			if d := max(steps[j].EndNS-endNS, endNS-steps[j].EndNS); d < bestD {
				best, bestD = steps[j], d
			}
		}
	}
	return best, bestD < int64(time.Millisecond)
}
