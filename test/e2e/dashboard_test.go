package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/test/testutil"
)

// dashboardQuery is one query of one panel of the shipped Grafana dashboard.
type dashboardQuery struct {
	Panel, Title, RefID, Expr string
}

// dashboardQueries parses deploy/grafana/slowrank-dashboard.json: every
// target of every panel (rows' nested panels included), so that a new panel
// is covered without touching the test, plus the template variables'
// label_values queries.
func dashboardQueries(t testing.TB) (qs []dashboardQuery, vars map[string]string, labelQueries []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "deploy", "grafana", "slowrank-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		ID      int     `json:"id"`
		Title   string  `json:"title"`
		Panels  []panel `json:"panels"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
			Hide  bool   `json:"hide"`
		} `json:"targets"`
	}
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				AllValue   string `json:"allValue"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				if tg.Expr != "" && !tg.Hide {
					qs = append(qs, dashboardQuery{fmt.Sprint(p.ID), p.Title, tg.RefID, tg.Expr})
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	vars = map[string]string{}
	for _, v := range d.Templating.List {
		switch v.Type {
		case "query":
			vars[v.Name] = v.AllValue
			labelQueries = append(labelQueries, v.Definition)
		case "custom":
			vars[v.Name] = v.AllValue
		}
	}
	return qs, vars, labelQueries
}

// expand substitutes $var and ${var} (Grafana's syntax) from vars.
func expand(expr string, vars map[string]string) string {
	return regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)\}?`).ReplaceAllStringFunc(expr, func(m string) string {
		name := strings.Trim(m, "${}")
		if v, ok := vars[name]; ok {
			return v
		}
		return m
	})
}

// startPrometheus runs a real Prometheus (Debian's prometheus package, the
// one that also brings promtool) scraping target every second, as
// deploy/README.md tells operators to (honor_labels). It skips when there
// is no prometheus binary (SLOWRANK_PROMETHEUS names one): then it
// returns "" and why (under SLOWRANK_E2E_REQUIRED it fails).
func startPrometheus(t testing.TB, st *stack, target string) (string, string) {
	t.Helper()
	bin := os.Getenv("SLOWRANK_PROMETHEUS")
	if bin == "" {
		bin = "prometheus"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		msg := "prometheus not found: apt-get install prometheus (Debian 12 has 2.42), or set SLOWRANK_PROMETHEUS"
		if os.Getenv("SLOWRANK_E2E_REQUIRED") != "" {
			t.Fatal(msg)
		}
		return "", msg
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: slowrank-otelcol
    honor_labels: true
    static_configs: [{targets: ['%s']}]
`, target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := testutil.FreeAddr(t)
	p := startServer(t, "prometheus", path, []string{"--config.file=" + filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path=" + filepath.Join(dir, "data"), "--web.listen-address=" + addr, "--log.level=warn"}, nil)
	base := "http://" + addr
	waitReady(t, p, st.client, base+"/-/ready")
	return base, ""
}

type promResult struct {
	Status string `json:"status"`
	Error  string `json:"error"`
	Data   struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
	} `json:"data"`
}

// checkDashboard evaluates every dashboard query on Prometheus (instant
// queries, now) with $job set to job and every other variable to its "All"
// value, and asserts that each returns data: one subtest per panel query.
func checkDashboard(t *testing.T, st *stack, prom, job string) {
	qs, vars, labelQueries := dashboardQueries(t)
	if len(qs) < 20 {
		t.Fatalf("only %d dashboard queries found: is the parser right?", len(qs))
	}
	vars["job"] = regexp.QuoteMeta(job)
	vars["__rate_interval"] = "1m"
	query := func(expr string) (promResult, error) {
		var r promResult
		err := getJSON(context.Background(), st.client, prom+"/api/v1/query?"+url.Values{"query": {expr}}.Encode(), &r)
		return r, err
	}
	for _, q := range qs {
		t.Run(fmt.Sprintf("panel %s %s", q.Panel, q.RefID), func(t *testing.T) {
			expr := expand(q.Expr, vars)
			var r promResult
			var err error
			// Metrics reach Prometheus on the next export (0.5 s) and scrape (1 s).
			for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(500 * time.Millisecond) {
				r, err = query(expr)
				if (err == nil && r.Status == "success" && len(r.Data.Result) > 0) || time.Now().After(deadline) {
					break
				}
			}
			if err != nil || r.Status != "success" {
				t.Fatalf("%q (%s): %v %s %s", q.Title, expr, err, r.Status, r.Error)
			}
			if len(r.Data.Result) == 0 {
				t.Fatalf("%q: %s returned no data", q.Title, expr)
			}
		})
	}
	for _, lq := range labelQueries {
		m := regexp.MustCompile(`^label_values\(([^,]+),\s*([a-zA-Z_]+)\)$`).FindStringSubmatch(lq)
		if m == nil {
			t.Errorf("template query %q: not label_values(metric, label)", lq)
			continue
		}
		var r struct {
			Data []string `json:"data"`
		}
		u := prom + "/api/v1/label/" + m[2] + "/values?" + url.Values{"match[]": {m[1]}}.Encode()
		if err := getJSON(context.Background(), st.client, u, &r); err != nil || !strings.Contains(strings.Join(r.Data, "\n"), job) {
			t.Errorf("template query %q: %v %v, want %s among them", lq, err, r.Data, job)
		}
	}
	t.Logf("%d dashboard queries returned data on Prometheus", len(qs))
}
