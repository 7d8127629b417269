package privilege

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestCapSet(t *testing.T) {
	s := Caps(CapBPF, CapPerfmon, CapSysPtrace)
	if !s.Has(CapBPF) || s.Has(CapSysAdmin) || len(s.List()) != 3 {
		t.Errorf("set %s", s)
	}
	if got := s.String(); got != "CAP_SYS_PTRACE,CAP_PERFMON,CAP_BPF" {
		t.Errorf("String() = %q", got)
	}
	if Capability(63).String() != "CAP_63" || CapSet(0).String() != "none" {
		t.Error("names of unknown capabilities")
	}
}

// TestCheckCaps: the first missing required capability is named with what
// it is for; optional ones are reported; Keep is exactly what is used.
func TestCheckCaps(t *testing.T) {
	all := Caps(CapBPF, CapPerfmon, CapSysAdmin, CapSysPtrace, CapDACReadSearch, CapDACOverride, CapCheckpointRestore,
		Capability(0), Capability(5), Capability(7), Capability(16)) // chown, kill, setuid, sys_module
	for _, tc := range []struct {
		name      string
		eff       CapSet
		needAdmin bool
		missing   Capability // required and missing (0 with ok)
		ok        bool
		keep      CapSet
		optional  []Capability
	}{
		{name: "root", eff: all, needAdmin: true, ok: true,
			keep: Caps(CapBPF, CapPerfmon, CapSysAdmin, CapSysPtrace, CapDACReadSearch, CapDACOverride, CapCheckpointRestore)},
		{name: "no CAP_BPF", eff: all &^ Caps(CapBPF, CapSysAdmin), needAdmin: false, missing: CapBPF},
		{name: "no CAP_PERFMON", eff: Caps(CapBPF, CapSysPtrace), missing: CapPerfmon},
		{name: "kernel needs CAP_SYS_ADMIN", eff: Caps(CapBPF, CapPerfmon, CapSysPtrace), needAdmin: true, missing: CapSysAdmin},
		{name: "no CAP_SYS_PTRACE", eff: Caps(CapBPF, CapPerfmon, CapSysAdmin), needAdmin: true, missing: CapSysPtrace},
		{name: "minimal before 6.16", eff: Caps(CapBPF, CapPerfmon, CapSysPtrace), ok: true, keep: Caps(CapBPF, CapPerfmon, CapSysPtrace),
			optional: []Capability{CapDACReadSearch, CapCheckpointRestore, CapDACOverride}},
		{name: "CAP_SYS_ADMIN covers BPF, PERFMON and map_files", eff: Caps(CapSysAdmin, CapSysPtrace), needAdmin: true, ok: true,
			keep: Caps(CapSysAdmin, CapSysPtrace), optional: []Capability{CapDACReadSearch, CapDACOverride}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := checkCaps(tc.eff, CapRequirements(tc.needAdmin, true), tc.needAdmin)
			if !tc.ok {
				var me *MissingCapabilityError
				if !errors.As(err, &me) || me.Req.Cap != tc.missing || !errors.Is(err, ErrMissingCapability) {
					t.Fatalf("err %v, want missing %s", err, tc.missing)
				}
				if msg := err.Error(); !strings.Contains(msg, tc.missing.String()) || !strings.Contains(msg, "needed to") || strings.Contains(msg, "\n") {
					t.Errorf("message %q does not name %s and its use on one line", msg, tc.missing)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Keep != tc.keep {
				t.Errorf("keep %s, want %s", res.Keep, tc.keep)
			}
			var opt []Capability
			for _, m := range res.Missing {
				opt = append(opt, m.Cap)
			}
			if len(opt) != len(tc.optional) {
				t.Errorf("optional missing %v, want %v", opt, tc.optional)
			}
		})
	}
}

func TestEntryOffset(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	off, err := entryOffset(exe)
	if err != nil || off == 0 {
		t.Fatalf("entry offset of %s: %d, %v", exe, off, err)
	}
	if _, err := entryOffset("/dev/null"); err == nil {
		t.Error("entry offset of /dev/null")
	}
}

// TestUprobesNeedSysAdmin probes the running kernel (root only). Linux 6.16+
// (and stable kernels with the revert) answer true.
func TestUprobesNeedSysAdmin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	eff, _, _, err := ThreadCapabilities()
	if err != nil {
		t.Fatal(err)
	}
	if !eff.Has(CapBPF) || !eff.Has(CapPerfmon) {
		t.Skipf("effective set %s lacks CAP_BPF or CAP_PERFMON", eff)
	}
	need, err := UprobesNeedSysAdmin()
	if err != nil {
		t.Skipf("cannot probe: %v", err)
	}
	t.Logf("uprobes need CAP_SYS_ADMIN on this kernel: %v", need)
	// The probe thread's lowered set never leaks to other threads.
	after, _, _, _ := ThreadCapabilities()
	if after != eff {
		t.Errorf("effective set changed from %s to %s", eff, after)
	}
}

func TestDropMarkIsBelievedOnlyAfterADrop(t *testing.T) {
	dropped := Caps(CapBPF, CapPerfmon, CapSysPtrace)
	root := dropped | Caps(CapSetPCap, CapSysAdmin, Capability(16))
	for _, tc := range []struct {
		name        string
		env         string
		bnd         CapSet
		mark        string
		wantIgnored bool
	}{
		{"absent", "", root, "", false},
		{"set by the re-exec, no admin", capsDroppedNoAdmin, dropped, capsDroppedNoAdmin, false},
		{"set by the re-exec, admin", capsDroppedAdmin, dropped | Caps(CapSysAdmin), capsDroppedAdmin, false},
		{"set in the environment of a full root", capsDroppedNoAdmin, root, "", true},
		{"admin mark in the environment of a full root", capsDroppedAdmin, root, "", true},
		{"unknown value", "yes", dropped, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mark, ignored := dropMark(tc.env, tc.bnd)
			if mark != tc.mark || ignored != tc.wantIgnored {
				t.Errorf("dropMark(%q, %s) = %q, %v; want %q, %v", tc.env, tc.bnd, mark, ignored, tc.mark, tc.wantIgnored)
			}
		})
	}
}

// TestCapsDroppedEnvDoesNotSkipTheProbe: SLOWRANK_CAPS_DROPPED=1 in the
// environment of a process that holds CAP_SETPCAP in its bounding set (it
// was not re-executed by DropCapabilities) neither skips the uprobe probe
// nor hides itself.
func TestCapsDroppedEnvDoesNotSkipTheProbe(t *testing.T) {
	_, _, bnd, err := ThreadCapabilities()
	if err != nil || !bnd.Has(CapSetPCap) {
		t.Skipf("needs CAP_SETPCAP in the bounding set (%s, %v)", bnd, err)
	}
	t.Setenv(CapsDroppedEnv, capsDroppedNoAdmin)
	probed := false
	probeUprobes = func() (bool, error) { probed = true; return true, nil }
	t.Cleanup(func() { probeUprobes = UprobesNeedSysAdmin })
	chk, _ := CheckCapabilities(false)
	if !probed || !chk.UprobesNeedSysAdmin || !chk.IgnoredMark {
		t.Errorf("probed %v, needs admin %v, mark ignored %v: want all true", probed, chk.UprobesNeedSysAdmin, chk.IgnoredMark)
	}
}

func TestParseCapEff(t *testing.T) {
	status := "Name:\tslowrank\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000000c000080000\nCapBnd:\t000001ffffffffff\n"
	eff, err := ParseCapEff([]byte(status))
	if err != nil {
		t.Fatal(err)
	}
	if eff != 0xc000080000 {
		t.Fatalf("CapEff %#x", uint64(eff))
	}
	if _, err := ParseCapEff([]byte("Name:\tx\n")); err == nil {
		t.Error("no CapEff: no error")
	}
	if _, err := ParseCapEff([]byte("CapEff:\tzz\n")); err == nil {
		t.Error("bad CapEff: no error")
	}
}
