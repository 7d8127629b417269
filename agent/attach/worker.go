package attach

import "time"

// outcome is what attaching one library gave.
type outcome[F comparable] struct {
	lib  Library[F]
	link Link
	err  error
	took time.Duration
}

// worker attaches libraries off the owner goroutine, which also feeds the
// pipeline and answers status: a library with large symbol tables must not
// stall either. One job at a time, so that the ELF reader's memory budget
// is the agent's, not one per library; the queue lives on the owner
// goroutine (bounded by the libraries the manager knows), so no job is
// dropped. Outcomes return through deliver, the owner's control channel.
//
// The queue is fair between owners (Library.Owner): each owner's jobs wait
// in a lane of their own, first come first served, and the worker takes one
// job from each lane in turn. The files are named by whoever runs the
// processes that map them: one owner's many slow files (huge ELF files
// named like a CUDA library, about 0.5 s each through the bounded symbol
// reader) delay another owner's first attach by at most one job per other
// owner with work queued, not by the number of files queued before it. A
// job wanted by several owners (one file mapped by processes of each) waits
// in each of their lanes and runs at the first of their turns.
type worker[F comparable] struct {
	attach  func(Library[F]) (Link, error)
	deliver chan<- func()
	done    func(outcome[F]) // runs on the owner goroutine

	work   chan Library[F] // at most one job in flight (busy)
	stop   chan struct{}
	exited chan struct{}

	// Owner goroutine only.
	lanes  map[string][]*job[F] // queued jobs by owner, in order
	turns  []string             // owners with queued jobs, next turn first
	queued map[F]*job[F]        // queued jobs by file
	busy   bool
}

// job is one queued attach; it may wait in several lanes.
type job[F comparable] struct {
	lib    Library[F]
	owners []string // the lanes it waits in
	taken  bool     // started through one of its lanes
}

func newWorker[F comparable](attach func(Library[F]) (Link, error), deliver chan<- func(), done func(outcome[F])) *worker[F] {
	w := &worker[F]{
		attach: attach, deliver: deliver, done: done,
		work: make(chan Library[F], 1), stop: make(chan struct{}), exited: make(chan struct{}),
		lanes: map[string][]*job[F]{}, queued: map[F]*job[F]{},
	}
	go w.run()
	return w
}

// enqueue schedules lib in the lane of lib.Owner (owner goroutine).
func (w *worker[F]) enqueue(lib Library[F]) {
	if !w.busy {
		w.start(lib)
		return
	}
	j := &job[F]{lib: lib}
	w.queued[lib.File] = j
	w.wait(j, lib.Owner)
}

// join makes the queued job of lib.File wait in lib.Owner's lane too: a
// process of that owner maps the file as well (owner goroutine). Nothing
// happens when the file's job is in flight or not queued.
func (w *worker[F]) join(lib Library[F]) {
	if j := w.queued[lib.File]; j != nil {
		w.wait(j, lib.Owner)
	}
}

// wait puts j at the end of owner's lane, unless it waits there already.
func (w *worker[F]) wait(j *job[F], owner string) {
	for _, o := range j.owners {
		if o == owner {
			return
		}
	}
	j.owners = append(j.owners, owner)
	if len(w.lanes[owner]) == 0 {
		w.turns = append(w.turns, owner)
	}
	w.lanes[owner] = append(w.lanes[owner], j)
}

// next takes the next job: the first of the lane whose turn it is (jobs
// started through another of their lanes are dropped from this one). The
// lane goes to the end of the turns if it still holds jobs.
func (w *worker[F]) next() (*job[F], bool) {
	for len(w.turns) > 0 {
		owner := w.turns[0]
		w.turns = w.turns[1:]
		lane := w.lanes[owner]
		for len(lane) > 0 && lane[0].taken {
			lane = lane[1:]
		}
		if len(lane) == 0 {
			delete(w.lanes, owner)
			continue
		}
		j := lane[0]
		lane = lane[1:]
		for len(lane) > 0 && lane[0].taken {
			lane = lane[1:]
		}
		if len(lane) > 0 {
			w.lanes[owner] = lane
			w.turns = append(w.turns, owner)
		} else {
			delete(w.lanes, owner)
		}
		j.taken = true
		delete(w.queued, j.lib.File)
		return j, true
	}
	return nil, false
}

func (w *worker[F]) start(lib Library[F]) {
	w.busy = true
	w.work <- lib // never blocks: nothing else is in flight
}

// pending is the number of jobs queued or in flight (owner goroutine).
func (w *worker[F]) pending() int {
	n := len(w.queued)
	if w.busy {
		n++
	}
	return n
}

// finished hands o to the manager and starts the next job (owner goroutine).
func (w *worker[F]) finished(o outcome[F]) {
	w.busy = false
	w.done(o)
	if w.busy { // done queued a job and started it
		return
	}
	if j, ok := w.next(); ok {
		w.start(j.lib)
	}
}

func (w *worker[F]) run() {
	defer close(w.exited)
	for {
		select {
		case <-w.stop:
			return
		case lib := <-w.work:
			start := time.Now()
			link, err := w.attach(lib)
			o := outcome[F]{lib: lib, link: link, err: err, took: time.Since(start)}
			select {
			case w.deliver <- func() { w.finished(o) }:
			case <-w.stop:
				// The owner is stopping and no longer reads its control
				// channel: nobody will own this attachment.
				if link != nil {
					link.Close()
				}
				return
			}
		}
	}
}

// close stops the worker and waits for the job in flight, whose attachment
// it closes itself (owner goroutine, after it stopped reading deliver).
// Queued jobs are not attached.
func (w *worker[F]) close() {
	close(w.stop)
	<-w.exited
	w.lanes, w.turns, w.queued, w.busy = map[string][]*job[F]{}, nil, map[F]*job[F]{}, false
}
