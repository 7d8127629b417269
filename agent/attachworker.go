package agent

import (
	"time"

	"github.com/slowrank/slowrank/bpf"
)

// attachJob is one library to attach: reading its symbol tables (up to the
// ELF reader's 64 MiB section budget, seconds for libtorch's) and creating
// its uprobe links.
type attachJob struct {
	file FileID
	path string // what to open (the host path, or map_files for a deleted file)
	name string // the library as the process maps it, for logs
	pid  int    // the process whose mapping asked for it
	kind bpf.LibKind
}

// attachOutcome is what attaching one job gave.
type attachOutcome struct {
	job  attachJob
	att  *bpf.Attachment
	err  error
	took time.Duration
}

// attachWorker attaches libraries off the agent's main goroutine, which
// also feeds the pipeline and answers status: a library with large symbol
// tables must not stall either. One job at a time, so that the ELF
// reader's memory budget is the agent's, not one per library; the queue
// lives on the main goroutine (bounded by the libraries the attacher
// knows), so no job is dropped. Outcomes return through deliver, the main
// goroutine's control channel.
type attachWorker struct {
	attach  func(path string, kind bpf.LibKind) (*bpf.Attachment, error)
	deliver chan<- func()
	done    func(attachOutcome) // runs on the main goroutine

	work   chan attachJob // at most one job in flight (busy)
	stop   chan struct{}
	exited chan struct{}

	// Main goroutine only.
	queue []attachJob
	busy  bool
}

func newAttachWorker(attach func(string, bpf.LibKind) (*bpf.Attachment, error), deliver chan<- func(), done func(attachOutcome)) *attachWorker {
	w := &attachWorker{
		attach: attach, deliver: deliver, done: done,
		work: make(chan attachJob, 1), stop: make(chan struct{}), exited: make(chan struct{}),
	}
	go w.run()
	return w
}

// enqueue schedules j (main goroutine).
func (w *attachWorker) enqueue(j attachJob) {
	if w.busy {
		w.queue = append(w.queue, j)
		return
	}
	w.busy = true
	w.work <- j // never blocks: nothing else is in flight
}

// pending is the number of jobs queued or in flight (main goroutine).
func (w *attachWorker) pending() int {
	n := len(w.queue)
	if w.busy {
		n++
	}
	return n
}

// finished hands o to the attacher and starts the next job (main goroutine).
func (w *attachWorker) finished(o attachOutcome) {
	w.busy = false
	w.done(o)
	if len(w.queue) > 0 {
		next := w.queue[0]
		w.queue = w.queue[1:]
		w.enqueue(next)
	}
}

func (w *attachWorker) run() {
	defer close(w.exited)
	for {
		select {
		case <-w.stop:
			return
		case j := <-w.work:
			start := time.Now()
			att, err := w.attach(j.path, j.kind)
			o := attachOutcome{job: j, att: att, err: err, took: time.Since(start)}
			select {
			case w.deliver <- func() { w.finished(o) }:
			case <-w.stop:
				// The agent is stopping and no longer reads its
				// control channel: nobody will own this attachment.
				if att != nil {
					att.Close()
				}
				return
			}
		}
	}
}

// close stops the worker and waits for the job in flight, whose attachment
// it closes itself (main goroutine, after the main loop stopped). Queued
// jobs are not attached.
func (w *attachWorker) close() {
	close(w.stop)
	<-w.exited
	w.queue, w.busy = nil, false
}
