package agent

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/slowrank/slowrank/agent/attach"
	"github.com/slowrank/slowrank/agent/discover"
	"github.com/slowrank/slowrank/bpf"
)

// probeSet is the attach manager's real probe set: the uprobes of
// bpf.Probes, which need the agent's privileges (agent/privilege).
type probeSet struct{ probes *bpf.Probes }

// Attach implements attach.ProbeSet; it runs on the attach worker.
func (s probeSet) Attach(lib attach.Library[discover.FileID]) (attach.Link, error) {
	kind, _ := bpfKind(discover.LibraryKind(lib.Kind)) // the attacher asks only for kinds it has
	// lib.Open is a path another user may rename a file onto: the attach
	// takes the file the process maps, through its mapping (bpf/libfile.go).
	att, err := s.probes.AttachLibrary(libSource(lib), kind)
	if err != nil {
		return nil, err // a nil *bpf.Attachment would be a non-nil Link
	}
	if kind == bpf.LibNCCL {
		return ncclLink{att}, nil
	}
	return att, nil
}

// ncclLink is a libnccl attachment whose collective uprobes the attach
// manager closes while every process mapping the file is on the profiler
// plugin path (docs/nccl-profiler-plugin.md §7). Its communicator-init
// uprobes stay: rare calls, and the plugin's communicators created later
// take their ncclComm_t (agent/capture/nccl_commmap.go); so do the group uprobes, whose
// calls the correlator takes from the uprobes on either path.
type ncclLink struct{ *bpf.Attachment }

// DetachCollectives implements attach.Partial.
func (l ncclLink) DetachCollectives() error {
	_, err := l.DetachClass(bpf.ClassCollective)
	return err
}

// ReattachCollectives implements attach.Partial.
func (l ncclLink) ReattachCollectives(via attach.Library[discover.FileID]) error {
	_, err := l.ReattachClass(bpf.ClassCollective, libSource(via))
	return err
}

// libSource says where lib's process maps the file: its mapping, and the
// path checked against the mapping's identity where the mapping cannot be
// opened.
func libSource(lib attach.Library[discover.FileID]) bpf.LibSource {
	return bpf.LibSource{MapFiles: lib.MapFiles, Path: lib.Open, Want: bpf.FileID(lib.File)}
}

// attachSink takes the attach manager's reports into the agent's counters,
// log and status (main goroutine).
type attachSink struct{ t *attacher }

// Count implements attach.Sink.
func (s attachSink) Count(name string, n int64) { s.t.count(name, n) }

// Attached implements attach.Sink: what the attachment holds, in counters
// and the log.
func (s attachSink) Attached(lib attach.Library[discover.FileID], link attach.Link, took time.Duration) {
	t, att := s.t, attachment(link)
	if missing, required := att.Missing(); len(missing) > 0 {
		t.count("symbols_missing", int64(len(missing)))
		// Once per library, by name: an operator who asked for a probe
		// (e.g. --probe-torch on a torch that does not export it) learns it
		// is absent, and what it would have measured is not.
		log := t.log.Info
		if required {
			log = t.log.Warn
		}
		log("library lacks probed symbols", "path", lib.Name, "missing", len(missing),
			"symbols", missingNames(missing, 6), "stripped", att.Stripped)
	}
	t.count("probes_attached", int64(att.Attached()))
	t.log.Info("attached", "library", filepath.Base(lib.Name), "kind", discover.LibraryKind(lib.Kind), "probes", att.Attached(),
		"took", took.Round(time.Millisecond), "queued", s.t.libs.Pending())
	s.t.refreshView()
}

// missingNames lists up to max probe names, then how many more there are.
func missingNames(specs []bpf.ProbeSpec, max int) string {
	names := make([]string, 0, min(len(specs), max))
	for i, s := range specs {
		if i == max {
			names = append(names, fmt.Sprintf("and %d more", len(specs)-max))
			break
		}
		names = append(names, s.Name())
	}
	return strings.Join(names, ", ")
}

func bpfKind(k discover.LibraryKind) (bpf.LibKind, bool) {
	switch k {
	case discover.KindNCCL:
		return bpf.LibNCCL, true
	case discover.KindCUDART:
		return bpf.LibCUDART, true
	case discover.KindCUDA:
		return bpf.LibCUDA, true
	case discover.KindTorchCPU, discover.KindTorchCUDA:
		return bpf.LibTorch, true
	case discover.KindCUPTIInject:
		return bpf.LibCUPTI, true
	case discover.KindCUPTIRuntime:
		return bpf.LibCUPTIRuntime, true
	}
	return 0, false
}

// attachment is the bpf.Attachment a Link of the probe set holds.
func attachment(l attach.Link) *bpf.Attachment {
	if n, ok := l.(ncclLink); ok {
		return n.Attachment
	}
	return l.(*bpf.Attachment)
}
