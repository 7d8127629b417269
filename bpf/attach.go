package bpf

import (
	"errors"
	"fmt"
	"maps"
	"sync"

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
	Path string
	// File is the file attached as /proc/PID/maps shows it (LibSource.Want;
	// fstat's where Want was zero): a re-attach through a path must open
	// it.
	File      FileID
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

// probeLinks are the uprobes of functions of one class: with uprobe_multi,
// one link per direction carries every function of the class in the library
// (or, where that link failed, one function); with perf-event uprobes, one
// function.
type probeLinks struct {
	class      ProbeClass
	fns        []resolved
	entry, ret link.Link // ret is nil when no function has a return probe
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
// selectPrograms).
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

// AttachLibrary attaches every spec of kind that exists in the ELF file src
// names, once, for all processes (the kernel keys uprobes by inode: callers
// should dedupe by (dev, inode)). The file is opened once, through the
// mapping (src.MapFiles) or, where that fails, through src.Path, which must
// then open src.Want, the file as /proc/PID/maps shows it (else
// ErrFileChanged, counted in Stats.FilesRefused); the symbols are read
// from, and the uprobes made on, that one open file (libfile.go). Missing
// symbols and a stripped library are reported in the result and counted,
// not returned as errors. An error is returned when the file cannot be read
// as ELF, or when symbols were found but none could be attached (then
// nothing stays attached).
func (p *Probes) AttachLibrary(src LibSource, kind LibKind) (*Attachment, error) {
	path := src.Path
	if path == "" {
		path = src.MapFiles
	}
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
	lf, err := p.openLibFile(src)
	if err != nil {
		return nil, err
	}
	defer lf.Close() // the uprobes hold the inode, not the descriptor
	ls, err := readLibSymbols(lf, w)
	if err != nil {
		return nil, fmt.Errorf("read symbols of %s: %w", path, err)
	}
	ex, err := link.OpenExecutable(lf.attachPath())
	if err != nil {
		return nil, fmt.Errorf("open executable: %w", err)
	}

	a := &Attachment{Path: path, File: src.Want, Kind: kind, Stripped: !ls.hasSymtab, NoSymbols: !ls.hasSymtab && !ls.hasDynsym, p: p}
	if a.File == (FileID{}) {
		a.File = lf.id
	}
	found, missing := resolve(kindSpecs, ls)
	a.Results = make([]SymbolResult, 0, len(found)+len(missing))
	var todo []resolved
	at := map[uint64]int{} // offset -> index of its result
	for _, r := range found {
		res := SymbolResult{Spec: r.spec, ELFName: r.elfName, Offset: r.offset}
		if _, dup := at[r.offset]; dup {
			res.Status = StatusDuplicate
		} else {
			at[r.offset] = len(a.Results)
			todo = append(todo, r)
		}
		a.Results = append(a.Results, res)
	}
	made, errs := p.attachClasses(ex, path, todo, a.refCtrs(todo, ls))
	a.links = made
	var firstErr error
	for _, r := range todo {
		res := &a.Results[at[r.offset]]
		if err := errs[r.offset]; err != nil {
			res.Status, res.Err = StatusFailed, err
			if firstErr == nil {
				firstErr = err
			}
		} else {
			res.Status = StatusAttached
		}
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
		_ = a.close() // whatever was made of it: the attach's error is the one to return
		return nil, fmt.Errorf("attach %s (%s): %w", path, kind, firstErr)
	}

	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = a.close() // the probes closed under it: that is the error to return
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

// refCtrs are the reference counter offsets of the functions of fns whose
// spec names one (the CUPTI probe's semaphore), by function offset; it
// records the offset, or why it is unusable, in a.
func (a *Attachment) refCtrs(fns []resolved, ls *libSymbols) map[uint64]uint64 {
	out := map[uint64]uint64{}
	for _, r := range fns {
		if r.spec.RefCtr == "" {
			continue
		}
		off, ok := ls.objects[r.spec.RefCtr]
		if ok {
			out[r.offset] = off
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
	return out
}

// attachClasses makes the uprobes of fns, class by class (attachClass), in
// the order of their first function. refCtrs are the reference counters by
// function offset. It returns the links made and, by function offset, the
// error of each function it could not attach.
func (p *Probes) attachClasses(ex *link.Executable, path string, fns []resolved, refCtrs map[uint64]uint64) ([]probeLinks, map[uint64]error) {
	var classes []ProbeClass
	byClass := map[ProbeClass][]resolved{}
	for _, r := range fns {
		c := r.spec.Class
		if _, ok := byClass[c]; !ok {
			classes = append(classes, c)
		}
		byClass[c] = append(byClass[c], r)
	}
	var made []probeLinks
	errs := map[uint64]error{}
	for _, c := range classes {
		m, e := p.attachClass(ex, path, c, byClass[c], refCtrs)
		made = append(made, m...)
		maps.Copy(errs, e)
	}
	return made, errs
}

// attachClass makes the uprobes of fns, all of class: with uprobe_multi, one
// link per direction for all of them, and where that fails, one per
// function (a function that cannot be probed, or a file another agent is
// registering uprobes on, does not take the others down); with perf-event
// uprobes, one per function. It returns the links made and the errors of the
// functions not attached, by offset.
func (p *Probes) attachClass(ex *link.Executable, path string, class ProbeClass, fns []resolved, refCtrs map[uint64]uint64) ([]probeLinks, map[uint64]error) {
	errs := map[uint64]error{}
	if p.multi && len(fns) > 1 {
		pl, err := p.multiLinks(ex, class, fns, refCtrs)
		if err == nil {
			return []probeLinks{pl}, errs
		}
		p.log.Warn("shared uprobe link failed: attaching the class function by function",
			"path", path, "class", class.String(), "functions", len(fns), "err", err)
	}
	var made []probeLinks
	for _, r := range fns {
		var pl probeLinks
		var err error
		if p.multi {
			pl, err = p.multiLinks(ex, class, []resolved{r}, refCtrs)
		} else {
			pl, err = p.singleLinks(ex, r, refCtrs[r.offset])
		}
		if err != nil {
			errs[r.offset] = err
			continue
		}
		made = append(made, pl)
	}
	return made, errs
}

// multiLinks creates the uprobe_multi links of fns, all of class: the
// return link (of the functions with a return probe) and then the entry
// link, each running the class's shared program (multiPrograms) with one
// attach cookie per function (multiCookie). Return first: a uretprobe only
// fires for calls that entered after it existed, so no entry is ever left
// without its return (a call racing the attach shows up as MissingEntry,
// never as a stale entry).
func (p *Probes) multiLinks(ex *link.Executable, class ProbeClass, fns []resolved, refCtrs map[uint64]uint64) (probeLinks, error) {
	pl := probeLinks{class: class, fns: fns}
	progs := multiPrograms[class]
	entry := p.coll.Programs[progs.entry]
	if entry == nil {
		return pl, fmt.Errorf("no shared entry program for class %v in bpf object", class)
	}
	what := "uprobe_multi link of " + fns[0].elfName
	if len(fns) > 1 {
		what = fmt.Sprintf("uprobe_multi link of %d %v functions", len(fns), class)
	}
	var entryOpts, retOpts link.UprobeMultiOptions
	withRefCtr := false
	for _, r := range fns {
		cookie := multiCookie(r.spec)
		entryOpts.Addresses = append(entryOpts.Addresses, r.offset)
		entryOpts.Cookies = append(entryOpts.Cookies, cookie)
		entryOpts.RefCtrOffsets = append(entryOpts.RefCtrOffsets, refCtrs[r.offset])
		withRefCtr = withRefCtr || refCtrs[r.offset] != 0
		if r.spec.Return != "" {
			retOpts.Addresses = append(retOpts.Addresses, r.offset)
			retOpts.Cookies = append(retOpts.Cookies, cookie)
		}
	}
	if !withRefCtr {
		entryOpts.RefCtrOffsets = nil
	}
	if len(retOpts.Addresses) > 0 {
		ret := p.coll.Programs[progs.ret]
		if ret == nil {
			return pl, fmt.Errorf("no shared return program for class %v in bpf object", class)
		}
		l, err := ex.UretprobeMulti(nil, ret, &retOpts)
		if err != nil {
			return pl, classify("return "+what, err)
		}
		pl.ret = l
	}
	l, err := ex.UprobeMulti(nil, entry, &entryOpts)
	if err != nil {
		if pl.ret != nil {
			pl.ret.Close()
		}
		return pl, classify(what, err)
	}
	pl.entry = l
	return pl, nil
}

// singleLinks creates the perf-event uprobes of r, running its own programs:
// the return probe (if any) and then the entry probe, for the reason
// multiLinks gives. refCtr is the semaphore's file offset, 0 for none.
func (p *Probes) singleLinks(ex *link.Executable, r resolved, refCtr uint64) (probeLinks, error) {
	pl := probeLinks{class: r.spec.Class, fns: []resolved{r}}
	entry := p.coll.Programs[r.spec.Entry]
	if entry == nil {
		return pl, fmt.Errorf("program %q not in bpf object", r.spec.Entry)
	}
	if r.spec.Return != "" {
		ret := p.coll.Programs[r.spec.Return]
		if ret == nil {
			return pl, fmt.Errorf("program %q not in bpf object", r.spec.Return)
		}
		rl, err := ex.Uretprobe(r.elfName, ret, &link.UprobeOptions{Address: r.offset})
		if err != nil {
			return pl, classify("uretprobe "+r.elfName, err)
		}
		pl.ret = rl
	}
	l, err := ex.Uprobe(r.elfName, entry, &link.UprobeOptions{Address: r.offset, RefCtrOffset: refCtr})
	if err != nil {
		if pl.ret != nil {
			pl.ret.Close()
		}
		return pl, classify("uprobe "+r.elfName, err)
	}
	pl.entry = l
	return pl, nil
}
