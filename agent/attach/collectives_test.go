package attach

import (
	"maps"
	"slices"
	"testing"
)

// The decisions on a file's collective probes (collectives.go): detached
// once every user reports its collectives through the plugin, attached
// again as soon as one does not, through a user that needs them.
func TestCollectiveProbesFollowTheirUsers(t *testing.T) {
	type want struct {
		counts  map[string]int64 // every counter but the attach's own
		changes []string         // file 10's changes: "off" or the re-attach's open path
		off     bool             // file 10's collective probes closed at the end
	}
	const (
		detached   = "nccl_collective_probes_detached"
		reattached = "nccl_collective_probes_reattached"
		blind      = "nccl_collective_blind_waits"
		blindMS    = "nccl_collective_blind_ms"
	)
	via := func(pid int) string { return lib(pid, 10).Open }
	cases := []struct {
		name string
		run  func(h *harness)
		want want
	}{
		{
			name: "every user on the plugin: detached once",
			run: func(h *harness) {
				h.use(1, 10)
				h.use(2, 10)
				h.settle()
				h.m.SetPlugin(1, true)
				h.settle()
				if h.m.CollectivesDetached(10) {
					h.t.Error("detached while process 2 is on the uprobes")
				}
				h.m.SetPlugin(2, true)
				h.m.SetPlugin(2, true) // told again every tick
				h.settle()
			},
			want: want{counts: map[string]int64{detached: 1}, changes: []string{"off"}, off: true},
		},
		{
			name: "a process without the plugin mapping the file re-attaches through it",
			run: func(h *harness) {
				h.use(1, 10)
				h.settle()
				h.m.SetPlugin(1, true)
				h.settle()
				h.use(3, 10)
				h.settle()
			},
			want: want{counts: map[string]int64{detached: 1, reattached: 1, blind: 1}, changes: []string{"off", via(3)}},
		},
		{
			name: "the time a process waited for the closed probes is counted as blind",
			run: func(h *harness) {
				h.use(1, 10)
				h.settle()
				h.m.SetPlugin(1, true)
				h.settle()
				h.use(3, 10)
				h.now += 250_000_000 // the re-attach took 250 ms
				h.settle()
			},
			want: want{counts: map[string]int64{detached: 1, reattached: 1, blind: 1, blindMS: 250}, changes: []string{"off", via(3)}},
		},
		{
			name: "a plugin process that falls back re-attaches; its return to the plugin detaches again",
			run: func(h *harness) {
				h.use(1, 10)
				h.use(2, 10)
				h.settle()
				h.m.SetPlugin(1, true)
				h.m.SetPlugin(2, true)
				h.settle()
				h.m.SetPlugin(2, false)
				h.settle()
				h.m.SetPlugin(2, true)
				h.settle()
			},
			want: want{counts: map[string]int64{detached: 2, reattached: 1, blind: 1}, changes: []string{"off", via(2), "off"}, off: true},
		},
		{
			name: "the exit of the last process without the plugin detaches",
			run: func(h *harness) {
				h.use(1, 10)
				h.use(2, 10)
				h.settle()
				h.m.SetPlugin(1, true)
				h.settle()
				h.release(2, 10)
				h.settle()
			},
			want: want{counts: map[string]int64{detached: 1}, changes: []string{"off"}, off: true},
		},
		{
			name: "a change in flight is judged again at its end",
			run: func(h *harness) {
				h.use(1, 10)
				h.settle()
				h.m.SetPlugin(1, true) // the detach is in flight when 3 maps the file
				h.use(3, 10)
				h.settle()
			},
			want: want{counts: map[string]int64{detached: 1, reattached: 1, blind: 1}, changes: []string{"off", via(3)}},
		},
		{
			name: "a plugin process's exit leaves the collective probes as they are until a user comes",
			run: func(h *harness) {
				h.use(1, 10)
				h.settle()
				h.m.SetPlugin(1, true)
				h.settle()
				h.release(1, 10)
				h.settle()
				if !h.m.CollectivesDetached(10) {
					h.t.Error("re-attached for no user")
				}
				h.use(2, 10) // within the linger, without the plugin
				h.settle()
			},
			want: want{counts: map[string]int64{detached: 1, reattached: 1, blind: 1, "attachments_reused": 1}, changes: []string{"off", via(2)}},
		},
		{
			name: "a failed re-attach is tried again on the next tick",
			run: func(h *harness) {
				h.use(1, 10)
				h.settle()
				h.m.SetPlugin(1, true)
				h.settle()
				h.probes.failReattach = 1
				h.use(2, 10)
				h.settle()
				if !h.m.CollectivesDetached(10) {
					h.t.Error("a failed re-attach counts as attached")
				}
				h.advance(0)
				h.settle()
			},
			want: want{counts: map[string]int64{detached: 1, reattached: 1, blind: 1, "nccl_collective_reattach_errors": 1},
				changes: []string{"off", via(2), via(2)}},
		},
		{
			// A user's path may name another file than it maps (a rename
			// onto it: bpf.ErrFileChanged): its failures must not keep the
			// probes closed for the others.
			name: "after a failed re-attach the next try goes through another user",
			run: func(h *harness) {
				h.use(1, 10)
				h.settle()
				h.m.SetPlugin(1, true)
				h.settle()
				h.probes.failReattach = 1
				h.use(2, 10)
				h.use(3, 10)
				h.settle()
				h.advance(0)
				h.settle()
			},
			want: want{counts: map[string]int64{detached: 1, reattached: 1, blind: 1, "nccl_collective_reattach_errors": 1},
				changes: []string{"off", via(2), via(3)}},
		},
		{
			name: "after a failed detach the file is not detached again",
			run: func(h *harness) {
				h.probes.failDetach = 1
				h.use(1, 10)
				h.settle()
				h.m.SetPlugin(1, true)
				h.settle()
				h.use(2, 10)
				h.settle()
				h.release(2, 10)
				h.settle()
			},
			want: want{counts: map[string]int64{"nccl_collective_detach_errors": 1, reattached: 1, blind: 1}, changes: []string{"off", via(2)}},
		},
		{
			name: "a process's plugin state is per file it maps",
			run: func(h *harness) {
				h.use(1, 10)
				h.use(1, 11)
				h.use(2, 11)
				h.settle()
				h.m.SetPlugin(1, true)
				h.settle()
				if h.m.CollectivesDetached(11) {
					h.t.Error("file 11 detached while process 2 maps it without the plugin")
				}
			},
			want: want{counts: map[string]int64{detached: 1}, changes: []string{"off"}, off: true},
		},
		{
			name: "a file still attaching is judged once attached",
			run: func(h *harness) {
				h.use(1, 10)
				h.m.SetPlugin(1, true) // learnt before the attach finished
				h.settle()
			},
			want: want{counts: map[string]int64{detached: 1}, changes: []string{"off"}, off: true},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			tc.run(h)
			got := nonZero(h.sink.counts)
			delete(got, "libraries_attached")
			if !maps.Equal(got, tc.want.counts) {
				t.Errorf("counters %v, want %v", got, tc.want.counts)
			}
			var l *fakeLink
			for _, fl := range h.probes.links {
				if fl.file == 10 {
					l = fl
				}
			}
			if l == nil {
				t.Fatal("file 10 never attached")
			}
			if !slices.Equal(l.changes, tc.want.changes) {
				t.Errorf("changes %q, want %q", l.changes, tc.want.changes)
			}
			if h.m.CollectivesDetached(10) != tc.want.off || l.off != tc.want.off {
				t.Errorf("detached: manager %v, link %v; want %v", h.m.CollectivesDetached(10), l.off, tc.want.off)
			}
			h.m.Close()
		})
	}
}
