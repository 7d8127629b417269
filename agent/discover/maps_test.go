package discover

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseMapsLine(t *testing.T) {
	dev := func(maj, min uint32) uint64 { return unix.Mkdev(maj, min) }
	tests := []struct {
		name string
		line string
		want Mapping
	}{
		{
			name: "library",
			line: "7f1c2a000000-7f1c2a022000 r-xp 00001000 fd:01 1311769                    /usr/lib/x86_64-linux-gnu/libc.so.6",
			want: Mapping{Start: 0x7f1c2a000000, End: 0x7f1c2a022000, Perms: "r-xp", Offset: 0x1000,
				File: FileID{dev(0xfd, 1), 1311769}, Path: "/usr/lib/x86_64-linux-gnu/libc.so.6"},
		},
		{
			name: "deleted",
			line: "7f0050000000-7f0050010000 r--p 00000000 fd:01 2006   /tmp/libnccl.so.2 (deleted)",
			want: Mapping{Start: 0x7f0050000000, End: 0x7f0050010000, Perms: "r--p",
				File: FileID{dev(0xfd, 1), 2006}, Path: "/tmp/libnccl.so.2", Deleted: true},
		},
		{
			name: "spaces in path",
			line: "7f0050000000-7f0050010000 r--p 00000000 fd:01 2006   /opt/my  libs/lib nccl.so",
			want: Mapping{Start: 0x7f0050000000, End: 0x7f0050010000, Perms: "r--p",
				File: FileID{dev(0xfd, 1), 2006}, Path: "/opt/my  libs/lib nccl.so"},
		},
		{
			name: "spaces in path, deleted",
			line: "1000-2000 r-xp 00000000 08:02 7 /a b/libcuda.so.1 (deleted)",
			want: Mapping{Start: 0x1000, End: 0x2000, Perms: "r-xp", File: FileID{dev(8, 2), 7},
				Path: "/a b/libcuda.so.1", Deleted: true},
		},
		{
			name: "escaped newline",
			line: `1000-2000 r-xp 00000000 08:02 7 /weird\012name/libnccl.so`,
			want: Mapping{Start: 0x1000, End: 0x2000, Perms: "r-xp", File: FileID{dev(8, 2), 7},
				Path: "/weird\nname/libnccl.so"},
		},
		{
			name: "anonymous with trailing space",
			line: "7f0004120000-7f0004200000 rw-p 00000000 00:00 0 ",
			want: Mapping{Start: 0x7f0004120000, End: 0x7f0004200000, Perms: "rw-p"},
		},
		{
			name: "anonymous without name",
			line: "7f0004120000-7f0004200000 rw-p 00000000 00:00 0",
			want: Mapping{Start: 0x7f0004120000, End: 0x7f0004200000, Perms: "rw-p"},
		},
		{
			name: "pseudo path",
			line: "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]",
			want: Mapping{Start: 0x7ffd00000000, End: 0x7ffd00021000, Perms: "rw-p", Path: "[stack]"},
		},
		{
			name: "named anonymous",
			line: "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0   [anon:glibc malloc (deleted)]",
			want: Mapping{Start: 0x7ffd00000000, End: 0x7ffd00021000, Perms: "rw-p", Path: "[anon:glibc malloc (deleted)]"},
		},
		{
			name: "wide device numbers",
			line: "7f0020000000-7f0020400000 r--p 00000000 103:10f 3003  /usr/lib/libcuda.so.1",
			want: Mapping{Start: 0x7f0020000000, End: 0x7f0020400000, Perms: "r--p",
				File: FileID{dev(0x103, 0x10f), 3003}, Path: "/usr/lib/libcuda.so.1"},
		},
		{
			name: "vsyscall",
			line: "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]",
			want: Mapping{Start: 0xffffffffff600000, End: 0xffffffffff601000, Perms: "--xp", Path: "[vsyscall]"},
		},
		{
			name: "shared memory deleted",
			line: "7f0080000000-7f0080001000 rw-s 00000000 00:01 4096  /dev/zero (deleted)",
			want: Mapping{Start: 0x7f0080000000, End: 0x7f0080001000, Perms: "rw-s",
				File: FileID{dev(0, 1), 4096}, Path: "/dev/zero", Deleted: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMapsLine([]byte(tt.line), true)
			if err != nil {
				t.Fatalf("parseMapsLine: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseMapsLineWithoutPath(t *testing.T) {
	// Unknown libraries keep no path (and allocate none); known ones keep theirs.
	m, err := parseMapsLine([]byte("1000-2000 r-xp 00000000 08:02 7 /usr/lib/libc.so.6"), false)
	if err != nil || m.Path != "" || m.File.Inode != 7 {
		t.Errorf("unknown library: got %+v, %v", m, err)
	}
	m, err = parseMapsLine([]byte("1000-2000 r-xp 00000000 08:02 7 /usr/lib/libnccl.so.2 (deleted)"), false)
	if err != nil || m.Path != "/usr/lib/libnccl.so.2" || !m.Deleted {
		t.Errorf("known library: got %+v, %v", m, err)
	}
}

func TestParseMapsErrors(t *testing.T) {
	for _, line := range []string{
		"7f1c2a000000-7f1c2a022000 r-xp 00001000 fd:01",       // no inode
		"7f1c2a000000 r-xp 00001000 fd:01 1 /x",               // no range
		"7f1c2a000000-zz r-xp 00001000 fd:01 1 /x",            // bad hex
		"7f1c2a000000-7f1c2a022000 r-xp 00001000 fd01 1 /x",   // bad device
		"7f1c2a000000-7f1c2a022000 r-xp 00001000 fd:01 x1 /x", // bad inode
		"117f1c2a000000000-7f1c2a022000 r-xp 0 fd:01 1 /x",    // address too long
	} {
		_, err := parseMaps([]byte("1000-2000 r-xp 00000000 08:02 7 /ok\n" + line + "\n"))
		if !errors.Is(err, errMapsSyntax) {
			t.Errorf("%q: got %v, want errMapsSyntax", line, err)
		}
		if err != nil && !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%q: error %q does not name line 2", line, err)
		}
	}
}

func TestParseMapsFixture(t *testing.T) {
	data, err := os.ReadFile("testdata/proc/100/maps")
	if err != nil {
		t.Fatal(err)
	}
	ms, err := parseMaps(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 22 {
		t.Errorf("got %d mappings, want 22", len(ms))
	}
}

func TestClassifyLibrary(t *testing.T) {
	tests := map[string]LibraryKind{
		"libnccl.so":                 KindNCCL,
		"libnccl.so.2":               KindNCCL,
		"libnccl.so.2.28.9":          KindNCCL,
		"libnccl-net.so":             KindUnknown,
		"libnccl_static.a":           KindUnknown,
		"libnccl.sox":                KindUnknown,
		"libcudart.so.12":            KindCUDART,
		"libcudart-d0da41ae.so.11.0": KindCUDART,
		"libcudart-xyz.so.11.0":      KindUnknown,
		"libcuda.so":                 KindCUDA,
		"libcuda.so.1":               KindCUDA,
		"libcuda.so.580.65.06":       KindCUDA,
		"libcudadebugger.so.1":       KindUnknown,
		"libtorch_cpu.so":            KindTorchCPU,
		"libtorch_cuda.so":           KindTorchCUDA,
		"libtorch.so":                KindUnknown,
		"libtorch_cuda_linalg.so":    KindUnknown,
		"libslowrank_cupti.so":       KindCUPTIInject,
		"libcupti.so.12":             KindCUPTIRuntime,
		"python3.12":                 KindUnknown,
		"":                           KindUnknown,
		".so":                        KindUnknown,
		"lib-deadbeef.so":            KindUnknown,
	}
	for name, want := range tests {
		if got := classifyLibrary(name); got != want {
			t.Errorf("classifyLibrary(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestLibraryKindNames pins the names (stringer -linecomment): they are
// logged and are metrics labels. Out-of-range values keep the Type(N) form
// of the old hand-written table.
func TestLibraryKindNames(t *testing.T) {
	for k, want := range map[LibraryKind]string{
		KindUnknown: "unknown", KindNCCL: "nccl", KindCUDART: "cudart", KindCUDA: "cuda",
		KindTorchCPU: "torch_cpu", KindTorchCUDA: "torch_cuda", KindCUPTIInject: "cupti_inject",
		KindCUPTIRuntime: "libcupti", 8: "LibraryKind(8)", 255: "LibraryKind(255)",
	} {
		if got := k.String(); got != want {
			t.Errorf("LibraryKind %d: String() = %q, want %q", uint8(k), got, want)
		}
	}
}

func TestLibrariesFromMaps(t *testing.T) {
	data, err := os.ReadFile("testdata/proc/100/maps")
	if err != nil {
		t.Fatal(err)
	}
	libs, err := librariesFromMaps(data, "/proc", 100)
	if err != nil {
		t.Fatal(err)
	}
	type brief struct {
		Kind       LibraryKind
		Inode      uint64
		Base       uint64
		BaseOffset uint64
		Segments   int
		Deleted    bool
		HostPath   string
	}
	var got []brief
	for _, l := range libs {
		got = append(got, brief{l.Kind, l.File.Inode, l.Base, l.BaseOffset, len(l.Mappings), l.Deleted, l.HostPath})
	}
	sp := "/proc/100/root/opt/venv/lib/python3.12/site-packages/"
	want := []brief{
		{KindNCCL, 2001, 0x7f0000000000, 0, 4, false, sp + "nvidia/nccl/lib/libnccl.so.2"},
		{KindCUDART, 2002, 0x7f0010000000, 0, 2, false, sp + "nvidia/cuda_runtime/lib/libcudart.so.12"},
		{KindCUDA, 3003, 0x7f0020000000, 0, 2, false, "/proc/100/root/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06"},
		{KindTorchCPU, 2004, 0x7f0030000000, 0, 1, false, sp + "torch/lib/libtorch_cpu.so"},
		{KindTorchCUDA, 2005, 0x7f0040000000, 0, 1, false, sp + "torch/lib/libtorch_cuda.so"},
		{KindCUPTIInject, 2006, 0x7f0050000000, 0, 2, true, "/proc/100/root/opt/slowrank dev/lib/libslowrank_cupti.so"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if libs[2].File.Dev != unix.Mkdev(0x103, 2) {
		t.Errorf("libcuda dev = %#x, want 103:02", libs[2].File.Dev)
	}
	if want := "/proc/100/map_files/7f0000000000-7f0000100000"; libs[0].MapFilesPath != want {
		t.Errorf("MapFilesPath = %q, want %q", libs[0].MapFilesPath, want)
	}
}

func TestRuntimeAddr(t *testing.T) {
	l := Library{Base: 0x7f0000000000}
	if got := l.RuntimeAddr(0x1234, 0); got != 0x7f0000001234 {
		t.Errorf("first PT_LOAD at 0: got %#x", got)
	}
	// A prelinked-style library whose first PT_LOAD sits at 0x400000.
	if got := l.RuntimeAddr(0x401234, 0x400000); got != 0x7f0000001234 {
		t.Errorf("first PT_LOAD at 0x400000: got %#x", got)
	}
}

func TestFileIDString(t *testing.T) {
	if got := (FileID{Dev: unix.Mkdev(259, 2), Inode: 42}).String(); got != "259:2:42" {
		t.Errorf("got %q", got)
	}
}

// bigMaps builds a maps content like a torch process's: n lines, mostly anonymous memory and
// unrelated libraries, with the probed ones among them.
func bigMaps(n int) []byte {
	fixture, _ := os.ReadFile("testdata/proc/100/maps")
	var b strings.Builder
	b.Write(fixture)
	for i := range n {
		if i%3 == 0 {
			fmt.Fprintf(&b, "%x-%x r-xp 00000000 fd:01 %d                       /opt/venv/lib/python3.12/site-packages/pkg%d/_ext.cpython-312-x86_64-linux-gnu.so\n", 0x500000000000+i*0x10000, 0x500000010000+i*0x10000, 10000+i, i)
		} else {
			fmt.Fprintf(&b, "%x-%x rw-p 00000000 00:00 0 \n", 0x500000000000+i*0x10000, 0x500000010000+i*0x10000)
		}
	}
	return []byte(b.String())
}

func BenchmarkLibrariesFromMaps(b *testing.B) {
	data := bigMaps(5000)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := librariesFromMaps(data, "/proc", 1); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzParseMaps: /proc/PID/maps is shaped by its process (a mapping's path is
// any name its owner chose, newlines escaped as \012). parseMaps and
// librariesFromMaps never panic, agree with each other, and what they return
// holds the invariants the attach relies on: a library is one file, its
// mappings sorted and all of that file, its map_files path the range of its
// first mapping, and at most maxLibrariesPerProcess of them.
func FuzzParseMaps(f *testing.F) {
	if fixture, err := os.ReadFile("testdata/proc/100/maps"); err == nil {
		f.Add(fixture)
	}
	f.Add([]byte("7f0000000000-7f0000001000 r-xp 00001000 fd:01 1234 /usr/lib/libnccl.so.2\n" +
		"7f0000001000-7f0000002000 rw-p 00002000 fd:01 1234 /usr/lib/libnccl.so.2 (deleted)\n"))
	f.Add([]byte("00400000-00452000 r-xp 00000000 08:02 173521  /a b/libcudart.so.12\\012x\n"))
	f.Add([]byte("1-0 rwxp ffffffffffffffff ffffffff:ffffffff 18446744073709551615 /libcuda.so.1"))
	f.Add([]byte("7f0-7f1 r--p 0 0:0 0 [vdso]\n\n\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		all, perr := parseMaps(data)
		libs, lerr := librariesFromMaps(data, "/proc", 7)
		if (perr == nil) != (lerr == nil || errors.Is(lerr, errProcFileTooLarge)) {
			t.Fatalf("parseMaps: %v; librariesFromMaps: %v", perr, lerr)
		}
		if lerr != nil {
			return
		}
		if len(libs) > maxLibrariesPerProcess {
			t.Fatalf("%d libraries", len(libs))
		}
		files := map[FileID]bool{}
		for _, m := range all {
			if m.fileBacked() {
				files[m.File] = true
			}
		}
		for _, l := range libs {
			if len(l.Mappings) == 0 || !files[l.File] {
				t.Fatalf("library %+v: no mapping, or a file parseMaps did not see", l)
			}
			for i, m := range l.Mappings {
				if m.File != l.File {
					t.Fatalf("library %v holds a mapping of %v", l.File, m.File)
				}
				if i > 0 && m.Start < l.Mappings[i-1].Start {
					t.Fatalf("mappings of %v not sorted", l.File)
				}
			}
			first := l.Mappings[0]
			if l.Base != first.Start || l.BaseOffset != first.Offset ||
				l.MapFilesPath != fmt.Sprintf("/proc/7/map_files/%x-%x", first.Start, first.End) {
				t.Fatalf("library %+v: base or map_files path not its first mapping's", l)
			}
			if l.HostPath != "/proc/7/root"+l.Path || !strings.HasPrefix(l.Path, "/") {
				t.Fatalf("library path %q, host path %q", l.Path, l.HostPath)
			}
		}
	})
}
