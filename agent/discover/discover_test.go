package discover

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestParseStat(t *testing.T) {
	tail := func(start string) string {
		// fields 4..52 after state; starttime is field 22, arg/env areas fields 48..51
		f := make([]string, 50)
		for i := range f {
			f[i] = "0"
		}
		f[0] = "1"       // ppid (field 4)
		f[5] = "4194560" // flags (field 9)
		f[18] = start    // starttime (field 22)
		f[19] = "8192"   // vsize (field 23)
		f[44] = "11"     // arg_start (field 48)
		f[45] = "12"     // arg_end
		f[46] = "13"     // env_start
		f[47] = "14"     // env_end (field 51)
		return strings.Join(f, " ")
	}
	tests := []struct {
		name string
		data string
		want procStat
	}{
		{"plain", "42 (python3) S " + tail("777") + "\n",
			procStat{PID: 42, Comm: "python3", State: 'S', PPID: 1, Flags: 4194560, StartTime: 777, VSize: 8192, ExecSig: [2]uint64{11, 13}}},
		{"parentheses and spaces in comm", "42 (a) b (c)) R " + tail("9"),
			procStat{PID: 42, Comm: "a) b (c)", State: 'R', PPID: 1, Flags: 4194560, StartTime: 9, VSize: 8192, ExecSig: [2]uint64{11, 13}}},
		{"empty comm", "7 () Z " + tail("5"),
			procStat{PID: 7, Comm: "", State: 'Z', PPID: 1, Flags: 4194560, StartTime: 5, VSize: 8192, ExecSig: [2]uint64{11, 13}}},
		{"newline in comm", "7 (x\ny) S " + tail("5"),
			procStat{PID: 7, Comm: "x\ny", State: 'S', PPID: 1, Flags: 4194560, StartTime: 5, VSize: 8192, ExecSig: [2]uint64{11, 13}}},
		{"old kernel: no arg/env fields", "7 (x) S 1 0 0 0 0 4194560 0 0 0 0 0 0 0 0 0 0 0 0 123 4096",
			procStat{PID: 7, Comm: "x", State: 'S', PPID: 1, Flags: 4194560, StartTime: 123, VSize: 4096}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat([]byte(tt.data))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
	for _, bad := range []string{"", "42 python3 S 1", "(x) S 1", "42 (x) S 1 2 3", "x (y) S " + tail("1"), "42 (x) S " + tail("-5")} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
}

func TestParseStatSelf(t *testing.T) {
	data, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	st, err := parseStat(data)
	if err != nil {
		t.Fatal(err)
	}
	if st.PID <= 0 || st.StartTime == 0 || st.ExecSig == ([2]uint64{}) {
		t.Errorf("implausible %+v", st)
	}
}

func pidsOf(ps []Process) []int {
	var out []int
	for _, p := range ps {
		out = append(out, p.PID)
	}
	return out
}

func TestDiscoverFixture(t *testing.T) {
	tests := []struct {
		name string
		sel  Selector
		want []int
		by   string
	}{
		{"default: environment has RANK", Selector{}, []int{100, 101}, "env:RANK"},
		{"other key", Selector{EnvKey: "OMPI_COMM_WORLD_RANK"}, []int{500}, "env:OMPI_COMM_WORLD_RANK"},
		{"match command line", Selector{Match: regexp.MustCompile(`train_mpi\.py`)}, []int{500}, "match"},
		{"match exe basename", Selector{Match: regexp.MustCompile(`^python3\.12$`)}, []int{100, 101, 200, 500}, "match"},
		{"match comm", Selector{Match: regexp.MustCompile(`^pt_main`)}, []int{100}, "match"},
		{"explicit pid", Selector{PIDs: []int{200}}, []int{200}, "pid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, stats, err := Discover("testdata/proc", tt.sel)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(pidsOf(got), tt.want) {
				t.Errorf("selected %v, want %v", pidsOf(got), tt.want)
			}
			for _, p := range got {
				if p.SelectedBy != tt.by {
					t.Errorf("pid %d selected by %q, want %q", p.PID, p.SelectedBy, tt.by)
				}
			}
			if stats.Scanned != 6 || stats.Selected != len(tt.want) || stats.Failed != 0 {
				t.Errorf("stats %+v", stats)
			}
		})
	}
}

func TestDiscoverFixtureProcess(t *testing.T) {
	got, _, err := Discover("testdata/proc", Selector{})
	if err != nil {
		t.Fatal(err)
	}
	p := got[0]
	want := Process{
		ProcessKey: ProcessKey{PID: 100, StartTime: 5000},
		PPID:       99,
		Comm:       "pt_main_thread",
		Exe:        "/usr/bin/python3.12",
		Cmdline:    []string{"/opt/venv/bin/python3.12", "-u", "train.py", "--lr", "1e-3"},
		Root:       "testdata/proc/100/root",
		Identity: Identity{Rank: 0, LocalRank: 0, WorldSize: 8, GroupRank: 0, LocalWorldSize: 4, RankSource: "RANK",
			RunID: "run-42", MasterAddr: "10.0.0.1", MasterPort: "29500", JobID: "run-42", JobIDSource: "TORCHELASTIC_RUN_ID",
			VisibleDevices: "0,1,2,3", InjectionPath: "/opt/slowrank dev/lib/libslowrank_cupti.so", Injected: true,
			SlurmJobID: "777"},
		SelectedBy: "env:RANK",
		Owner:      Owner{UID: -1}, // the fixture has no status nor cgroup
		ExecSig:    [2]uint64{140737488347000, 140737488347100},
		// The fixture's exe is a link to a path of the host running the
		// test: whatever it names there.
		ExeFile: statFileID("testdata/proc/100/exe"),
	}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("got  %+v\nwant %+v", p, want)
	}
	if got[1].PPID != 100 {
		t.Errorf("DataLoader worker PPID = %d, want 100", got[1].PPID)
	}
}

func TestDiscoverNoSuchProcess(t *testing.T) {
	_, _, err := Discover("testdata/proc", Selector{PIDs: []int{100, 999999, 400}})
	if !errors.Is(err, ErrNoSuchProcess) {
		t.Fatalf("got %v, want ErrNoSuchProcess", err)
	}
	var nsp *NoSuchProcessError
	if !errors.As(err, &nsp) || nsp.PID != 999999 {
		t.Errorf("got %#v, want pid 999999 first", nsp)
	}
	// The zombie 400 does not count as existing either.
	if !strings.Contains(err.Error(), "pid 999999: no such process") || !strings.Contains(err.Error(), "pid 400: no such process") {
		t.Errorf("message %q", err)
	}
}

// faultyReader returns a reader of the fixture whose reads of the named files of some PIDs fail.
func faultyReader(t *testing.T, faults map[string]error) *procReader {
	t.Helper()
	r, err := newProcReader("testdata/proc")
	if err != nil {
		t.Fatal(err)
	}
	r.readFile = func(name string) ([]byte, error) {
		for suffix, err := range faults {
			if strings.HasSuffix(name, suffix) {
				return nil, &fs.PathError{Op: "open", Path: name, Err: err}
			}
		}
		return os.ReadFile(name)
	}
	return r
}

func TestDiscoverPermissionAndVanished(t *testing.T) {
	r := faultyReader(t, map[string]error{
		"/100/environ": syscall.EACCES, // another user's process, agent not root
		"/101/environ": syscall.ESRCH,  // ended while read
		"/200/stat":    syscall.ENOENT, // ended before read
		"/500/environ": syscall.EPERM,
	})
	got, stats, err := r.discover(Selector{})
	if len(got) != 0 {
		t.Errorf("selected %v, want none", pidsOf(got))
	}
	var ae *AccessError
	if !errors.As(err, &ae) || !slices.Equal(ae.PIDs, []int{100, 500}) || !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("got %v, want AccessError for 100 and 500", err)
	}
	if stats.Denied != 2 || stats.Vanished != 2 || stats.Failed != 0 {
		t.Errorf("stats %+v", stats)
	}

	// An explicitly selected process with an unreadable environment is still selected.
	got, _, err = r.discover(Selector{PIDs: []int{100}})
	if err != nil || len(got) != 1 || !got[0].EnvDenied || got[0].Identity.Rank != Unknown {
		t.Errorf("explicit pid, environ denied: got %+v, %v", got, err)
	}
}

func TestDiscoverUnexpectedError(t *testing.T) {
	r := faultyReader(t, map[string]error{"/100/environ": syscall.EIO})
	got, stats, err := r.discover(Selector{})
	if !errors.Is(err, syscall.EIO) || stats.Failed != 1 || !slices.Equal(pidsOf(got), []int{101}) {
		t.Errorf("got %v, %+v, %v", pidsOf(got), stats, err)
	}
}

func TestDiscoverBadRoot(t *testing.T) {
	if _, _, err := Discover("testdata/nonexistent", Selector{}); err == nil {
		t.Error("no error for a missing proc root")
	}
}

func TestReadLibrariesFixture(t *testing.T) {
	libs, err := ReadLibraries("testdata/proc", 100)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, l := range libs {
		kinds = append(kinds, l.Kind.String())
	}
	if got := fmt.Sprint(kinds); got != "[nccl cudart cuda torch_cpu torch_cuda cupti_inject]" {
		t.Errorf("kinds %s", got)
	}
}
