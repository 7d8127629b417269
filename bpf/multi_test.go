package bpf

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// classLayouts are the layouts each class's shared entry program reads
// (slowrank.bpf.c: the switch of the entry function MULTI_INTERVAL gives it);
// any other layout would read no argument.
var classLayouts = map[ProbeClass][]Layout{
	ClassCollective:      {LayoutCollOp7, LayoutCollRoot7, LayoutCollReduce8, LayoutCollPlain6, LayoutCollPeer6},
	ClassGroup:           {LayoutGroupStart, LayoutGroupEnd},
	ClassCommInit:        {LayoutInitRank, LayoutInitScalable, LayoutInitAll, LayoutSplit},
	ClassSyncWait:        {LayoutSync, LayoutSyncHandle},
	ClassTorchCollective: {LayoutTorch},
	ClassTorchWorkWait:   {LayoutTorch},
	ClassTorchFutureWait: {LayoutTorch},
	ClassCUPTIBatch:      {LayoutCUPTIEmit},
	ClassCUPTICall:       {LayoutCUPTICall},
}

// TestMultiCookies: the shared programs of uprobe_multi links know a
// function only by its attach cookie, so the cookie must carry the probe id
// and the argument layout of its spec, as events.h lays them out, and the
// links must carry each function's own cookie.
func TestMultiCookies(t *testing.T) {
	hdr, err := os.ReadFile("events.h")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^#define SR_COOKIE_LAYOUT_SHIFT (\d+)$`).FindSubmatch(hdr)
	if m == nil {
		t.Fatal("events.h lacks SR_COOKIE_LAYOUT_SHIFT")
	}
	if v, _ := strconv.Atoi(string(m[1])); v != cookieLayoutShift {
		t.Fatalf("SR_COOKIE_LAYOUT_SHIFT = %d, Go shifts by %d", v, cookieLayoutShift)
	}

	bySymbol := map[string]ProbeSpec{}
	for _, s := range specs {
		bySymbol[s.Name()] = s
	}
	for _, tc := range []struct {
		name   string
		symbol string
		cookie uint64
	}{
		{"an all-reduce reads op, comm and stream from registers", "ncclAllReduce", 1 | 1<<32},
		{"a reduce reads its root and stream past the registers", "ncclReduce", 3 | 3<<32},
		{"a send reads its peer", "ncclSend", 6 | 5<<32},
		{"ncclGroupStart is a marker", "ncclGroupStart", 20 | 10<<32},
		{"ncclGroupEnd is an interval", "ncclGroupEnd", 21 | 11<<32},
		{"ncclCommInitRank hashes the id passed by value", "ncclCommInitRank", 30 | 20<<32},
		{"ncclCommSplit reads its parent", "ncclCommSplit", 33 | 23<<32},
		{"cudaDeviceSynchronize has no handle", "cudaDeviceSynchronize", 40 | 30<<32},
		{"cuStreamSynchronize reads its stream", "cuStreamSynchronize", 44 | 31<<32},
		{"a torch wait reads rdi and rsi", "c10d::Work::wait", 149 | 40<<32},
		{"the injection library's batch", CUPTIEmitSymbol, 200 | 50<<32},
		{"a libcupti call", "cuptiActivityEnable", 213 | 60<<32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, ok := bySymbol[tc.symbol]
			if !ok {
				t.Fatalf("no spec for %s", tc.symbol)
			}
			if got := multiCookie(s); got != tc.cookie {
				t.Errorf("cookie %#x, want %#x", got, tc.cookie)
			}
		})
	}
	t.Run("every spec's cookie decodes to its id and a layout of its class", func(t *testing.T) {
		for _, s := range specs {
			id, layout := decodeCookie(multiCookie(s))
			if id != s.ID || layout != s.Layout {
				t.Errorf("%s: cookie decodes to id %d layout %d, want %d, %d", s.Name(), id, layout, s.ID, s.Layout)
			}
			ok := false
			for _, l := range classLayouts[s.Class] {
				ok = ok || l == s.Layout
			}
			if !ok {
				t.Errorf("%s: layout %d is not one the %v programs read %v", s.Name(), s.Layout, s.Class, classLayouts[s.Class])
			}
		}
	})
	t.Run("the links carry each function's cookie", func(t *testing.T) {
		requireBPF(t)
		p := loadMulti(t)
		for kind, a := range attachAll(t, p, fakeLibs(t)) {
			byOffset := map[uint64]ProbeSpec{}
			for _, r := range a.Results {
				if r.Status == StatusAttached {
					byOffset[r.Offset] = r.Spec
				}
			}
			n := 0
			for _, pl := range a.links {
				for _, l := range []link.Link{pl.entry, pl.ret} {
					for _, o := range multiOffsets(t, l) {
						s, ok := byOffset[o.Offset]
						id, layout := decodeCookie(o.Cookie)
						if !ok || id != s.ID || layout != s.Layout {
							t.Errorf("%v: offset %#x has cookie %#x (id %d layout %d), its function %s has id %d layout %d",
								kind, o.Offset, o.Cookie, id, layout, s.Name(), s.ID, s.Layout)
						}
						n++
					}
				}
			}
			if n == 0 {
				t.Errorf("%v: no offsets in its links", kind)
			}
		}
	})
}

// TestLinksPerClass: with uprobe_multi, a library holds one link per probe
// class and direction (a SIGKILLed agent's links are released one after
// another, about 50 ms each), each carrying all the class's functions and
// running the class's shared program; detaching a class closes its links
// only, and making it again makes one link per direction again.
func TestLinksPerClass(t *testing.T) {
	requireBPF(t)
	p := loadMulti(t)
	atts := attachAll(t, p, fakeLibs(t))
	for _, tc := range []struct {
		name  string
		kind  LibKind
		links map[ProbeClass]int // functions per class (each has an entry and a return link unless entry-only)
		want  int                // links in all
	}{
		{"libnccl: collectives, groups and communicator inits", LibNCCL,
			map[ProbeClass]int{ClassCollective: fakeNCCLColls, ClassGroup: 2, ClassCommInit: 5}, 6},
		{"libcudart: its synchronisations", LibCUDART, map[ProbeClass]int{ClassSyncWait: 3}, 2},
		{"libcuda: its synchronisations", LibCUDA, map[ProbeClass]int{ClassSyncWait: 3}, 2},
		{"libtorch: collectives, Work::wait and Future::wait", LibTorch,
			map[ProbeClass]int{ClassTorchCollective: fakeTorchFuncs - 2, ClassTorchWorkWait: 1, ClassTorchFutureWait: 1}, 6},
		{"the injection library: one entry link", LibCUPTI, map[ProbeClass]int{ClassCUPTIBatch: 1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := atts[tc.kind]
			checkClassLinks(t, p, a, tc.links, tc.want)
		})
	}
	t.Run("a detached class is its own links", func(t *testing.T) {
		a := atts[LibNCCL]
		n, err := a.DetachClass(ClassCollective)
		if err != nil || n != fakeNCCLColls {
			t.Fatalf("DetachClass: %d functions, %v; want %d", n, err, fakeNCCLColls)
		}
		checkClassLinks(t, p, a, map[ProbeClass]int{ClassGroup: 2, ClassCommInit: 5}, 4)
		path := filepath.Join(fakeLibs(t), "libnccl.so.2")
		if n, err := a.ReattachClass(ClassCollective, LibSource{Path: path}); err != nil || n != fakeNCCLColls {
			t.Fatalf("ReattachClass: %d functions, %v; want %d", n, err, fakeNCCLColls)
		}
		checkClassLinks(t, p, a, map[ProbeClass]int{ClassCollective: fakeNCCLColls, ClassGroup: 2, ClassCommInit: 5}, 6)
	})
}

// TestSharedLinkFailureAttachesFunctionByFunction: a class whose shared
// link cannot be made (here one of its addresses lies past the end of the
// file) is attached function by function; the one that fails is reported
// alone, the others are attached.
func TestSharedLinkFailureAttachesFunctionByFunction(t *testing.T) {
	requireBPF(t)
	p := loadMulti(t)
	path := filepath.Join(fakeLibs(t), "libcudart.so.13")
	a, err := p.AttachLibrary(LibSource{Path: path}, LibCUDART)
	if err != nil {
		t.Fatal(err)
	}
	defer closeOK(t, a)
	var fns []resolved
	for _, pl := range a.links {
		fns = append(fns, pl.fns...)
	}
	bad := fns[0]
	bad.offset = 1 << 40
	ex, err := link.OpenExecutable(path)
	if err != nil {
		t.Fatal(err)
	}
	closeOK(t, a) // the same functions are attached again below
	made, errs := p.attachClass(ex, path, ClassSyncWait, append(fns, bad), nil)
	defer func() {
		if err := closeProbes(made); err != nil {
			t.Error(err)
		}
	}()
	if len(errs) != 1 || errs[bad.offset] == nil {
		t.Errorf("errors %v, want one for offset %#x", errs, bad.offset)
	}
	if len(made) != len(fns) {
		t.Fatalf("%d sets of links made, want one per good function (%d)", len(made), len(fns))
	}
	for _, pl := range made {
		if len(pl.fns) != 1 || pl.entry == nil || pl.ret == nil {
			t.Errorf("links of %d functions (entry %v, return %v), want one function's entry and return", len(pl.fns), pl.entry, pl.ret)
		}
	}
}

// TestSelectPrograms: with uprobe_multi only the shared programs are
// loaded (for uprobe_multi links), without it only the per-function ones
// (which kernels before 6.6 can load). Unprivileged: reads the object.
func TestSelectPrograms(t *testing.T) {
	for _, tc := range []struct {
		name       string
		multi      bool
		wantAttach ebpf.AttachType
	}{
		{"uprobe_multi links run the shared programs", true, ebpf.AttachTraceUprobeMulti},
		{"perf-event uprobes run the per-function programs", false, ebpf.AttachNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := loadSlowrank()
			if errors.Is(err, ErrNotSupported) {
				t.Skip(err)
			}
			if err != nil {
				t.Fatal(err)
			}
			selectPrograms(spec, tc.multi)
			want := map[string]bool{}
			for _, s := range specs {
				names := []string{s.Entry, s.Return}
				if tc.multi {
					names = []string{multiPrograms[s.Class].entry, multiPrograms[s.Class].ret}
				}
				for _, n := range names {
					if n != "" {
						want[n] = true
					}
				}
			}
			for name, ps := range spec.Programs {
				if !want[name] {
					t.Errorf("program %s kept", name)
				} else if ps.AttachType != tc.wantAttach {
					t.Errorf("program %s: attach type %v, want %v", name, ps.AttachType, tc.wantAttach)
				}
				delete(want, name)
			}
			for name := range want {
				t.Errorf("program %s dropped", name)
			}
		})
	}
}

// loadMulti loads the probes for uprobe_multi links, skipping on a kernel
// without them.
func loadMulti(t *testing.T) *Probes {
	t.Helper()
	if err := CheckUprobeMultiSupport(); err != nil {
		t.Skipf("kernel without uprobe_multi links: %v", err)
	}
	p, err := Load(Options{RingBufferSize: 1 << 20})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(func() { closeOK(t, p) })
	if !p.UprobeMulti() {
		t.Fatal("Load chose perf-event uprobes on a kernel with uprobe_multi")
	}
	return p
}

// checkClassLinks checks that a holds want links: for each class of fns
// one entry link with the class's functions and, unless the class is
// entry-only, one return link with those that have a return probe (not
// ncclGroupStart), each running the class's shared program.
func checkClassLinks(t *testing.T, p *Probes, a *Attachment, fns map[ProbeClass]int, want int) {
	t.Helper()
	a.mu.Lock()
	links := append([]probeLinks(nil), a.links...)
	a.mu.Unlock()
	total := 0
	seen := map[ProbeClass]bool{}
	for _, pl := range links {
		if seen[pl.class] {
			t.Errorf("%v: more than one set of links", pl.class)
		}
		seen[pl.class] = true
		if len(pl.fns) != fns[pl.class] {
			t.Errorf("%v: links of %d functions, want %d", pl.class, len(pl.fns), fns[pl.class])
		}
		mp := multiPrograms[pl.class]
		withReturn := 0
		for _, r := range pl.fns {
			if r.spec.Return != "" {
				withReturn++
			}
		}
		for _, dir := range []struct {
			l    link.Link
			prog string
			n    int // addresses
		}{{pl.entry, mp.entry, len(pl.fns)}, {pl.ret, mp.ret, withReturn}} {
			if (dir.l == nil) != (dir.prog == "") {
				t.Errorf("%v: link %v for shared program %q", pl.class, dir.l, dir.prog)
				continue
			}
			if dir.l == nil {
				continue
			}
			total++
			if got := len(multiOffsets(t, dir.l)); got != dir.n {
				t.Errorf("%v: a link of %d addresses, want %d", pl.class, got, dir.n)
			}
			info, err := dir.l.Info()
			if err != nil {
				t.Fatal(err)
			}
			pinfo, err := p.coll.Programs[dir.prog].Info()
			if err != nil {
				t.Fatal(err)
			}
			if id, _ := pinfo.ID(); info.Program != id {
				t.Errorf("%v: link runs program %d, want %s (%d)", pl.class, info.Program, dir.prog, id)
			}
		}
	}
	for c := range fns {
		if !seen[c] {
			t.Errorf("%v: no links", c)
		}
	}
	if total != want {
		t.Errorf("%d links, want %d", total, want)
	}
}

// multiOffsets are the addresses and cookies of uprobe_multi link l.
func multiOffsets(t *testing.T, l link.Link) []link.UprobeMultiOffset {
	t.Helper()
	if l == nil {
		return nil
	}
	info, err := l.Info()
	if err != nil {
		t.Fatalf("link info: %v", err)
	}
	um := info.UprobeMulti()
	if um == nil {
		t.Fatalf("link %d is not uprobe_multi (%v)", info.ID, info.Type)
	}
	offs, ok := um.Offsets()
	if !ok {
		t.Fatalf("link %d: the kernel gave no offsets and cookies", info.ID)
	}
	return offs
}
