// Package hexname recognises the lowercase hexadecimal parts of names the
// kernel shows (a container id in a cgroup path, the hash a Python wheel
// puts in a bundled library's file name), one definition for the agent
// and agent/identity. It imports no slowrank package.
package hexname

// IsLower reports whether s is non-empty lowercase hexadecimal.
func IsLower(s []byte) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return len(s) > 0
}
