package privilege

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// KernelVersion is major.minor.patch of a kernel release string.
type KernelVersion struct{ Major, Minor, Patch int }

func (v KernelVersion) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast reports whether v >= major.minor.
func (v KernelVersion) AtLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

// ParseKernelVersion reads "6.18.44-fc-v669", "5.15.0-91-generic",
// "4.18.0-513.el8.x86_64", "6.1": the leading numbers.
func ParseKernelVersion(release string) (KernelVersion, error) {
	var nums []int
	rest := release
	for len(nums) < 3 {
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 0 {
			break
		}
		n, err := strconv.Atoi(rest[:i])
		if err != nil {
			return KernelVersion{}, fmt.Errorf("kernel release %q: %w", release, err)
		}
		nums = append(nums, n)
		rest = rest[i:]
		if !strings.HasPrefix(rest, ".") {
			break
		}
		rest = rest[1:]
	}
	if len(nums) < 2 {
		return KernelVersion{}, fmt.Errorf("kernel release %q: want MAJOR.MINOR", release)
	}
	for len(nums) < 3 {
		nums = append(nums, 0)
	}
	return KernelVersion{nums[0], nums[1], nums[2]}, nil
}

// KernelRelease returns the running kernel's release string (uname -r).
func KernelRelease() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}

// kernelBefore reports whether the running kernel is older than
// major.minor; false when its release cannot be read.
func kernelBefore(major, minor int) bool {
	rel, err := KernelRelease()
	if err != nil {
		return false
	}
	v, err := ParseKernelVersion(rel)
	if err != nil {
		return false
	}
	return !v.AtLeast(major, minor)
}
