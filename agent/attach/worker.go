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
type worker[F comparable] struct {
	attach  func(Library[F]) (Link, error)
	deliver chan<- func()
	done    func(outcome[F]) // runs on the owner goroutine

	work   chan Library[F] // at most one job in flight (busy)
	stop   chan struct{}
	exited chan struct{}

	// Owner goroutine only.
	queue []Library[F]
	busy  bool
}

func newWorker[F comparable](attach func(Library[F]) (Link, error), deliver chan<- func(), done func(outcome[F])) *worker[F] {
	w := &worker[F]{
		attach: attach, deliver: deliver, done: done,
		work: make(chan Library[F], 1), stop: make(chan struct{}), exited: make(chan struct{}),
	}
	go w.run()
	return w
}

// enqueue schedules lib (owner goroutine).
func (w *worker[F]) enqueue(lib Library[F]) {
	if w.busy {
		w.queue = append(w.queue, lib)
		return
	}
	w.busy = true
	w.work <- lib // never blocks: nothing else is in flight
}

// pending is the number of jobs queued or in flight (owner goroutine).
func (w *worker[F]) pending() int {
	n := len(w.queue)
	if w.busy {
		n++
	}
	return n
}

// finished hands o to the manager and starts the next job (owner goroutine).
func (w *worker[F]) finished(o outcome[F]) {
	w.busy = false
	w.done(o)
	if len(w.queue) > 0 {
		next := w.queue[0]
		w.queue = w.queue[1:]
		w.enqueue(next)
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
	w.queue, w.busy = nil, false
}
