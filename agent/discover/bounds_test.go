package discover

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
)

func TestReadIntoBoundsTheFile(t *testing.T) {
	const limit = 256 << 10
	for _, tc := range []struct {
		name string
		size int
		ok   bool
	}{
		{"under the bound", limit - 1, true},
		{"at the bound", limit, true},
		{"one byte over", limit + 1, false},
		{"forty times over", 40 * limit, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f")
			if err := os.WriteFile(path, bytes.Repeat([]byte{'x'}, tc.size), 0o644); err != nil {
				t.Fatal(err)
			}
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			b, err := ReadInto(path, nil, limit)
			runtime.ReadMemStats(&m1)
			if tc.ok != (err == nil) || tc.ok && len(b) != tc.size {
				t.Fatalf("read %d bytes, err %v", len(b), err)
			}
			if !tc.ok && !errors.Is(err, errProcFileTooLarge) {
				t.Errorf("err %v, want %v", err, errProcFileTooLarge)
			}
			if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > 3*limit {
				t.Errorf("allocated %d bytes for a bound of %d", alloc, limit)
			}
		})
	}
}

// A process whose environment exceeds the bound (prctl PR_SET_MM_MAP can
// point it at gigabytes) is counted, not read whole nor selected.
func TestDiscoverRefusesAnOversizedEnvironment(t *testing.T) {
	root := copyProcTree(t, "testdata/proc")
	env := append([]byte("RANK=0\x00"), bytes.Repeat([]byte("X=y\x00"), maxProcFile/4)...)
	if err := os.WriteFile(filepath.Join(root, "100", "environ"), env, 0o644); err != nil {
		t.Fatal(err)
	}
	got, stats, err := Discover(root, Selector{})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(pidsOf(got), 100) || stats.Oversized != 1 || stats.Failed != 0 {
		t.Errorf("selected %v, stats %+v; want 100 left out and counted as oversized", pidsOf(got), stats)
	}
}

func TestReadLibrariesRefusesOversizedMaps(t *testing.T) {
	root := copyProcTree(t, "testdata/proc")
	line := "7f0000000000-7f0000001000 r--p 00000000 00:00 0 [anon:" + string(bytes.Repeat([]byte{'x'}, 4000)) + "]\n"
	maps := bytes.Repeat([]byte(line), maxMapsBytes/len(line)+1)
	if err := os.WriteFile(filepath.Join(root, "100", "maps"), maps, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadLibraries(root, 100); !errors.Is(err, errProcFileTooLarge) {
		t.Errorf("err %v, want %v", err, errProcFileTooLarge)
	}
}

func TestLibrariesFromMapsBoundsTheLibraries(t *testing.T) {
	maps := func(n int) []byte {
		var b bytes.Buffer
		for i := range n {
			fmt.Fprintf(&b, "7f%010x-7f%010x r-xp 00000000 08:01 %d /tmp/x%d/libnccl.so.2\n", i<<12, (i+1)<<12, 1000+i, i)
		}
		return b.Bytes()
	}
	if libs, err := librariesFromMaps(maps(maxLibrariesPerProcess), "/proc", 1); err != nil || len(libs) != maxLibrariesPerProcess {
		t.Errorf("%d libraries: got %d, %v", maxLibrariesPerProcess, len(libs), err)
	}
	if _, err := librariesFromMaps(maps(maxLibrariesPerProcess+1), "/proc", 1); !errors.Is(err, errProcFileTooLarge) {
		t.Errorf("%d libraries: err %v, want %v", maxLibrariesPerProcess+1, err, errProcFileTooLarge)
	}
}
