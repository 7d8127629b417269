package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Bounds on what training processes can make the agent hold: see
// agent/capture (MaxInternedNames and its neighbours) for what a traced
// process sends, Config.InputQueue for the queue between reader and
// pipeline, correlate.Config.MaxHostRecords/MaxDeviceRecords for the
// records per process, and MaxMemory below for the whole.

// memoryReserve is what the process needs outside the Go heap: text, stacks
// of threads, cgo, the page tables. The ring buffer (mapped twice) comes on
// top.
const memoryReserve = 32 << 20

// GoMemoryLimit is the Go runtime's soft memory limit that keeps a process
// with a BPF ring buffer of ringBuf bytes within maxMemory bytes of resident
// memory: maxMemory minus the ring buffer (its data pages are mapped twice)
// and a fixed reserve for text, stacks and cgo. It fails when maxMemory is
// too small to leave the heap at least 32 MiB.
func GoMemoryLimit(maxMemory int64, ringBuf int) (int64, error) {
	limit := maxMemory - 2*int64(ringBuf) - memoryReserve
	if limit < 32<<20 {
		return 0, fmt.Errorf("memory bound %d MiB is too small for a %d MiB ring buffer: need at least %d MiB",
			maxMemory>>20, ringBuf>>20, (2*int64(ringBuf)+memoryReserve+32<<20)>>20)
	}
	return limit, nil
}

// gcPercent is the GC target under a memory bound. The live heap of the
// agent is a few MiB and most of its garbage is per-event: collecting at 4x
// instead of 2x cuts the agent's CPU per event by a fifth (bench/agent-cpu),
// and the memory limit still bounds the heap.
const gcPercent = 400

// applyMemoryBound sets the process's Go memory limit and GC target for
// cfg.MaxMemory (nothing when it is 0).
func applyMemoryBound(cfg Config) error {
	if cfg.MaxMemory <= 0 {
		return nil
	}
	limit, err := GoMemoryLimit(cfg.MaxMemory, cfg.RingBufferSize)
	if err != nil {
		return err
	}
	debug.SetMemoryLimit(limit)
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	return nil
}

// CounterSource is implemented by sinks that count their own losses (lines
// not written, spans not exported): the agent merges their counters into
// Counters, so every loss is visible in metrics and in Status.
type CounterSource interface {
	Counters() map[string]int64
}

// refreshRuntime sets the agent's own resource counters: goroutines, OS
// threads, resident memory and Go heap, and counts samples over the memory
// bound.
func (a *Agent) refreshRuntime() {
	c := a.counters
	c.set("goroutines", int64(runtime.NumGoroutine()))
	var ms runtime.MemStats
	if now := time.Now(); now.Sub(a.lastMemStats) >= time.Second {
		// ReadMemStats stops the world briefly: once a second is plenty.
		a.lastMemStats = now
		runtime.ReadMemStats(&ms)
		c.set("heap_inuse_bytes", int64(ms.HeapInuse))
		// The heap live after the last GC: the leak signal (in-use heap
		// swings with the GC cycle, up to 5x under gcPercent).
		live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		if metrics.Read(live); live[0].Value.Kind() == metrics.KindUint64 {
			c.set("heap_live_bytes", int64(live[0].Value.Uint64()))
		}
		c.set("go_sys_bytes", int64(ms.Sys))
		c.set("gc_cycles", int64(ms.NumGC))
	}
	if lim := debug.SetMemoryLimit(-1); lim != int64(^uint64(0)>>1) {
		c.set("memory_limit_bytes", lim)
	}
	if rss, threads, err := selfStatus(); err == nil {
		c.set("rss_bytes", rss)
		c.set("threads", threads)
		if a.cfg.MaxMemory > 0 && rss > a.cfg.MaxMemory {
			c.add("memory_over_bound", 1)
			if !a.overBound {
				a.log.Warn("resident memory above the configured bound", "rss_mib", rss>>20, "bound_mib", a.cfg.MaxMemory>>20)
			}
			a.overBound = true
		} else {
			a.overBound = false
		}
	}
}

// selfStatus reads VmRSS (bytes) and Threads of this process.
func selfStatus() (rss, threads int64, err error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0, err
	}
	return parseStatus(b)
}

// parseStatus extracts VmRSS (in bytes) and Threads from /proc/PID/status.
func parseStatus(b []byte) (rss, threads int64, err error) {
	seen := 0
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "VmRSS":
			n, perr := strconv.ParseInt(f[0], 10, 64)
			if perr != nil {
				return 0, 0, fmt.Errorf("parse VmRSS %q: %w", v, perr)
			}
			rss, seen = n<<10, seen|1
		case "Threads":
			n, perr := strconv.ParseInt(f[0], 10, 64)
			if perr != nil {
				return 0, 0, fmt.Errorf("parse Threads %q: %w", v, perr)
			}
			threads, seen = n, seen|2
		}
	}
	if seen != 3 {
		return 0, 0, errors.New("status lacks VmRSS or Threads")
	}
	return rss, threads, nil
}

// refreshSinks merges the counters of sinks that count their own losses.
func (a *Agent) refreshSinks() {
	for _, s := range a.cfg.Sinks {
		if cs, ok := s.(CounterSource); ok {
			for k, v := range cs.Counters() {
				a.counters.set(k, v)
			}
		}
	}
}

// refreshPipeline exports the correlator's and detector's own loss counters
// and the converter's name counters.
func (a *Agent) refreshPipeline() {
	c := a.counters
	for k, v := range a.pipe.Counters() {
		c.set(k, v)
	}
	st := a.conv.NameStats()
	c.set("names_interned", int64(st.Names))
	c.set("names_refused", int64(st.Refused))
	c.set("names_missing", int64(st.Missing))
}

// epochFile is the file under the state directory that remembers the last
// attach epoch.
const epochFile = "epoch"

// NextEpoch returns the attach epoch of an agent starting at now: the unix
// second, or one more than the epoch of the previous agent that used
// stateDir if that is not smaller (a restart within the same second, or a
// clock stepped back). It records the new epoch in stateDir/epoch (created
// 0750/0640, written through a temporary file and a rename, never through a
// symbolic link). With stateDir "" it returns the unix second.
//
// Epochs stay within int32, the width the detector keeps them in.
func NextEpoch(stateDir string, now time.Time) (int, error) {
	epoch := int(now.Unix())
	if stateDir == "" {
		return epoch, nil
	}
	if err := os.MkdirAll(stateDir, 0o750); err != nil {
		return epoch, fmt.Errorf("create state directory: %w", err)
	}
	path := filepath.Join(stateDir, epochFile)
	if b, err := readNoFollow(path); err == nil {
		last, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		if perr != nil {
			return epoch, fmt.Errorf("%s: invalid epoch %q", path, strings.TrimSpace(string(b)))
		}
		if last >= epoch {
			epoch = last + 1
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return epoch, err
	}
	if epoch > 1<<31-1 {
		return 0, fmt.Errorf("%s: epoch %d overflows int32", path, epoch)
	}
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o640)
	if err != nil {
		return epoch, fmt.Errorf("write epoch: %w", err)
	}
	_, werr := f.WriteString(strconv.Itoa(epoch) + "\n")
	if serr := f.Sync(); werr == nil {
		werr = serr
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		_ = os.Remove(tmp) // best effort: the write's error is the one to return, and the next start writes its own
		return epoch, fmt.Errorf("write epoch: %w", werr)
	}
	return epoch, nil
}

func readNoFollow(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("read %s: refusing to follow a symbolic link", path)
		}
		return nil, fmt.Errorf("read epoch: %w", err)
	}
	defer func() { _ = f.Close() }() // read only
	b := make([]byte, 64)
	n, err := f.Read(b)
	if err != nil && n == 0 {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b[:n], nil
}
