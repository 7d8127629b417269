// Package deploy holds no code: its tests check the shipped manifests (the
// plain Kubernetes ones and the systemd unit) for what docs/security.md
// promises. The Helm chart is rendered and validated by its own module,
// deploy/helm/check.
package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// agentCaps is the capability set of agent/privilege/caps.go.
var agentCaps = []string{"BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH", "DAC_OVERRIDE", "CHECKPOINT_RESTORE"}

type container struct {
	Name            string   `yaml:"name"`
	Image           string   `yaml:"image"`
	Args            []string `yaml:"args"`
	Ports           []any    `yaml:"ports"`
	SecurityContext struct {
		Privileged               *bool `yaml:"privileged"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
			Add  []string `yaml:"add"`
		} `yaml:"capabilities"`
		SeccompProfile struct {
			Type string `yaml:"type"`
		} `yaml:"seccompProfile"`
	} `yaml:"securityContext"`
}

type manifest struct {
	Kind string `yaml:"kind"`
	Spec struct {
		Template struct {
			Spec struct {
				InitContainers []container `yaml:"initContainers"`
				Containers     []container `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// manifests decodes every YAML document of a file.
func manifests(t *testing.T, path string) []manifest {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []manifest
	for {
		var m manifest
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if m.Kind == "" {
			t.Fatalf("%s: a document without kind", path)
		}
		out = append(out, m)
	}
}

func TestDaemonSetIsLeastPrivilegeAndPinned(t *testing.T) {
	var found bool
	for _, m := range manifests(t, "kubernetes/daemonset.yaml") {
		if m.Kind != "DaemonSet" {
			continue
		}
		found = true
		spec := m.Spec.Template.Spec
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			if strings.HasSuffix(c.Image, ":latest") || !strings.Contains(c.Image, ":") {
				t.Errorf("container %s: image %q is not a release", c.Name, c.Image)
			}
			if p := c.SecurityContext.Privileged; p != nil && *p {
				t.Errorf("container %s is privileged", c.Name)
			}
			if e := c.SecurityContext.AllowPrivilegeEscalation; e == nil || *e {
				t.Errorf("container %s may escalate privileges", c.Name)
			}
			if !slices.Equal(c.SecurityContext.Capabilities.Drop, []string{"ALL"}) {
				t.Errorf("container %s drops %v, want ALL", c.Name, c.SecurityContext.Capabilities.Drop)
			}
		}
		agent := spec.Containers[0]
		if !slices.Equal(agent.SecurityContext.Capabilities.Add, agentCaps) {
			t.Errorf("agent adds %v, want %v", agent.SecurityContext.Capabilities.Add, agentCaps)
		}
		if agent.SecurityContext.SeccompProfile.Type != "Unconfined" {
			t.Errorf("agent seccomp profile %q: the runtime's default refuses bpf()", agent.SecurityContext.SeccompProfile.Type)
		}
		for _, a := range agent.Args {
			if strings.HasPrefix(a, "--status-addr") || a == "--status-allow-remote" {
				t.Errorf("agent serves /status on the pod IP: %q", a)
			}
		}
		if len(agent.Ports) != 0 {
			t.Errorf("agent exposes ports %v", agent.Ports)
		}
	}
	if !found {
		t.Fatal("no DaemonSet")
	}
	if ms := manifests(t, "kubernetes/networkpolicy-metrics.yaml"); len(ms) != 1 || ms[0].Kind != "NetworkPolicy" {
		t.Errorf("networkpolicy-metrics.yaml: %+v", ms)
	}
	if ms := manifests(t, "kubernetes/training-pod-example.yaml"); len(ms) == 0 {
		t.Error("training-pod-example.yaml has no manifest")
	}
}

// unitDirectives reads the [Service] settings of a systemd unit.
func unitDirectives(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read only
	out := map[string]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, _ := strings.Cut(line, "=")
			out[k] = v
		}
	}
	return out
}

func TestSystemdUnitKeepsItsHardening(t *testing.T) {
	d := unitDirectives(t, "systemd/slowrank-agent.service")
	want := map[string]string{
		"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "read-only", "PrivateTmp": "yes",
		"ProtectKernelModules": "yes", "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes",
		"RestrictNamespaces": "yes", "RestrictSUIDSGID": "yes", "LockPersonality": "yes",
		"MemoryDenyWriteExecute": "yes", "PrivateIPC": "yes", "SystemCallArchitectures": "native",
		"RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6", "SystemCallErrorNumber": "EPERM",
		"SystemCallFilter": "@system-service bpf perf_event_open", "UMask": "0027", "MemoryMax": "1G",
	}
	for k, v := range want {
		if d[k] != v {
			t.Errorf("%s=%q, want %q", k, d[k], v)
		}
	}
	// The bounding set is the agent's set (plus SYS_RESOURCE for kernels
	// before 5.11), nothing more.
	bounding := strings.Fields(d["CapabilityBoundingSet"])
	wantCaps := []string{"CAP_SYS_RESOURCE"}
	for _, c := range agentCaps {
		wantCaps = append(wantCaps, "CAP_"+c)
	}
	slices.Sort(bounding)
	slices.Sort(wantCaps)
	if !slices.Equal(bounding, wantCaps) {
		t.Errorf("CapabilityBoundingSet %v, want %v", bounding, wantCaps)
	}
}
