package discover

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// copyProcTree copies a fixture proc tree, symlinks included, into a temporary directory.
func copyProcTree(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		default:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, data, 0o644)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func fixtureWrite(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func fixtureEdit(t *testing.T, name string, edit func(string) string) {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	fixtureWrite(t, name, edit(string(data)))
}

// setStatField sets field n (1-based, as in proc(5), n > 2) of the stat file of pid.
func setStatField(t *testing.T, root string, pid, n int, v string) {
	t.Helper()
	fixtureEdit(t, filepath.Join(root, strconv.Itoa(pid), "stat"), func(s string) string {
		r := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[r+1:])
		f[n-3] = v
		return s[:r+1] + " " + strings.Join(f, " ") + "\n"
	})
}

// editMaps edits the maps of pid and changes its address-space size, as a dlopen does.
func editMaps(t *testing.T, root string, pid int, vsize string, edit func(string) string) {
	t.Helper()
	fixtureEdit(t, filepath.Join(root, strconv.Itoa(pid), "maps"), edit)
	setStatField(t, root, pid, 23, vsize)
}

// describeEvent renders an event compactly for comparisons.
func describeEvent(ev Event) string {
	switch e := ev.(type) {
	case *ProcessAdded:
		return fmt.Sprintf("added %d/%d rank=%d", e.Process.PID, e.Process.StartTime, e.Process.Identity.Rank)
	case *ProcessExited:
		return fmt.Sprintf("exited %d/%d", e.PID, e.StartTime)
	case *LibraryMapped:
		return fmt.Sprintf("mapped %d %s %d@%x", e.PID, e.Library.Kind, e.Library.File.Inode, e.Library.Base)
	case *LibraryUnmapped:
		return fmt.Sprintf("unmapped %d %s %d", e.PID, e.Library.Kind, e.Library.File.Inode)
	}
	return fmt.Sprintf("unknown %T", ev)
}

// drainEvents returns the events waiting in the channel.
func drainEvents(w *Watcher) []string {
	var out []string
	for {
		select {
		case ev := <-w.events:
			out = append(out, describeEvent(ev))
		default:
			return out
		}
	}
}

func newFixtureWatcher(t *testing.T, cfg WatcherConfig) (*Watcher, string) {
	t.Helper()
	root := copyProcTree(t, "testdata/proc")
	cfg.ProcRoot = root
	w, err := NewWatcher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w, root
}

func mustPoll(t *testing.T, w *Watcher) {
	t.Helper()
	if err := w.pollOnce(); err != nil {
		t.Fatal(err)
	}
}

func expectEvents(t *testing.T, w *Watcher, want ...string) {
	t.Helper()
	got := drainEvents(w)
	if !slices.Equal(got, want) {
		t.Errorf("events:\n got  %q\n want %q", got, want)
	}
}

var trainerLibs = []string{
	"mapped %d nccl 2001@7f0000000000",
	"mapped %d cudart 2002@7f0010000000",
	"mapped %d cuda 3003@7f0020000000",
	"mapped %d torch_cpu 2004@7f0030000000",
	"mapped %d torch_cuda 2005@7f0040000000",
	"mapped %d cupti_inject 2006@7f0050000000",
}

func trainerEvents(pid int, start uint64) []string {
	out := []string{fmt.Sprintf("added %d/%d rank=0", pid, start)}
	for _, f := range trainerLibs {
		out = append(out, fmt.Sprintf(f, pid))
	}
	return out
}

func TestWatcherFixtureLifecycle(t *testing.T) {
	w, root := newFixtureWatcher(t, WatcherConfig{})
	mustPoll(t, w)
	expectEvents(t, w, append(trainerEvents(100, 5000), trainerEvents(101, 5200)...)...)

	// Nothing changed: nothing to say, and maps are not parsed again.
	mustPoll(t, w)
	expectEvents(t, w)
	if s := w.Stats(); s.MapsSkipped != 2 || s.Tracked != 2 || s.ProcessesAdded != 2 || s.LibrariesMapped != 12 {
		t.Errorf("stats %+v", s)
	}

	// A later dlopen, and a dlclose.
	editMaps(t, root, 100, "1000", func(s string) string {
		s = strings.Replace(s, "/opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so\n", "/x/libfoo.so\n", 1)
		return s + "7f0090000000-7f0090010000 r-xp 00000000 fd:01 2009 /opt/late/libnccl.so.2\n"
	})
	mustPoll(t, w)
	expectEvents(t, w, "unmapped 100 torch_cpu 2004", "mapped 100 nccl 2009@7f0090000000")

	// dlclose and dlopen again at another address: mapped again with the new base.
	editMaps(t, root, 100, "2000", func(s string) string {
		return strings.ReplaceAll(s, "7f0090000000-7f0090010000", "7f00a0000000-7f00a0010000")
	})
	mustPoll(t, w)
	expectEvents(t, w, "mapped 100 nccl 2009@7f00a0000000")

	// The size changed but not the libraries: maps is read, not parsed.
	setStatField(t, root, 100, 23, "3000")
	mustPoll(t, w)
	expectEvents(t, w)
	if s := w.Stats(); s.MapsUnchanged != 1 {
		t.Errorf("MapsUnchanged = %d, want 1", s.MapsUnchanged)
	}

	// A change that left the size as it was is seen at the next Recheck.
	fixtureEdit(t, filepath.Join(root, "101/maps"), func(s string) string {
		return strings.Replace(s, "/opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so\n", "/x/libbar.so\n", 1)
	})
	mustPoll(t, w)
	expectEvents(t, w)
	w.poll = w.recheck*5 - 1
	mustPoll(t, w)
	expectEvents(t, w, "unmapped 101 torch_cuda 2005")

	// The DataLoader worker ends (its directory goes); the trainer becomes a zombie.
	if err := os.RemoveAll(filepath.Join(root, "101")); err != nil {
		t.Fatal(err)
	}
	fixtureEdit(t, filepath.Join(root, "100/stat"), func(s string) string { return strings.Replace(s, ") S ", ") Z ", 1) })
	mustPoll(t, w)
	expectEvents(t, w, "exited 100/5000", "exited 101/5200")
	mustPoll(t, w)
	expectEvents(t, w)
	if s := w.Stats(); s.Tracked != 0 || s.ProcessesExited != 2 || s.LibrariesUnmapped != 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestWatcherPIDReuse(t *testing.T) {
	w, root := newFixtureWatcher(t, WatcherConfig{Selector: Selector{PIDs: []int{100}}})
	mustPoll(t, w)
	expectEvents(t, w, trainerEvents(100, 5000)...)

	// An elastic restart: PID 100 now belongs to a new process with the same environment. It
	// is not the process that was selected by PID, so it is not selected...
	fixtureEdit(t, filepath.Join(root, "100/stat"), func(s string) string { return strings.Replace(s, " 5000 ", " 9000 ", 1) })
	mustPoll(t, w)
	expectEvents(t, w, "exited 100/5000")

	// ...while with the default selector it is a new process.
	w2, root2 := newFixtureWatcher(t, WatcherConfig{})
	mustPoll(t, w2)
	drainEvents(w2)
	fixtureEdit(t, filepath.Join(root2, "100/stat"), func(s string) string { return strings.Replace(s, " 5000 ", " 9000 ", 1) })
	mustPoll(t, w2)
	expectEvents(t, w2, append([]string{"exited 100/5000"}, trainerEvents(100, 9000)...)...)
}

func TestWatcherExec(t *testing.T) {
	w, root := newFixtureWatcher(t, WatcherConfig{})
	mustPoll(t, w)
	drainEvents(w)
	// PID 100 execs a new image with another rank: same key, new identity.
	fixtureEdit(t, filepath.Join(root, "100/stat"), func(s string) string {
		return strings.Replace(s, "140737488347000", "140737488000000", 1)
	})
	fixtureEdit(t, filepath.Join(root, "100/environ"), func(s string) string { return strings.Replace(s, "RANK=0\x00", "RANK=4\x00", 1) })
	mustPoll(t, w)
	got := drainEvents(w)
	if len(got) != 8 || got[0] != "exited 100/5000" || got[1] != "added 100/5000 rank=4" {
		t.Errorf("events %q", got)
	}
}

func TestWatcherRejectedThenExecs(t *testing.T) {
	w, root := newFixtureWatcher(t, WatcherConfig{Recheck: time.Hour})
	mustPoll(t, w)
	drainEvents(w)
	// PID 200 (no RANK) was caught between fork and exec; it execs with RANK set.
	exec200 := func(rank string) {
		fixtureEdit(t, filepath.Join(root, "200/stat"), func(s string) string {
			return strings.Replace(s, "140737488347000", "1407374883"+rank, 1)
		})
		fixtureWrite(t, filepath.Join(root, "200/environ"), "RANK="+rank+"\x00")
	}
	exec200("7")
	mustPoll(t, w) // young: looked at again
	expectEvents(t, w, "added 200/4000 rank=7")

	// Once old, a rejected process is looked at only every Recheck.
	w, root = newFixtureWatcher(t, WatcherConfig{Recheck: time.Hour})
	for range 4 {
		mustPoll(t, w)
	}
	drainEvents(w)
	exec200("8")
	mustPoll(t, w)
	expectEvents(t, w)
	w.poll = w.recheck - 1 // the next poll is a recheck
	mustPoll(t, w)
	expectEvents(t, w, "added 200/4000 rank=8")
}

func TestWatcherQueueFull(t *testing.T) {
	w, _ := newFixtureWatcher(t, WatcherConfig{QueueSize: 4, Selector: Selector{PIDs: []int{100}}})
	var got []string
	for range 3 {
		mustPoll(t, w)
		got = append(got, drainEvents(w)...)
	}
	if want := trainerEvents(100, 5000); !slices.Equal(got, want) {
		t.Errorf("events over 3 polls:\n got  %q\n want %q", got, want)
	}
	if s := w.Stats(); s.EventsDeferred != 3 || s.LibrariesMapped != 6 {
		t.Errorf("stats %+v", s)
	}

	// An exit that cannot be sent waits, and a new process on the same PID waits behind it.
	w, root := newFixtureWatcher(t, WatcherConfig{QueueSize: 7})
	mustPoll(t, w) // 7 events of 100 fit, 101 waits
	if got := drainEvents(w); len(got) != 7 {
		t.Fatalf("first poll: %q", got)
	}
	mustPoll(t, w) // 101's 7 events
	drainEvents(w)
	for range 7 {
		w.events <- &ProcessExited{} // a stuck consumer
	}
	fixtureEdit(t, filepath.Join(root, "100/stat"), func(s string) string { return strings.Replace(s, " 5000 ", " 9000 ", 1) })
	mustPoll(t, w)
	drainEvents(w)
	mustPoll(t, w)
	expectEvents(t, w, "exited 100/5000", "added 100/9000 rank=0", "mapped 100 nccl 2001@7f0000000000",
		"mapped 100 cudart 2002@7f0010000000", "mapped 100 cuda 3003@7f0020000000",
		"mapped 100 torch_cpu 2004@7f0030000000", "mapped 100 torch_cuda 2005@7f0040000000")
	mustPoll(t, w)
	expectEvents(t, w, "mapped 100 cupti_inject 2006@7f0050000000")
}

func TestWatcherDeniedCountedOnce(t *testing.T) {
	w, _ := newFixtureWatcher(t, WatcherConfig{})
	w.r.readFile = func(name string) ([]byte, error) {
		if strings.HasSuffix(name, "/100/environ") {
			return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrPermission}
		}
		return os.ReadFile(name)
	}
	for range 5 {
		mustPoll(t, w)
	}
	got := drainEvents(w)
	if len(got) != 7 || got[0] != "added 101/5200 rank=0" {
		t.Errorf("events %q", got)
	}
	if s := w.Stats(); s.Denied != 1 {
		t.Errorf("Denied = %d, want 1", s.Denied)
	}
}

func TestNewWatcherNoSuchProcess(t *testing.T) {
	_, err := NewWatcher(WatcherConfig{ProcRoot: "testdata/proc", Selector: Selector{PIDs: []int{100, 4242}}})
	var nsp *NoSuchProcessError
	if !errors.Is(err, ErrNoSuchProcess) || !errors.As(err, &nsp) || nsp.PID != 4242 {
		t.Errorf("got %v, want NoSuchProcessError for 4242", err)
	}
}

func TestWatcherRunStops(t *testing.T) {
	w, _ := newFixtureWatcher(t, WatcherConfig{Interval: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	n := 0
	for range w.Events() {
		n++
		if n == 14 {
			cancel()
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := w.Run(context.Background()); err == nil {
		t.Error("second Run: no error")
	}
	if s := w.Stats(); s.Polls == 0 || s.LastPoll <= 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestWatcherRunFailsWithoutProc(t *testing.T) {
	root := copyProcTree(t, "testdata/proc")
	w, err := NewWatcher(WatcherConfig{ProcRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(context.Background()); err == nil {
		t.Error("no error when the proc root cannot be listed")
	}
}

func TestWatcherRetriesFailedEvaluation(t *testing.T) {
	w, _ := newFixtureWatcher(t, WatcherConfig{Selector: Selector{PIDs: []int{100}}})
	broken := true
	w.r.readFile = func(name string) ([]byte, error) {
		if broken && strings.HasSuffix(name, "/100/environ") {
			return nil, &fs.PathError{Op: "read", Path: name, Err: errors.New("input/output error")}
		}
		return os.ReadFile(name)
	}
	for range 4 {
		mustPoll(t, w)
	}
	expectEvents(t, w)
	if s := w.Stats(); s.Failed != 1 {
		t.Errorf("Failed = %d, want 1", s.Failed)
	}
	broken = false
	w.poll = w.recheck*3 - 1
	mustPoll(t, w)
	expectEvents(t, w, trainerEvents(100, 5000)...)
}
