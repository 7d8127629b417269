package bpf

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// AttachStatus is the outcome for one symbol of one library.
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type AttachStatus -linecomment
type AttachStatus uint8

// Attach outcomes. The line comments are the String() names (stringer
// -linecomment, attachstatus_string.go), shown by the CLI and the logs.
//
// StatusMissing: symbol not in the library (see ProbeSpec.Optional).
// StatusDuplicate: same function already attached through another spec.
// StatusFailed: symbol found, uprobe creation failed (SymbolResult.Err).
const (
	StatusAttached  AttachStatus = iota + 1 // attached
	StatusMissing                           // missing
	StatusDuplicate                         // duplicate
	StatusFailed                            // failed
)

// SymbolResult is the outcome of one spec (one overload for C++ names).
type SymbolResult struct {
	Spec    ProbeSpec
	ELFName string // matched symbol (mangled for C++); empty when missing
	Offset  uint64 // file offset of the function
	Status  AttachStatus
	Err     error // for StatusFailed
}

// Attachment is the set of uprobes of one library file, for all processes.
// Close it when no tracked process maps the file any more (or let
// Probes.Close do it).
type Attachment struct {
	Path      string
	Kind      LibKind
	Stripped  bool // no .symtab: only exported (dynamic) symbols were searched
	NoSymbols bool // neither .symtab nor .dynsym: nothing can be attached
	// RefCtrOffset is the file offset of the semaphore used as uprobe
	// reference counter (CUPTI), 0 when none.
	RefCtrOffset uint64
	// RefCtrErr says why the reference counter is unusable (RefCtrOffset is
	// 0, the probe is attached without one, the semaphore stays 0) or
	// unreliable (RefCtrOffset is set, e.g. a semaphore in .bss).
	RefCtrErr error
	Results   []SymbolResult

	p     *Probes
	mu    sync.Mutex
	links []probeLinks
	// parked are the functions whose uprobes DetachClass closed, kept so
	// that ReattachClass can make them again without reading the ELF.
	parked []resolved
	closed bool
}

// probeLinks are the uprobes of one function.
type probeLinks struct {
	fn         resolved
	entry, ret link.Link // ret is nil for entry-only probes
}

// Attached is the number of functions with live uprobes.
func (a *Attachment) Attached() int { return a.countStatus(StatusAttached) }

// Missing returns the specs whose symbol was not found; required reports
// whether any of them was not optional.
func (a *Attachment) Missing() (specs []ProbeSpec, required bool) {
	for _, r := range a.Results {
		if r.Status == StatusMissing {
			specs = append(specs, r.Spec)
			required = required || !r.Spec.Optional
		}
	}
	return specs, required
}

func (a *Attachment) countStatus(s AttachStatus) int {
	n := 0
	for _, r := range a.Results {
		if r.Status == s {
			n++
		}
	}
	return n
}

// Close detaches every uprobe of the library (for a CUPTI library the
// semaphore drops back to 0). Closing twice is a no-op.
func (a *Attachment) Close() error {
	a.p.forget(a)
	return a.close()
}

func (a *Attachment) close() error {
	a.mu.Lock()
	links := a.links
	a.links, a.parked, a.closed = nil, nil, true
	a.mu.Unlock()
	return closeProbes(links)
}

// closeProbes closes the uprobes of links.
func closeProbes(links []probeLinks) error {
	var entries, returns []link.Link
	for _, l := range links {
		entries = append(entries, l.entry)
		if l.ret != nil {
			returns = append(returns, l.ret)
		}
	}
	// Entries first: a call that starts after its entry probe is gone leaves
	// no pending entry behind (at worst a counted MissingEntry).
	return errors.Join(closeLinks(entries), closeLinks(returns))
}

// closeLinks closes uprobe links concurrently. Each close waits for kernel
// grace periods; concurrent uprobe_multi closes share them (perf-event
// uprobes are torn down one after another whatever we do, see
// useUprobeMulti).
func closeLinks(links []link.Link) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, l := range links {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Close(); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("close uprobe: %w", err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// AttachLibrary attaches every spec of kind that exists in the ELF file at
// path, once, for all processes (the kernel keys uprobes by inode: callers
// should dedupe by (dev, inode) and may pass /proc/PID/root/<path> to reach a
// file in another mount namespace). Missing symbols and a stripped library
// are reported in the result and counted, not returned as errors. An error is
// returned when the file cannot be read as ELF, or when symbols were found
// but none could be attached (then nothing stays attached).
func (p *Probes) AttachLibrary(path string, kind LibKind) (*Attachment, error) {
	var kindSpecs []ProbeSpec
	for _, s := range specs {
		if s.Kind == kind {
			kindSpecs = append(kindSpecs, s)
		}
	}
	if len(kindSpecs) == 0 {
		return nil, fmt.Errorf("attach %s: unknown library kind %d", path, kind)
	}
	w, err := newSymbolWanter(kindSpecs)
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", path, err)
	}
	ls, err := loadLibSymbols(path, w)
	if err != nil {
		return nil, fmt.Errorf("read symbols of %s: %w", path, err)
	}
	ex, err := link.OpenExecutable(path)
	if err != nil {
		return nil, fmt.Errorf("open executable: %w", err)
	}

	a := &Attachment{Path: path, Kind: kind, Stripped: !ls.hasSymtab, NoSymbols: !ls.hasSymtab && !ls.hasDynsym, p: p}
	found, missing := resolve(kindSpecs, ls)
	seen := map[uint64]bool{}
	var firstErr error
	for _, r := range found {
		res := SymbolResult{Spec: r.spec, ELFName: r.elfName, Offset: r.offset}
		switch {
		case seen[r.offset]:
			res.Status = StatusDuplicate
		default:
			seen[r.offset] = true
			if err := a.attachOne(ex, r, ls); err != nil {
				res.Status, res.Err = StatusFailed, err
				if firstErr == nil {
					firstErr = err
				}
			} else {
				res.Status = StatusAttached
			}
		}
		a.Results = append(a.Results, res)
	}
	for _, s := range missing {
		a.Results = append(a.Results, SymbolResult{Spec: s, Status: StatusMissing})
	}

	attached, failed := a.Attached(), a.countStatus(StatusFailed)
	p.symbolsMissing.Add(uint64(len(missing)))
	p.attachErrors.Add(uint64(failed))
	if a.Stripped {
		p.libsStripped.Add(1)
	}
	if a.NoSymbols {
		p.libsNoSymbols.Add(1)
	}
	if attached == 0 && firstErr != nil {
		a.close()
		return nil, fmt.Errorf("attach %s (%s): %w", path, kind, firstErr)
	}

	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		a.close()
		return nil, fmt.Errorf("attach %s: probes are closed", path)
	}
	p.attachments[a] = struct{}{}
	p.mu.Unlock()
	p.symbolsAttached.Add(uint64(attached))
	if attached > 0 {
		p.libsAttached.Add(1)
	}

	log := p.log.With("path", path, "kind", kind.String())
	for _, r := range a.Results {
		switch {
		case r.Status == StatusFailed:
			log.Warn("uprobe attach failed", "symbol", r.Spec.Name(), "err", r.Err)
		case r.Status == StatusMissing && !r.Spec.Optional:
			log.Warn("required symbol missing", "symbol", r.Spec.Name())
		case r.Status == StatusMissing:
			log.Debug("optional symbol missing", "symbol", r.Spec.Name())
		}
	}
	log.Debug("library attached", "attached", attached, "missing", len(missing), "failed", failed, "stripped", a.Stripped)
	return a, nil
}

// attachOne creates the return (if any) and then the entry uprobe of one
// resolved function. Return first: a uretprobe only fires for calls that
// entered after it existed, so no entry is ever left without its return
// (a call racing the attach shows up as MissingEntry, never as a stale entry).
func (a *Attachment) attachOne(ex *link.Executable, r resolved, ls *libSymbols) error {
	var refCtr uint64
	if r.spec.RefCtr != "" {
		off, ok := ls.objects[r.spec.RefCtr]
		if ok {
			refCtr = off
			a.RefCtrOffset = off
		}
		a.RefCtrErr = ls.objErrs[r.spec.RefCtr]
		if !ok && a.RefCtrErr == nil {
			a.RefCtrErr = fmt.Errorf("symbol %s: %w", r.spec.RefCtr, link.ErrNoSymbol)
		}
		if a.RefCtrErr != nil {
			a.p.log.Warn("uprobe reference counter unusable or unreliable", "path", a.Path, "err", a.RefCtrErr)
		}
	}
	pl, err := a.p.probeLinks(ex, r, refCtr)
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.links = append(a.links, pl)
	a.mu.Unlock()
	return nil
}

// probeLinks creates the return (if any) and then the entry uprobe of r.
func (p *Probes) probeLinks(ex *link.Executable, r resolved, refCtr uint64) (probeLinks, error) {
	pl := probeLinks{fn: r}
	entry := p.coll.Programs[r.spec.Entry]
	if entry == nil {
		return pl, fmt.Errorf("program %q not in bpf object", r.spec.Entry)
	}
	var ret *ebpf.Program
	if r.spec.Return != "" {
		if ret = p.coll.Programs[r.spec.Return]; ret == nil {
			return pl, fmt.Errorf("program %q not in bpf object", r.spec.Return)
		}
		rl, err := p.uprobe(ex, r, ret, true, 0)
		if err != nil {
			return pl, classify("uretprobe "+r.elfName, err)
		}
		pl.ret = rl
	}
	l, err := p.uprobe(ex, r, entry, false, refCtr)
	if err != nil {
		if pl.ret != nil {
			pl.ret.Close()
		}
		return pl, classify("uprobe "+r.elfName, err)
	}
	pl.entry = l
	return pl, nil
}

// uprobe creates one entry or return probe at the resolved function: a
// uprobe_multi link of one address where the programs were loaded for it,
// else a perf-event uprobe. refCtr is the semaphore's file offset, 0 for none.
func (p *Probes) uprobe(ex *link.Executable, r resolved, prog *ebpf.Program, ret bool, refCtr uint64) (link.Link, error) {
	if !p.multi {
		opts := &link.UprobeOptions{Address: r.offset, RefCtrOffset: refCtr}
		if ret {
			return ex.Uretprobe(r.elfName, prog, opts)
		}
		return ex.Uprobe(r.elfName, prog, opts)
	}
	opts := &link.UprobeMultiOptions{Addresses: []uint64{r.offset}}
	if refCtr != 0 {
		opts.RefCtrOffsets = []uint64{refCtr}
	}
	if ret {
		return ex.UretprobeMulti(nil, prog, opts)
	}
	return ex.UprobeMulti(nil, prog, opts)
}
