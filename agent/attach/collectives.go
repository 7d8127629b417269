package attach

// A library whose collectives every user process reports another way (NCCL's
// profiler plugin, docs/nccl-profiler-plugin.md §7) need not trap them: a
// uprobe traps in every process that maps the file, whatever BPF then
// filters. The owner says which processes report their collectives another
// way (SetPlugin); for a file whose every user does, the manager closes the
// collective probes of its attachment, and makes them again as soon as a
// user that does not maps it or one falls back. One change per file is in
// flight at a time, off the owner goroutine (closing waits for kernel grace
// periods); its outcome comes back on Config.Deliver like an attach's, and
// the file's state is judged again then.

// Partial is a Link whose collective probes can be closed and made again
// while its other probes stay attached. Only such links are ever changed.
type Partial[F comparable] interface {
	Link
	// DetachCollectives closes the collective probes.
	DetachCollectives() error
	// ReattachCollectives makes them again, opening the file through via,
	// a live user's mapping of it (Library.MapFiles, else Library.Open).
	ReattachCollectives(via Library[F]) error
}

// SetPlugin records whether process p reports its collectives another way,
// and detaches or re-attaches the collective probes of the files it maps
// where that changes what their users need.
func (m *Manager[F, P]) SetPlugin(p P, on bool) {
	for _, e := range m.libs {
		if _, uses := e.users[p]; !uses || e.plugin[p] == on {
			continue
		}
		if on {
			if e.plugin == nil {
				e.plugin = map[P]bool{}
			}
			e.plugin[p] = true
		} else {
			delete(e.plugin, p)
		}
		m.judge(e)
	}
}

// judge starts the change e's users need, unless one is in flight (its
// outcome judges again).
func (m *Manager[F, P]) judge(e *entry[F, P]) {
	part, ok := e.link.(Partial[F])
	if !ok || e.changing {
		return
	}
	off := m.allPlugin(e)
	if off == e.collOff || off && e.noDetach {
		return
	}
	var (
		viaUser P
		via     Library[F]
	)
	if !off {
		viaUser, via = m.needing(e)
		if e.blindSince == 0 {
			e.blindSince = m.cfg.Now()
		}
	}
	e.changing = true
	m.closing.Add(1)
	go func() {
		defer m.closing.Done()
		var err error
		if off {
			err = part.DetachCollectives()
		} else {
			err = part.ReattachCollectives(via)
		}
		select {
		case m.cfg.Deliver <- func() { m.changed(e, off, viaUser, err) }:
		case <-m.stop:
		}
	}()
}

// allPlugin: e has users and every one reports its collectives another way.
func (m *Manager[F, P]) allPlugin(e *entry[F, P]) bool {
	if len(e.users) == 0 {
		return e.collOff // no user needs anything: stay as is until one comes
	}
	for p := range e.users {
		if !e.plugin[p] {
			return false
		}
	}
	return true
}

// needing returns a user that needs the collective probes, and its
// mapping, through which they are made again (pick).
func (m *Manager[F, P]) needing(e *entry[F, P]) (P, Library[F]) {
	return e.pick(func(p P) bool { return !e.plugin[p] })
}

// changed takes the outcome of a detach (off) or re-attach (through user
// via) of e's collective probes. A failed re-attach is tried again on the next tick
// (RetryFailed): a user needs them. After a failed detach the file is not
// detached again: its probes may still trap, nothing is lost.
func (m *Manager[F, P]) changed(e *entry[F, P], off bool, via P, err error) {
	e.changing = false
	if !off && err != nil {
		if e.viaFailed == nil {
			e.viaFailed = map[P]bool{}
		}
		e.viaFailed[via] = true // the next try goes through another user
	} else if !off {
		e.viaFailed = nil
	}
	switch {
	case err != nil && off:
		// Parked all the same (bpf.Attachment.DetachClass): made again
		// when a user needs them.
		e.collOff, e.noDetach = true, true
		m.cfg.Sink.Count("nccl_collective_detach_errors", 1)
		m.cfg.Log.Warn("detach collective probes", "path", e.name, "err", err)
	case err != nil:
		e.collRetry = true
		m.cfg.Sink.Count("nccl_collective_reattach_errors", 1)
		m.cfg.Log.Warn("re-attach collective probes", "path", e.name, "err", err)
	case off:
		e.collOff = true
		m.countBlind(e) // a user that needed them went before they were made again
		m.cfg.Sink.Count("nccl_collective_probes_detached", 1)
		m.cfg.Log.Info("collective probes detached: every process mapping the library reports its collectives through the profiler plugin", "path", e.name)
	default:
		e.collOff = false
		m.countBlind(e)
		m.cfg.Sink.Count("nccl_collective_probes_reattached", 1)
		m.cfg.Log.Info("collective probes attached again: a process mapping the library needs them", "path", e.name)
	}
	if m.libs[e.file] == e && err == nil {
		m.judge(e) // the users changed meanwhile
	}
}

// countBlind counts the time a user that needed e's closed collective
// probes waited for them: its collectives in that time were not seen
// (nccl_collective_blind_ms, per re-attach; nccl_collective_blind_waits).
func (m *Manager[F, P]) countBlind(e *entry[F, P]) {
	if e.blindSince == 0 {
		return
	}
	m.cfg.Sink.Count("nccl_collective_blind_ms", max(m.cfg.Now()-e.blindSince, 0)/1_000_000)
	m.cfg.Sink.Count("nccl_collective_blind_waits", 1)
	e.blindSince = 0
}

// CollectivesDetached tells whether file f's collective probes are closed.
func (m *Manager[F, P]) CollectivesDetached(f F) bool {
	e := m.libs[f]
	return e != nil && e.collOff
}
