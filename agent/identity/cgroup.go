package identity

import (
	"bytes"
	"strings"

	"github.com/slowrank/slowrank/internal/hexname"
)

// What a process's cgroup says about its container. Container runtimes name
// the cgroup of a container after its id, and the kubelet names a pod's
// cgroup after the pod's UID, in one of two layouts:
//
//	systemd driver: /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, _ for ->.slice/cri-containerd-<id>.scope
//	cgroupfs:       /kubepods/burstable/pod<uid>/<id>
//
// with docker-<id>.scope (Docker, cri-dockerd), crio-<id>.scope (CRI-O),
// libpod-<id>.scope (Podman), nerdctl-<id>.scope, or a bare <id> (cgroupfs
// driver, /docker/<id>). Unlike the environment, the process cannot choose
// these names: the runtime set them before the process started. The file
// is another user's bytes all the same (a process may sit in a cgroup it
// created and named), so everything taken from it must have the exact
// shape of an id.
//
// The path is relative to the reader's cgroup namespace: an agent in a
// container of its own sees /../../kubepods-besteffort.slice/...; the
// components are matched one by one, so the leading ".." do not matter.

// Cgroup is what ParseCgroup finds; "" when not found.
type Cgroup struct {
	ContainerID string // 64 lowercase hex digits
	PodUID      string // 8-4-4-4-12 lowercase hex digits
}

// containerScopePrefixes precede a container id in a systemd scope name.
var containerScopePrefixes = []string{"cri-containerd-", "docker-", "crio-", "libpod-", "nerdctl-"}

// ParseCgroup reads the content of /proc/PID/cgroup: the cgroup v2
// line ("0::path") first, then the v1 hierarchies in file order. In each
// path the component nearest the leaf that has the shape of a container id
// (of a pod UID) wins: a container nested in another is named by the inner
// runtime. Lines that are not "id:controllers:path" are skipped.
func ParseCgroup(data []byte) Cgroup {
	var paths []string
	for line := range bytes.Lines(data) {
		line = bytes.TrimRight(line, "\n")
		hier, rest, ok := bytes.Cut(line, []byte{':'})
		if !ok {
			continue
		}
		_, path, ok := bytes.Cut(rest, []byte{':'})
		if !ok || len(path) == 0 {
			continue
		}
		if string(hier) == "0" && len(rest) > 0 && rest[0] == ':' {
			paths = append([]string{string(path)}, paths...)
		} else {
			paths = append(paths, string(path))
		}
	}
	var id Cgroup
	for _, p := range paths {
		cid, uid := identityInPath(p)
		if id.ContainerID == "" {
			id.ContainerID = cid
		}
		if id.PodUID == "" {
			id.PodUID = uid
		}
	}
	return id
}

// identityInPath scans one cgroup path from the leaf up.
func identityInPath(path string) (containerID, podUID string) {
	comps := strings.Split(path, "/")
	for i := len(comps) - 1; i >= 0; i-- {
		c := comps[i]
		if containerID == "" {
			containerID = containerIDOf(c)
		}
		if podUID == "" {
			podUID = podUIDOf(c)
		}
	}
	return containerID, podUID
}

// containerIDOf returns the container id that a cgroup name carries, or "".
// Conmon's scopes (crio-conmon-<id>, libpod-conmon-<id>) carry none: conmon
// is the runtime's monitor, not the container.
func containerIDOf(name string) string {
	if rest, ok := strings.CutSuffix(name, ".scope"); ok {
		for _, p := range containerScopePrefixes {
			if id, ok := strings.CutPrefix(rest, p); ok && isContainerID(id) {
				return id
			}
		}
		return ""
	}
	if isContainerID(name) {
		return name
	}
	return ""
}

// podUIDOf returns the pod UID that a cgroup name carries, or "": the
// cgroupfs form pod<uid>, or the systemd form kubepods[-<qos>]-pod<uid>.slice
// in which the UID's dashes are underscores (a dash separates the levels of
// a systemd slice name).
func podUIDOf(name string) string {
	if uid, ok := strings.CutPrefix(name, "pod"); ok {
		if isUUID(uid) {
			return uid
		}
		return ""
	}
	rest, ok := strings.CutSuffix(name, ".slice")
	if !ok || !strings.HasPrefix(rest, "kubepods-") {
		return ""
	}
	i := strings.LastIndex(rest, "-pod")
	if i < 0 {
		return ""
	}
	uid := strings.ReplaceAll(rest[i+len("-pod"):], "_", "-")
	if isUUID(uid) {
		return uid
	}
	return ""
}

// isContainerID reports whether s is 64 lowercase hex digits.
func isContainerID(s string) bool { return len(s) == 64 && hexname.IsLower([]byte(s)) }

// isUUID reports whether s is a UUID in the canonical lowercase form
// (8-4-4-4-12 hex digits), as Kubernetes writes pod UIDs.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch i {
		case 8, 13, 18, 23:
			if s[i] != '-' {
				return false
			}
		default:
			if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}
