package identity

import (
	"strings"
	"testing"
)

const (
	testCID = "4f3a1d2e9b8c7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f"
	testUID = "6f1c0e4a-2b8d-4c7e-9a51-3d2f8b7e1c90"
	// testUIDSystemd is testUID as the systemd cgroup driver writes it.
	testUIDSystemd = "6f1c0e4a_2b8d_4c7e_9a51_3d2f8b7e1c90"
)

func TestParseCgroupIdentity(t *testing.T) {
	tests := []struct {
		name     string
		data     string
		cid, uid string
	}{
		{"kubernetes, containerd, systemd driver, cgroup v2",
			"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUIDSystemd + ".slice/cri-containerd-" + testCID + ".scope\n",
			testCID, testUID},
		{"kubernetes guaranteed QoS, systemd driver",
			"0::/kubepods.slice/kubepods-pod" + testUIDSystemd + ".slice/cri-containerd-" + testCID + ".scope\n",
			testCID, testUID},
		{"kubernetes besteffort, CRI-O",
			"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + testUIDSystemd + ".slice/crio-" + testCID + ".scope\n",
			testCID, testUID},
		{"kubernetes, cgroupfs driver, cgroup v2",
			"0::/kubepods/burstable/pod" + testUID + "/" + testCID + "\n",
			testCID, testUID},
		{"kubernetes, cgroupfs driver, cgroup v1 (every hierarchy names it)",
			"12:memory:/kubepods/besteffort/pod" + testUID + "/" + testCID + "\n" +
				"11:cpu,cpuacct:/kubepods/besteffort/pod" + testUID + "/" + testCID + "\n" +
				"1:name=systemd:/kubepods/besteffort/pod" + testUID + "/" + testCID + "\n",
			testCID, testUID},
		{"kubernetes seen from the agent's own cgroup namespace",
			"0::/../../../kubepods-besteffort.slice/kubepods-besteffort-pod" + testUIDSystemd + ".slice/cri-containerd-" + testCID + ".scope\n",
			testCID, testUID},
		{"kubernetes cgroupfs from a cgroup namespace: no kubepods left in the path",
			"0::/../../pod" + testUID + "/" + testCID + "\n",
			testCID, testUID},
		{"cri-dockerd",
			"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUIDSystemd + ".slice/docker-" + testCID + ".scope\n",
			testCID, testUID},
		{"docker, systemd driver", "0::/system.slice/docker-" + testCID + ".scope\n", testCID, ""},
		{"docker, cgroupfs driver, cgroup v1", "13:pids:/docker/" + testCID + "\n1:name=systemd:/docker/" + testCID + "\n", testCID, ""},
		{"podman", "0::/machine.slice/libpod-" + testCID + ".scope\n", testCID, ""},
		{"podman rootless, nested container cgroup",
			"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + testCID + ".scope/container\n", testCID, ""},
		{"nerdctl", "0::/system.slice/nerdctl-" + testCID + ".scope\n", testCID, ""},
		{"conmon is not the container", "0::/machine.slice/libpod-conmon-" + testCID + ".scope\n", "", ""},
		{"crio conmon is not the container",
			"0::/kubepods.slice/kubepods-pod" + testUIDSystemd + ".slice/crio-conmon-" + testCID + ".scope\n", "", testUID},
		{"docker in docker: the inner runtime names it",
			"0::/docker/" + strings.Repeat("a", 64) + "/docker/" + testCID + "\n", testCID, ""},
		{"the v2 line wins over v1 lines",
			"4:memory:/docker/" + strings.Repeat("b", 64) + "\n0::/system.slice/docker-" + testCID + ".scope\n", testCID, ""},
		{"slurm step", "0::/system.slice/slurmstepd.scope/job_12345/step_0/user/task_0\n", "", ""},
		{"user session", "0::/user.slice/user-1000.slice/session-3.scope\n", "", ""},
		{"bare host process", "0::/init.scope\n", "", ""},
		{"empty", "", "", ""},
		{"no final newline", "0::/system.slice/docker-" + testCID + ".scope", testCID, ""},
		{"uppercase id is not a runtime's", "0::/docker/" + strings.ToUpper(testCID) + "\n", "", ""},
		{"id one digit short", "0::/docker/" + testCID[1:] + "\n", "", ""},
		{"id one digit long", "0::/system.slice/docker-" + testCID + "0.scope\n", "", ""},
		{"pod uid with a wrong group", "0::/kubepods/pod6f1c0e4a2-b8d-4c7e-9a51-3d2f8b7e1c90/" + testCID + "\n", testCID, ""},
		{"systemd uid outside kubepods is not a pod",
			"0::/machine.slice/machine-pod" + testUIDSystemd + ".slice\n", "", ""},
		{"lines without the three fields", "garbage\n0:/docker/" + testCID + "\n", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ParseCgroup([]byte(tc.data))
			if got.ContainerID != tc.cid || got.PodUID != tc.uid {
				t.Errorf("got %+v, want container %q pod %q", got, tc.cid, tc.uid)
			}
		})
	}
}

// FuzzParseCgroupIdentity: /proc/PID/cgroup of a process that another user
// runs (its cgroup names are that user's when it created its own), so no
// input may crash the parser, and nothing but an exact id may come out.
func FuzzParseCgroupIdentity(f *testing.F) {
	for _, s := range []string{
		"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUIDSystemd + ".slice/cri-containerd-" + testCID + ".scope\n",
		"12:memory:/kubepods/besteffort/pod" + testUID + "/" + testCID + "\n1:name=systemd:/x\n",
		"0::/../../pod" + testUID + "/" + testCID,
		"0::/kubepods-pod.slice/pod/.scope/docker-.scope\n::\n:\n0::\n",
		"0::/kubepods-x-pod" + testUIDSystemd + "-pod" + testUIDSystemd + ".slice\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		id := ParseCgroup(data)
		if id.ContainerID != "" && !isContainerID(id.ContainerID) {
			t.Fatalf("container id %q is not 64 hex digits", id.ContainerID)
		}
		if id.PodUID != "" && !isUUID(id.PodUID) {
			t.Fatalf("pod uid %q is not a UUID", id.PodUID)
		}
		if id.ContainerID != "" && !strings.Contains(string(data), id.ContainerID) {
			t.Fatalf("container id %q is not in the input", id.ContainerID)
		}
	})
}
