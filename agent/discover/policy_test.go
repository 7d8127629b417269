package discover

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestPolicyAllows(t *testing.T) {
	pods := "/kubepods.slice/kubepods-pod1.slice/cri-containerd-a.scope"
	for _, tc := range []struct {
		name   string
		policy Policy
		owner  Owner
		want   bool
	}{
		{"no list allows every owner", Policy{}, Owner{UID: 1234, Cgroup: "/user.slice"}, true},
		{"a listed uid", Policy{AllowUIDs: []int{1000}}, Owner{UID: 1000, Cgroup: "/user.slice"}, true},
		{"an unlisted uid", Policy{AllowUIDs: []int{1000}}, Owner{UID: 1001, Cgroup: "/user.slice"}, false},
		{"an unknown uid", Policy{AllowUIDs: []int{1000}}, Owner{UID: -1}, false},
		{"a cgroup under a listed prefix", Policy{AllowCgroups: []string{"/kubepods.slice"}}, Owner{UID: 0, Cgroup: pods}, true},
		{"a listed prefix with a trailing slash", Policy{AllowCgroups: []string{"/kubepods.slice/"}}, Owner{UID: 0, Cgroup: pods}, true},
		{"a cgroup that only shares the prefix's characters", Policy{AllowCgroups: []string{"/kubepods"}}, Owner{UID: 0, Cgroup: pods}, false},
		{"uid or cgroup: either allows", Policy{AllowUIDs: []int{1000}, AllowCgroups: []string{"/kubepods.slice"}}, Owner{UID: 0, Cgroup: pods}, true},
		{"neither allows", Policy{AllowUIDs: []int{1000}, AllowCgroups: []string{"/kubepods.slice"}}, Owner{UID: 1001, Cgroup: "/user.slice"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.policy.allows(tc.owner); got != tc.want {
				t.Errorf("allows(%+v) = %v, want %v", tc.owner, got, tc.want)
			}
		})
	}
}

func TestOwnerQuotaKey(t *testing.T) {
	for _, tc := range []struct {
		owner Owner
		want  string
	}{
		{Owner{UID: 1000, Cgroup: "/user.slice/a"}, "uid:1000"},
		{Owner{UID: 1000, Cgroup: "/user.slice/b"}, "uid:1000"}, // a user's own cgroups share its quota
		{Owner{UID: 0, Cgroup: "/kubepods.slice/pod1"}, "cgroup:/kubepods.slice/pod1"},
		{Owner{UID: -1}, "uid:-1"},
	} {
		if got := tc.owner.QuotaKey(); got != tc.want {
			t.Errorf("%+v: key %q, want %q", tc.owner, got, tc.want)
		}
	}
}

func TestParseOwnerFiles(t *testing.T) {
	if uid, err := parseStatusUID([]byte("Name:\tpython\nUid:\t1000\t1001\t1001\t1001\nGid:\t5\n")); err != nil || uid != 1000 {
		t.Errorf("uid %d, %v; want the real uid 1000", uid, err)
	}
	if _, err := parseStatusUID([]byte("Name:\tx\n")); err == nil {
		t.Error("status without Uid parsed")
	}
	for in, want := range map[string]string{
		"0::/kubepods.slice/x.scope\n":                          "/kubepods.slice/x.scope",
		"12:cpu,cpuacct:/a\n1:name=systemd:/user.slice/s\n":     "/user.slice/s",
		"1:name=systemd:/v1\n0::/system.slice/slurmstepd.scope": "/system.slice/slurmstepd.scope",
		"": "",
	} {
		if got := parseCgroup([]byte(in)); got != want {
			t.Errorf("parseCgroup(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCheckPolicyRefusesBadValues(t *testing.T) {
	for _, p := range []Policy{{AllowUIDs: []int{-1}}, {AllowCgroups: []string{"kubepods.slice"}}, {OwnerQuota: -1}} {
		if CheckPolicy(p) == nil {
			t.Errorf("%+v accepted", p)
		}
	}
}

// writeOwner gives a fixture process a status (real uid) and a cgroup.
func writeOwner(t *testing.T, root string, pid, uid int, cgroup string) {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprint(pid))
	status := fmt.Sprintf("Name:\tx\nUid:\t%d\t%d\t%d\t%d\n", uid, uid, uid, uid)
	if err := os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte("0::"+cgroup+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A process of a disallowed owner is refused and counted, and its
// environment (which it controls) is not read: 101's cannot be read here.
func TestDiscoverRefusesDisallowedOwnersBeforeTheirEnvironment(t *testing.T) {
	root := copyProcTree(t, "testdata/proc")
	writeOwner(t, root, 100, 1000, "/user.slice/user-1000.slice/session-1.scope")
	writeOwner(t, root, 101, 1001, "/user.slice/user-1001.slice/session-2.scope")
	env := filepath.Join(root, "101", "environ")
	if err := os.Remove(env); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(env, 0o755); err != nil {
		t.Fatal(err)
	}
	got, stats, err := Discover(root, Selector{Policy: Policy{AllowUIDs: []int{1000}}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pidsOf(got), []int{100}) || stats.Refused == 0 || stats.Failed != 0 {
		t.Errorf("selected %v, stats %+v; want 100 alone, refusals counted, no failure", pidsOf(got), stats)
	}
	if got[0].Owner.UID != 1000 {
		t.Errorf("owner %+v", got[0].Owner)
	}
}

// cloneProcess copies fixture process from as pid to (its stat rewritten).
func cloneProcess(t *testing.T, root string, from, to int) {
	t.Helper()
	src, dst := filepath.Join(root, fmt.Sprint(from)), filepath.Join(root, fmt.Sprint(to))
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	target, err := os.Readlink(filepath.Join(src, "exe"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dst, "exe")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cmdline", "environ", "maps", "stat"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "stat" {
			b = []byte(fmt.Sprint(to) + strings.TrimPrefix(string(b), fmt.Sprint(from)))
		}
		if err := os.WriteFile(filepath.Join(dst, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A flood of processes of one owner takes its quota, not every slot: the
// other owner's rank is tracked, the rest refused and counted, and a slot
// that frees up goes to a refused process at the next recheck.
func TestWatcherOwnerQuota(t *testing.T) {
	w, root := newFixtureWatcher(t, WatcherConfig{Selector: Selector{Policy: Policy{OwnerQuota: 2}}})
	for pid := 1000; pid < 1006; pid++ {
		cloneProcess(t, root, 100, pid)
		writeOwner(t, root, pid, 2000, "/user.slice/user-2000.slice/flood.scope")
	}
	writeOwner(t, root, 100, 1000, "/user.slice/user-1000.slice/job.scope")
	writeOwner(t, root, 101, 1000, "/user.slice/user-1000.slice/job.scope")
	mustPoll(t, w)
	st := w.Stats()
	var tracked []int
	for pid := range w.tracked {
		tracked = append(tracked, pid)
	}
	slices.Sort(tracked)
	if !slices.Contains(tracked, 100) || !slices.Contains(tracked, 101) || st.Tracked != 4 || st.RefusedQuota != 4 {
		t.Fatalf("tracked %v, stats %+v; want 100, 101 and two of the flood, 4 refused", tracked, st)
	}
	if err := os.RemoveAll(filepath.Join(root, fmt.Sprint(tracked[len(tracked)-1]))); err != nil {
		t.Fatal(err)
	}
	for range w.recheck {
		mustPoll(t, w)
	}
	if st := w.Stats(); st.Tracked != 4 || w.perOwner["uid:2000"] != 2 {
		t.Errorf("after one of the flood exited: stats %+v, per owner %v; want its slot taken again", st, w.perOwner)
	}
}
