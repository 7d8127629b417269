package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestGoMemoryLimit(t *testing.T) {
	got, err := GoMemoryLimit(512<<20, 8<<20)
	if err != nil || got != 512<<20-16<<20-memoryReserve {
		t.Errorf("GoMemoryLimit(512 MiB, 8 MiB) = %d, %v", got, err)
	}
	if _, err := GoMemoryLimit(64<<20, 8<<20); err == nil || !strings.Contains(err.Error(), "at least 80 MiB") {
		t.Errorf("64 MiB with an 8 MiB ring buffer: %v", err)
	}
}

func TestParseStatus(t *testing.T) {
	rss, threads, err := parseStatus([]byte("Name:\tslowrank\nVmRSS:\t   46232 kB\nThreads:\t14\n"))
	if err != nil || rss != 46232<<10 || threads != 14 {
		t.Errorf("parseStatus = %d, %d, %v", rss, threads, err)
	}
	for _, in := range []string{"", "VmRSS:\t1 kB\n", "VmRSS: x kB\nThreads: 1\n", "VmRSS:\nThreads:\t1\n"} {
		if _, _, err := parseStatus([]byte(in)); err == nil {
			t.Errorf("parseStatus(%q) accepted", in)
		}
	}
}

// TestNextEpoch: restarts within the same second (or after the clock stepped
// back) still get a greater epoch, persisted safely.
func TestNextEpoch(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	now := time.Unix(1_800_000_000, 0)
	var got []int
	for _, at := range []time.Time{now, now, now.Add(500 * time.Millisecond), now.Add(-time.Hour), now.Add(10 * time.Second)} {
		e, err := NextEpoch(dir, at)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	want := []int{1_800_000_000, 1_800_000_001, 1_800_000_002, 1_800_000_003, 1_800_000_010}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("epochs %v, want %v", got, want)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, epochFile))
	if err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("epoch file: %v %v", fi, err)
	}
	if e, err := NextEpoch("", now); err != nil || e != 1_800_000_000 {
		t.Errorf("no state dir: %d %v", e, err)
	}
	// Garbage in the file and a planted symlink are errors, not followed.
	if err := os.WriteFile(filepath.Join(dir, epochFile), []byte("banana\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := NextEpoch(dir, now); err == nil || !strings.Contains(err.Error(), "invalid epoch") {
		t.Errorf("garbage epoch: %v", err)
	}
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("1900000000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, epochFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, epochFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := NextEpoch(dir, now); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("symlinked epoch file: %v", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "1900000000\n" {
		t.Error("symlink target modified")
	}
}
