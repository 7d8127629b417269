package cupti

import (
	"sync"
	"testing"
)

func TestInterner(t *testing.T) {
	in := NewInternerWithLimits(2, 3)
	b := &Batch{Names: []NameDef{{ID: 1, Name: "a", Class: ClassGEMM}, {ID: 2, Name: "b"}}}
	if n := in.Observe(10, b); n != 2 {
		t.Fatalf("observe: %d new", n)
	}
	if n := in.Observe(10, b); n != 0 {
		t.Fatalf("re-observe: %d new", n)
	}
	if in.Name(10, 1) != "a" || in.Name(10, 2) != "b" {
		t.Error("names")
	}
	if d, ok := in.Lookup(10, 1); !ok || d.Class != ClassGEMM {
		t.Errorf("lookup %+v %v", d, ok)
	}
	// Unknown id, unknown process: the fallback, counted.
	if got := in.Name(10, 7); got != "kernel#7" {
		t.Errorf("fallback %q", got)
	}
	if got := in.Name(11, 1); got != "kernel#1" {
		t.Errorf("other pid %q", got)
	}
	// Names per process are bounded.
	in.Observe(10, &Batch{Names: []NameDef{{ID: 3, Name: "c"}, {ID: 4, Name: "d"}}})
	// Processes are bounded.
	in.Observe(11, b)
	in.Observe(12, b)
	// A re-sent id with another name replaces it (pid reuse without Forget).
	in.Observe(11, &Batch{Names: []NameDef{{ID: 1, Name: "z"}}})
	if in.Name(11, 1) != "z" {
		t.Error("redefinition")
	}
	st := in.Stats()
	want := InternerStats{Processes: 2, Names: 5, Missing: 2, Refused: 3, Redefined: 1}
	if st != want {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	in.Forget(10)
	if st := in.Stats(); st.Processes != 1 || st.Names != 2 {
		t.Errorf("after forget %+v", st)
	}
	if in.Name(10, 1) != "kernel#1" {
		t.Error("forgotten name still known")
	}
}

func TestInternerConcurrent(t *testing.T) {
	in := NewInterner()
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				pid := uint32(w % 3)
				in.Observe(pid, &Batch{Names: []NameDef{{ID: uint32(i + 1), Name: "k"}}})
				_ = in.Name(pid, uint32(i+1))
				if i%50 == 0 {
					in.Forget(pid)
				}
			}
		}(w)
	}
	wg.Wait()
	_ = in.Stats()
}
