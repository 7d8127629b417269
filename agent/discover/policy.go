package discover

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/slowrank/slowrank/agent/identity"
)

// Who may be a rank. Any local user, or any pod, can start a process with
// RANK in its environment; the policy limits who is believed, and the
// quota how many tracking slots (tracked_tgids, maps reads, attaches) one
// owner can take, so that a flood of processes cannot blind the agent to
// the others.
//
// The default allows every owner: torchrun runs as whoever started it,
// Slurm steps as the submitting user, Kubernetes pods as root or any uid,
// and a default that a deployment cannot predict would leave the agent
// blind out of the box. On a host shared between tenants the operator
// lists who may be a rank (--allow-uid, --allow-cgroup: /kubepods.slice/
// for pods, /system.slice/slurmstepd.scope/ for Slurm steps).

// DefaultOwnerQuota is how many processes one owner may have tracked: a
// sixteenth of the BPF map of tracked processes (4,096), well above a host's
// ranks and their data-loader workers (8 ranks with 16 workers each: 136).
const DefaultOwnerQuota = 256

// Owner is who a process belongs to, for the selection policy.
type Owner struct {
	UID int // real uid (/proc/PID/status); -1 when unknown
	// Cgroup is the cgroup v2 path (/proc/PID/cgroup "0::"), e.g.
	// /kubepods.slice/kubepods-pod<uid>.slice/cri-containerd-<id>.scope.
	Cgroup string
}

// QuotaKey is what the quota counts per: a uid, except for root, whose
// processes are mostly containers (pods running as uid 0) and are counted
// per cgroup. An unprivileged user cannot take another uid; a container
// cannot leave its cgroup.
func (o Owner) QuotaKey() string {
	if o.UID != 0 {
		return "uid:" + strconv.Itoa(o.UID)
	}
	return "cgroup:" + o.Cgroup
}

// Policy says whose processes may be ranks.
type Policy struct {
	// AllowUIDs and AllowCgroups, when either is set, allow only processes
	// whose real uid is listed or whose cgroup path starts with a listed
	// prefix (at a path component boundary). Both empty: every owner.
	AllowUIDs    []int
	AllowCgroups []string
	// OwnerQuota bounds the processes tracked per owner (DefaultOwnerQuota
	// when 0).
	OwnerQuota int
}

func (p Policy) restricted() bool { return len(p.AllowUIDs) > 0 || len(p.AllowCgroups) > 0 }

func (p Policy) quota() int {
	if p.OwnerQuota <= 0 {
		return DefaultOwnerQuota
	}
	return p.OwnerQuota
}

// allows reports whether the policy allows processes of o.
func (p Policy) allows(o Owner) bool {
	if !p.restricted() {
		return true
	}
	if o.UID >= 0 && slices.Contains(p.AllowUIDs, o.UID) {
		return true
	}
	for _, prefix := range p.AllowCgroups {
		if cgroupUnder(o.Cgroup, prefix) {
			return true
		}
	}
	return false
}

// cgroupUnder reports whether path is prefix or below it: /kubepods.slice
// covers /kubepods.slice/x, not /kubepods.slicex.
func cgroupUnder(path, prefix string) bool {
	prefix = strings.TrimSuffix(prefix, "/")
	return path == prefix || strings.HasPrefix(path, prefix+"/") || prefix == ""
}

// CheckPolicy validates a policy as given by an operator.
func CheckPolicy(p Policy) error {
	for _, u := range p.AllowUIDs {
		if u < 0 {
			return fmt.Errorf("allowed uid %d is negative", u)
		}
	}
	for _, c := range p.AllowCgroups {
		if !strings.HasPrefix(c, "/") {
			return fmt.Errorf("allowed cgroup %q is not an absolute cgroup path", c)
		}
	}
	if p.OwnerQuota < 0 {
		return fmt.Errorf("owner quota %d is negative", p.OwnerQuota)
	}
	return nil
}

// parseStatusUID returns the real uid of /proc/PID/status content.
func parseStatusUID(data []byte) (int, error) {
	for line := range bytes.Lines(data) {
		rest, ok := bytes.CutPrefix(line, []byte("Uid:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) == 0 {
			break
		}
		return strconv.Atoi(string(f[0]))
	}
	return -1, fmt.Errorf("parse status: no Uid line")
}

// parseCgroup returns the cgroup v2 path of /proc/PID/cgroup content (the
// "0::" line; on a v1 host the name=systemd hierarchy's path).
func parseCgroup(data []byte) string {
	var v1 string
	for line := range bytes.Lines(data) {
		line = bytes.TrimRight(line, "\n")
		if p, ok := bytes.CutPrefix(line, []byte("0::")); ok {
			return string(p)
		}
		if _, p, ok := bytes.Cut(line, []byte(":name=systemd:")); ok {
			v1 = string(p)
		}
	}
	return v1
}

// owner reads who pid belongs to, and what its cgroup names of its
// container (one bounded read of the file serves both); an unreadable file
// leaves its part unknown.
func (r *procReader) owner(pid int) (Owner, identity.Cgroup) {
	o := Owner{UID: -1}
	var cg identity.Cgroup
	if data, err := r.readFile(r.path(pid, "status")); err == nil {
		if uid, err := parseStatusUID(data); err == nil {
			o.UID = uid
		}
	}
	if data, err := r.readFile(r.path(pid, "cgroup")); err == nil {
		o.Cgroup = parseCgroup(data)
		cg = identity.ParseCgroup(data)
	}
	return o, cg
}
