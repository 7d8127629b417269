package bpf

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// BenchmarkProbeCost measures what a probed call costs the traced process,
// from a tight loop in the child (test/fakelibs/probechild.c `bench`):
//
//	entry:  ncclGroupStart, entry-only probe (a marker record)
//	pair:   cudaStreamSynchronize(no sleep), entry + return (one interval record)
//
// in three states: no uprobe, uprobe but process not tracked (filtered in
// BPF), tracked (record written and drained). The metric is ns/call of the
// child's loop; subtract the "none" variant for the probe's cost.
// noop/uprobe-return0 is the kernel's uprobe cost with an empty program.
//
//	go test -run '^$' -bench ProbeCost ./bpf/
func BenchmarkProbeCost(b *testing.B) {
	requireBPF(b)
	dir := fakeLibs(b)
	p, err := Load(Options{RingBufferSize: 16 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer closeOK(b, p)
	r, err := p.NewReader()
	if err != nil {
		b.Fatal(err)
	}
	go func() { // drain
		for {
			if _, err := r.Read(); errors.Is(err, ErrClosed) {
				return
			}
		}
	}()
	c := startChild(b, dir)

	run := func(name, kind string) {
		b.Run(name, func(b *testing.B) {
			c.send(fmt.Sprintf("bench %s %d", kind, b.N))
			var ns int64
			if _, err := fmt.Sscanf(c.line(), "ns %d", &ns); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(ns)/float64(b.N), "ns/call")
		})
	}
	run("entry/none", "entry")
	run("pair/none", "pair")

	// Calibration: the kernel's uprobe cost alone, with a program that only
	// returns 0, on a function of the same library.
	trivial, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.Kprobe, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		b.Fatal(err)
	}
	defer trivial.Close()
	ex, err := link.OpenExecutable(filepath.Join(dir, "libnccl.so.2"))
	if err != nil {
		b.Fatal(err)
	}
	tl, err := ex.Uprobe("slowrank_fake_nccl_noop", trivial, nil)
	if err != nil {
		b.Fatal(err)
	}
	run("noop/uprobe-return0", "noop")
	tl.Close()

	for _, l := range []struct {
		name string
		kind LibKind
	}{{"libnccl.so.2", LibNCCL}, {"libcudart.so.13", LibCUDART}} {
		if _, err := p.AttachLibrary(LibSource{Path: filepath.Join(dir, l.name)}, l.kind); err != nil {
			b.Fatal(err)
		}
	}
	run("entry/filtered", "entry")
	run("pair/filtered", "pair")
	if err := p.Track(uint32(c.pid), 0); err != nil {
		b.Fatal(err)
	}
	run("entry/tracked", "entry")
	run("pair/tracked", "pair")
	if st, err := p.Stats(); err == nil {
		b.Logf("stats: events %d lost %d missing %d", st.Events, st.Lost(), st.MissingEntry)
	}
}

// BenchmarkDetach measures attaching and then detaching every fake library
// (all functions, entry and return probes), per kind of uprobe link: what an
// agent stop or an idle library's detach costs in wall time.
//
//	go test -run '^$' -bench Detach -benchtime 3x ./bpf/
func BenchmarkDetach(b *testing.B) {
	requireBPF(b)
	dir := fakeLibs(b)
	libs := map[LibKind]string{LibNCCL: "libnccl.so.2", LibCUDART: "libcudart.so.13", LibCUDA: "libcuda.so.1", LibTorch: "libtorch_cpu.so"}
	for _, mode := range []struct {
		name   string
		single bool
	}{{"uprobe_multi", false}, {"perf_event", true}} {
		b.Run(mode.name, func(b *testing.B) {
			p, err := Load(Options{SingleUprobes: mode.single})
			if err != nil {
				b.Fatal(err)
			}
			defer closeOK(b, p)
			if !mode.single && !p.UprobeMulti() {
				b.Skip("kernel without uprobe_multi links")
			}
			for b.Loop() {
				b.StopTimer()
				var atts []*Attachment
				for kind, name := range libs {
					a, err := p.AttachLibrary(LibSource{Path: filepath.Join(dir, name)}, kind)
					if err != nil {
						b.Fatal(err)
					}
					atts = append(atts, a)
				}
				b.StartTimer()
				for _, a := range atts {
					if err := a.Close(); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
