package check

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The documents whose claims about the DaemonSet are checked against the
// rendered chart, from the repository's root.
var claimDocs = []string{"README.md", "deploy/README.md", "docs/troubleshooting.md",
	"docs/getting-started.md", "docs/security.md", "docs/deploy.md"}

func readDoc(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sentences splits Markdown into sentences, paragraphs and table rows.
var sentenceEnd = regexp.MustCompile(`\.\s|\n\s*\n|\n\|`)

var (
	// "every capability dropped but `BPF`, `PERFMON`, ..." names the
	// capabilities the agent keeps.
	capClaim = regexp.MustCompile("every\\s+capability\\s+dropped\\s+but\\s+((?:`[A-Z_]+`(?:,\\s*)?)+)")
	capName  = regexp.MustCompile("`([A-Z_]+)`")
	// "served ... on port 9464 (`metrics.port`)" names the metrics port.
	portClaim = regexp.MustCompile("on\\s+port\\s+(\\d+)\\s+\\(`metrics\\.port`\\)")
	// Where the injection library sits on the node and in training pods.
	libPath = regexp.MustCompile(`/opt/slowrank/[^\s` + "`" + `"')]*libslowrank_cupti\.so`)
)

// TestDocsMatchTheManifests compares what README.md and docs/ say about the
// DaemonSet with what the chart renders: it is not privileged, the
// capabilities it keeps, /status and /metrics off the pod IP by default and
// the port they take when on, and where the injection library is.
func TestDocsMatchTheManifests(t *testing.T) {
	def, err := render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	on, err := render(t, map[string]any{"metrics": map[string]any{"enabled": true}})
	if err != nil {
		t.Fatal(err)
	}
	agent := container(t, def.ds.Spec.Template.Spec, "agent", false)
	var caps []string
	for _, c := range agent.SecurityContext.Capabilities.Add {
		caps = append(caps, string(c))
	}
	var libDir string
	for _, v := range def.ds.Spec.Template.Spec.Volumes {
		if v.Name == "host-lib" && v.HostPath != nil {
			libDir = v.HostPath.Path
		}
	}
	metricsPort := 0
	if p := container(t, on.ds.Spec.Template.Spec, "agent", false).Ports; len(p) == 1 {
		metricsPort = int(p[0].ContainerPort)
	}
	if libDir == "" || metricsPort == 0 || len(caps) == 0 {
		t.Fatalf("rendered chart: library directory %q, metrics port %d, capabilities %v", libDir, metricsPort, caps)
	}
	if *agent.SecurityContext.Privileged || len(agent.Ports) != 0 {
		t.Fatalf("the default DaemonSet is privileged (%v) or serves a port (%v): the docs say otherwise", *agent.SecurityContext.Privileged, agent.Ports)
	}

	claims := map[string]int{} // kind of claim -> how many were checked
	for _, path := range claimDocs {
		text, name := readDoc(t, path), path
		for _, s := range sentenceEnd.Split(text, -1) {
			s = strings.Join(strings.Fields(s), " ")
			// "privileged: false", "privileged: true" (the chart's value)
			// and "unprivileged" are not a claim that it is privileged.
			plain := strings.NewReplacer("unprivileged", "", "privileged: false", "", "privileged: true", "", "`privileged`", "").Replace(s)
			if strings.Contains(s, "DaemonSet") && strings.Contains(plain, "privileged") {
				t.Errorf("%s calls the DaemonSet privileged; it renders privileged: false with capabilities %v: %q", name, caps, s)
			}
		}
		for _, m := range capClaim.FindAllStringSubmatch(text, -1) {
			var got []string
			for _, c := range capName.FindAllStringSubmatch(m[1], -1) {
				got = append(got, c[1])
			}
			if !slices.Equal(got, caps) {
				t.Errorf("%s: the DaemonSet keeps %v, the chart renders %v", name, got, caps)
			}
			claims["capabilities"]++
		}
		for _, m := range portClaim.FindAllStringSubmatch(text, -1) {
			if p, _ := strconv.Atoi(m[1]); p != metricsPort {
				t.Errorf("%s: metrics on port %d, the chart renders %d", name, p, metricsPort)
			}
			claims["port"]++
		}
		if strings.Contains(strings.Join(strings.Fields(text), " "), "off the pod IP by default") {
			claims["off by default"]++
		}
		for _, p := range libPath.FindAllString(text, -1) {
			if p != libDir+"/libslowrank_cupti.so" {
				t.Errorf("%s: the injection library at %s, the chart installs it in %s/", name, p, libDir)
			}
			claims["library path"]++
		}
	}
	// The claims that README.md and troubleshooting.md make must be found,
	// or the test would pass by reading nothing.
	for _, kind := range []string{"capabilities", "port", "off by default", "library path"} {
		if claims[kind] == 0 {
			t.Errorf("no %s claim found in %v: the patterns of this test no longer match the docs", kind, claimDocs)
		}
	}
	if claims["capabilities"] < 2 {
		t.Errorf("%d capability lists found, want README.md's and troubleshooting.md's", claims["capabilities"])
	}
	// /status and /metrics stay off the pod IP by default: no --status-addr,
	// and with metrics.enabled the address binds the documented port.
	for _, a := range agent.Args {
		if strings.HasPrefix(a, "--status-addr") {
			t.Errorf("default args %v serve status on the pod IP", agent.Args)
		}
	}
	if args := container(t, on.ds.Spec.Template.Spec, "agent", false).Args; !slices.Contains(args, "--status-addr=0.0.0.0:"+strconv.Itoa(metricsPort)) {
		t.Errorf("metrics.enabled args %v do not serve port %d", args, metricsPort)
	}
}
