package privilege

import "testing"

func TestParseKernelVersion(t *testing.T) {
	tests := []struct {
		in   string
		want KernelVersion
		err  bool
	}{
		{"6.18.44-fc-v669", KernelVersion{6, 18, 44}, false},
		{"5.15.0-91-generic", KernelVersion{5, 15, 0}, false},
		{"4.18.0-513.el8.x86_64", KernelVersion{4, 18, 0}, false},
		{"6.1", KernelVersion{6, 1, 0}, false},
		{"5.8.0", KernelVersion{5, 8, 0}, false},
		{"6.10.0-rc1+", KernelVersion{6, 10, 0}, false},
		{"6", KernelVersion{}, true},
		{"", KernelVersion{}, true},
		{"linux", KernelVersion{}, true},
	}
	for _, tt := range tests {
		got, err := ParseKernelVersion(tt.in)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("ParseKernelVersion(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

func TestKernelAtLeast(t *testing.T) {
	tests := []struct {
		v            KernelVersion
		major, minor int
		want         bool
	}{
		{KernelVersion{5, 8, 0}, 5, 8, true},
		{KernelVersion{5, 7, 19}, 5, 8, false},
		{KernelVersion{6, 0, 0}, 5, 8, true},
		{KernelVersion{4, 20, 0}, 5, 8, false},
		{KernelVersion{5, 10, 0}, 5, 11, false},
		{KernelVersion{5, 11, 0}, 5, 11, true},
	}
	for _, tt := range tests {
		if got := tt.v.AtLeast(tt.major, tt.minor); got != tt.want {
			t.Errorf("%v.AtLeast(%d, %d) = %v", tt.v, tt.major, tt.minor, got)
		}
	}
}

// TestRunningKernel: the running kernel's release parses, and kernelBefore
// (CapRequirements' CAP_SYS_RESOURCE rule) agrees with it.
func TestRunningKernel(t *testing.T) {
	rel, err := KernelRelease()
	if err != nil {
		t.Fatal(err)
	}
	v, err := ParseKernelVersion(rel)
	if err != nil {
		t.Fatal(err)
	}
	if kernelBefore(5, 11) == v.AtLeast(5, 11) {
		t.Errorf("kernel %s (%s): kernelBefore(5, 11) = %v", rel, v, kernelBefore(5, 11))
	}
}
