package agent

import "testing"

func TestPluginOnlyProcessesSayCUDANeverLoadedTheLibrary(t *testing.T) {
	tests := []struct {
		name        string
		cupti, path string
		want        string
	}{
		{"init on the plugin path: NCCL loaded it alone", "init", "plugin v5", PluginOnly},
		{"init on uprobes: the library is starting", "init", "", "init"},
		{"CUDA initialised it: its CUPTI state stays", "on", "plugin v5", "on"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			procs := []ProcessView{{PID: 7, Injected: true, CUPTI: tt.cupti}}
			paths := map[uint32]string{}
			if tt.path != "" {
				paths[7] = tt.path
			}
			withNCCLPaths(procs, paths)
			if procs[0].CUPTI != tt.want {
				t.Errorf("CUPTI %q, want %q", procs[0].CUPTI, tt.want)
			}
		})
	}
}

func TestProcessesWithoutEventsAreOnUprobes(t *testing.T) {
	procs := []ProcessView{{PID: 1}, {PID: 2}}
	withNCCLPaths(procs, map[uint32]string{2: "plugin v5"})
	if procs[0].NCCL != "uprobes" || procs[1].NCCL != "plugin v5" {
		t.Errorf("paths %q %q", procs[0].NCCL, procs[1].NCCL)
	}
}
