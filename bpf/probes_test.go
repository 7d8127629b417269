package bpf

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// Every spec names programs that exist with the right section, and every
// program of the object is used by a spec.
func TestSpecsMatchObject(t *testing.T) {
	spec, err := loadSlowrank()
	if errors.Is(err, ErrNotSupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, s := range specs {
		for _, name := range []string{s.Entry, s.Return} {
			if name == "" {
				continue
			}
			used[name] = true
			ps := spec.Programs[name]
			if ps == nil {
				t.Errorf("%s: program %q not in object", s.Name(), name)
				continue
			}
			wantSec := "uprobe"
			if name == s.Return {
				wantSec = "uretprobe"
			}
			if ps.Type != ebpf.Kprobe || ps.SectionName != wantSec {
				t.Errorf("%s: %s is %v in %q, want kprobe in %q", s.Name(), name, ps.Type, ps.SectionName, wantSec)
			}
		}
		mp, ok := multiPrograms[s.Class]
		if !ok {
			t.Errorf("%s: class %v has no shared programs", s.Name(), s.Class)
		}
		for name, wantSec := range map[string]string{mp.entry: "uprobe.multi", mp.ret: "uretprobe.multi"} {
			if name == "" {
				continue
			}
			used[name] = true
			if ps := spec.Programs[name]; ps == nil || ps.Type != ebpf.Kprobe || ps.SectionName != wantSec {
				t.Errorf("%s: shared program %q is %+v, want kprobe in %q", s.Name(), name, ps, wantSec)
			}
		}
		if s.Return != "" && mp.ret == "" {
			t.Errorf("%s: a return probe in class %v, whose shared links have no return program", s.Name(), s.Class)
		}
		if s.ID.EventType() == 0 {
			t.Errorf("%s: probe id %d maps to no event type", s.Name(), uint32(s.ID))
		}
		if (s.Symbol == "") == (s.Qualified == "") {
			t.Errorf("spec %d: exactly one of Symbol and Qualified must be set", s.ID)
		}
		if s.Qualified != "" {
			if _, err := mangledPrefixes(s.Qualified); err != nil {
				t.Error(err)
			}
		}
		// Only markers, the CUPTI batch and libcupti calls are entry-only.
		entryOnly := s.ID == ProbeNCCLGroupStart || s.ID == ProbeCUPTIEmit || s.ID.EventType() == EventCUPTICall
		if entryOnly != (s.Return == "") {
			t.Errorf("%s: entry-only is %v", s.Name(), s.Return == "")
		}
	}
	for name := range spec.Programs {
		if !used[name] {
			t.Errorf("program %q is used by no spec", name)
		}
	}
}

func TestSpecsUnique(t *testing.T) {
	seen := map[string]bool{}
	progs := map[string]ProbeID{}
	for _, s := range specs {
		key := s.Kind.String() + "/" + s.Name()
		if seen[key] {
			t.Errorf("duplicate spec %s", key)
		}
		seen[key] = true
		// Alternate spellings may share programs only with the same id.
		if id, ok := progs[s.Entry]; ok && id != s.ID {
			t.Errorf("program %s shared by ids %d and %d", s.Entry, id, s.ID)
		}
		progs[s.Entry] = s.ID
	}
}

func TestPrepareSpec(t *testing.T) {
	for _, tc := range []struct {
		opts    Options
		ring    uint32
		wantErr bool
	}{
		{Options{}, DefaultRingBufferSize, false},
		{Options{RingBufferSize: 1 << 16}, 1 << 16, false},
		{Options{RingBufferSize: 3 << 16}, 0, true},
		{Options{RingBufferSize: 1024}, 0, true},
		{Options{RingBufferSize: -4096}, 0, true},
		{Options{InflightEntries: -1}, 0, true},
		{Options{MaxTracked: 1 << 30}, 0, true},
		{Options{WakeupBytes: -1}, 0, true},
		{Options{PollInterval: -1}, 0, true},
	} {
		spec, err := loadSlowrank()
		if errors.Is(err, ErrNotSupported) {
			t.Skip(err)
		}
		if err != nil {
			t.Fatal(err)
		}
		err = prepareSpec(spec, tc.opts)
		if (err != nil) != tc.wantErr {
			t.Errorf("%+v: err %v, wantErr %v", tc.opts, err, tc.wantErr)
			continue
		}
		if err == nil && spec.Maps["events"].MaxEntries != tc.ring {
			t.Errorf("%+v: ring %d, want %d", tc.opts, spec.Maps["events"].MaxEntries, tc.ring)
		}
	}
}

func TestClassifyLibrary(t *testing.T) {
	for path, want := range map[string]LibKind{
		"/usr/lib/x86_64-linux-gnu/libnccl.so.2":                              LibNCCL,
		"/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2": LibNCCL,
		"/opt/rocm/lib/librccl.so.1.0":                                        LibNCCL,
		"/usr/local/cuda/lib64/libcudart.so.13.0.48":                          LibCUDART,
		"/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06":                      LibCUDA,
		"/usr/lib/x86_64-linux-gnu/libcuda.so.1":                              LibCUDA,
		"/venv/torch/lib/libtorch_cuda.so":                                    LibTorch,
		"/venv/torch/lib/libtorch_cpu.so":                                     LibTorch,
		"/opt/slowrank/lib/libslowrank_cupti.so":                              LibCUPTI,
		"/usr/lib/libcudnn.so.9":                                              0,
		"/usr/lib/libcuda_wrapper.so":                                         0,
		"/usr/lib/libcudart_static.a":                                         0,
		"/usr/lib/libtorch.so":                                                0,
		"/usr/lib/libnccl-net.so":                                             0,
	} {
		got, ok := ClassifyLibrary(path)
		if got != want || ok != (want != 0) {
			t.Errorf("ClassifyLibrary(%s) = %v, %v; want %v", path, got, ok, want)
		}
	}
}

func TestMangledPrefixes(t *testing.T) {
	got, err := mangledPrefixes("c10d::ProcessGroupNCCL::_allgather_base")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"_ZN4c10d16ProcessGroupNCCL15_allgather_baseE", "_ZNK4c10d16ProcessGroupNCCL15_allgather_baseE"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"allreduce", "c10d::", "c10d::Foo<int>::bar", "c10d::operator()"} {
		if _, err := mangledPrefixes(bad); err == nil {
			t.Errorf("mangledPrefixes(%q) succeeded", bad)
		}
	}
}

func TestResolve(t *testing.T) {
	ls := &libSymbols{funcs: map[string]uint64{
		"ncclAllReduce": 0x1000,
		// Two overloads, a cold clone and a similarly named method.
		"_ZN4c10d16ProcessGroupGloo9allreduceERSt6vectorIN2at6TensorESaIS3_EERKNS_16AllreduceOptionsE":                     0x2000,
		"_ZN4c10d16ProcessGroupGloo9allreduceERSt6vectorIN2at6TensorESaIS3_EE":                                             0x2100,
		"_ZN4c10d16ProcessGroupGloo9allreduceERSt6vectorIN2at6TensorESaIS3_EERKNS_16AllreduceOptionsE.cold":                0x2200,
		"_ZN4c10d16ProcessGroupGloo19allreduce_coalescedERSt6vectorIN2at6TensorESaIS3_EERKNS_25AllreduceCoalescedOptionsE": 0x3000,
	}}
	in := []ProbeSpec{
		{ID: ProbeNCCLAllReduce, Symbol: "ncclAllReduce"},
		{ID: ProbeNCCLBroadcast, Symbol: "ncclBroadcast"},
		{ID: ProbeTorchGlooAllreduce, Qualified: "c10d::ProcessGroupGloo::allreduce"},
		{ID: ProbeTorchGlooAllreduceCoalesced, Qualified: "c10d::ProcessGroupGloo::allreduce_coalesced"},
	}
	found, missing := resolve(in, ls)
	var got []string
	for _, r := range found {
		got = append(got, r.spec.ID.String()+"@"+strings.TrimPrefix(r.elfName, "_ZN4c10d16ProcessGroupGloo"))
	}
	want := []string{
		"ncclAllReduce@ncclAllReduce",
		"c10d::ProcessGroupGloo::allreduce@9allreduceERSt6vectorIN2at6TensorESaIS3_EE",
		"c10d::ProcessGroupGloo::allreduce@9allreduceERSt6vectorIN2at6TensorESaIS3_EERKNS_16AllreduceOptionsE",
		"c10d::ProcessGroupGloo::allreduce_coalesced@19allreduce_coalescedERSt6vectorIN2at6TensorESaIS3_EERKNS_25AllreduceCoalescedOptionsE",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("found:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(missing) != 1 || missing[0].ID != ProbeNCCLBroadcast {
		t.Errorf("missing = %v", missing)
	}
}

func TestProbeIDString(t *testing.T) {
	if s := ProbeNCCLAllReduce.String(); s != "ncclAllReduce" {
		t.Errorf("got %q", s)
	}
	if s := ProbeNCCLAllToAll.String(); s != "ncclAlltoAll" {
		t.Errorf("got %q", s)
	}
	if s := ProbeTorchNCCLBarrier.String(); s != "c10d::ProcessGroupNCCL::barrier" {
		t.Errorf("got %q", s)
	}
	if s := ProbeID(999).String(); s != "ProbeID(999)" {
		t.Errorf("got %q", s)
	}
}

// c10::ivalue::Future::wait() (what DDP's reducer waits on) resolves to its
// torch 2.x mangled name, and not to the other Future methods whose names
// start alike (waitAndThrow is deliberately not probed).
func TestFutureWaitSpec(t *testing.T) {
	var spec ProbeSpec
	for _, s := range specs {
		if s.ID == ProbeTorchFutureWait {
			spec = s
		}
	}
	if spec.Qualified != "c10::ivalue::Future::wait" || spec.Kind != LibTorch || spec.SelfArg != 0 || !spec.Optional {
		t.Fatalf("Future::wait spec %+v", spec)
	}
	ls := &libSymbols{funcs: map[string]uint64{
		"_ZN3c106ivalue6Future4waitEv":                                    0x1000,
		"_ZN3c106ivalue6Future12waitAndThrowEv":                           0x2000,
		"_ZN3c106ivalue6Future13markCompletedEv":                          0x3000,
		"_ZN3c106ivalue6Future4waitEv.cold":                               0x4000,
		"_ZN4c10d4Work4waitENSt6chrono8durationIlSt5ratioILl1ELl1000EEEE": 0x5000,
	}}
	found, missing := resolve([]ProbeSpec{spec}, ls)
	if len(missing) != 0 || len(found) != 1 || found[0].elfName != "_ZN3c106ivalue6Future4waitEv" || found[0].offset != 0x1000 {
		t.Errorf("found %+v, missing %v", found, missing)
	}
	if s := ProbeTorchFutureWait.String(); s != "c10::ivalue::Future::wait" {
		t.Errorf("String() = %q", s)
	}
	if ProbeTorchFutureWait.EventType() != EventTorch {
		t.Errorf("event type %v", ProbeTorchFutureWait.EventType())
	}
}
