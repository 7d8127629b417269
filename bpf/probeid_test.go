package bpf

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

// The shape macros of slowrank.bpf.c and the record type each emits.
var macroEvents = map[string]EventType{
	"COLL_PROBE": EventColl, "INIT_PROBE": EventCommInit, "SYNC_PROBE": EventSync,
	"TORCH_PROBE": EventTorch, "CUPTI_CALL_PROBE": EventCUPTICall,
}

// The layout of the shape macros that take none.
var macroLayouts = map[string]Layout{"TORCH_PROBE": LayoutTorch, "CUPTI_CALL_PROBE": LayoutCUPTICall}

// TestSpecClassesMatchPrograms: a spec's class says which record type its
// programs emit (the decoder refuses any other), so it must agree with the
// shape macro that generates the program and the id the macro is given.
// Unprivileged: reads events.h and slowrank.bpf.c.
func TestSpecClassesMatchPrograms(t *testing.T) {
	ids := map[string]ProbeID{}
	hdr, err := os.ReadFile("events.h")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*(SR_PROBE_\w+) = (\d+),`).FindAllSubmatch(hdr, -1) {
		v, _ := strconv.Atoi(string(m[2]))
		ids[string(m[1])] = ProbeID(v)
	}
	src, err := os.ReadFile("slowrank.bpf.c")
	if err != nil {
		t.Fatal(err)
	}
	byEntry := map[string]ProbeSpec{}
	for _, s := range specs {
		byEntry[s.Entry] = s
	}
	layouts := map[string]Layout{}
	for _, m := range regexp.MustCompile(`(?m)^\s*(SR_LAYOUT_\w+) = (\d+),`).FindAllSubmatch(hdr, -1) {
		v, _ := strconv.Atoi(string(m[2]))
		layouts[string(m[1])] = Layout(v)
	}
	lines := regexp.MustCompile(`(?m)^([A-Z_]+_PROBE)\((\w+), (SR_PROBE_\w+)(?:,\s+(SR_LAYOUT_\w+))?\)`).FindAllSubmatch(src, -1)
	if all := regexp.MustCompile(`(?m)^[A-Z_]+_PROBE\(`).FindAll(src, -1); len(lines) < 50 || len(lines) != len(all) {
		t.Fatalf("the pattern matches %d of %d probe macro lines in slowrank.bpf.c", len(lines), len(all))
	}
	for _, m := range lines {
		macro, prog, id := string(m[1]), string(m[2]), string(m[3])
		s, ok := byEntry[prog+"_entry"]
		if !ok {
			t.Errorf("%s(%s): no spec runs %s_entry", macro, prog, prog)
			continue
		}
		if s.ID != ids[id] {
			t.Errorf("%s: program %s is given %s (%d), the spec id %d", s.Name(), prog, id, ids[id], s.ID)
		}
		// The shared programs read the layout from the cookie: the spec's
		// must be the one the function's own program has compiled in.
		layout, ok := layouts[string(m[4])]
		if !ok {
			layout = macroLayouts[macro]
		}
		if s.Layout != layout || layout == 0 {
			t.Errorf("%s: layout %d, program %s reads layout %d (%q)", s.Name(), s.Layout, prog, layout, m[4])
		}
		if got := s.Class.EventType(); got != macroEvents[macro] {
			t.Errorf("%s: class %v emits %v records, %s makes %v", s.Name(), s.Class, got, macro, macroEvents[macro])
		}
	}
}

// Every spec has a class, its op is set exactly when the class has one, and
// the alternate spellings of a probe (one id) agree, since the id alone
// reaches the agent.
func TestSpecClassesAndOps(t *testing.T) {
	byID := map[ProbeID]ProbeSpec{}
	for _, s := range specs {
		if s.ID >= MaxProbeID {
			t.Errorf("%s: id %d not below MaxProbeID", s.Name(), s.ID)
		}
		if s.Class.EventType() == 0 {
			t.Errorf("%s: class %v", s.Name(), s.Class)
		}
		switch s.Class {
		case ClassCollective, ClassTorchCollective:
			if s.Op == "" {
				t.Errorf("%s: collective without an op", s.Name())
			}
		case ClassSyncWait:
			if s.Op != s.Symbol {
				t.Errorf("%s: op %q, want the function's name", s.Name(), s.Op)
			}
		default:
			if s.Op != "" {
				t.Errorf("%s: class %v with op %q", s.Name(), s.Class, s.Op)
			}
		}
		if o, ok := byID[s.ID]; ok && (o.Class != s.Class || o.Op != s.Op || o.SelfArg != s.SelfArg) {
			t.Errorf("%s and %s share id %d but not class, op and self", o.Name(), s.Name(), s.ID)
		}
		byID[s.ID] = s
		if s.ID.Class() != s.Class || s.ID.Op() != s.Op {
			t.Errorf("%s: id %d looks up class %v op %q", s.Name(), s.ID, s.ID.Class(), s.ID.Op())
		}
	}
	for _, id := range []ProbeID{0, 12, 999, 1 << 31} {
		if id.Class() != 0 || id.Op() != "" || id.EventType() != 0 {
			t.Errorf("unknown id %d: class %v op %q", id, id.Class(), id.Op())
		}
	}
}
