package admission

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// reviewOf wraps a pod in the AdmissionReview the API server sends for its
// creation.
func reviewOf(uid, pod string) string {
	return `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"` + uid +
		`","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},` +
		`"namespace":"ml","operation":"CREATE","object":` + pod + `}}`
}

func newTestHandler(t testing.TB, max int64) *Handler {
	t.Helper()
	h, err := New(Config{Options: Options{LibDir: libDir}, MaxRequestBytes: max, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// post sends body to h and decodes the answer.
func post(t *testing.T, h http.Handler, body string) response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, MutatePath, strings.NewReader(body)))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var rv review
	if err := json.Unmarshal(rec.Body.Bytes(), &rv); err != nil {
		t.Fatalf("answer %s: %v", rec.Body, err)
	}
	if rv.APIVersion != reviewAPIVersion || rv.Kind != reviewKind || rv.Response == nil || rv.Request != nil {
		t.Fatalf("answer is no AdmissionReview response: %s", rec.Body)
	}
	return *rv.Response
}

func TestHandlerAnswers(t *testing.T) {
	unlabelled := strings.Replace(bare, `"slowrank.dev/inject":"true"`, `"app":"train"`, 1)
	tests := []struct {
		name    string
		body    string
		uid     string
		patch   bool
		warning string // a substring of the one warning, "" for none
		count   func(Stats) int64
	}{
		{name: "an opted-in pod is patched", body: reviewOf("u1", bare), uid: "u1", patch: true,
			count: func(s Stats) int64 { return s.Patched }},
		{name: "a pod without the label is left alone", body: reviewOf("u2", unlabelled), uid: "u2",
			count: func(s Stats) int64 { return s.NotOptedIn }},
		{name: "a pod patched before is left alone", body: reviewOf("u3", byHand), uid: "u3",
			count: func(s Stats) int64 { return s.Unchanged }},
		{name: "a user's value is kept and said", body: reviewOf("u4", userValue), uid: "u4", patch: true,
			warning: "its value is kept", count: func(s Stats) int64 { return s.ValuesKept }},
		{name: "an update is not patched",
			body: strings.Replace(reviewOf("u5", bare), `"CREATE"`, `"UPDATE"`, 1), uid: "u5",
			count: func(s Stats) int64 { return s.NotPod }},
		{name: "another kind is not patched",
			body: strings.Replace(reviewOf("u6", bare), `"kind":"Pod"`, `"kind":"Deployment"`, 1), uid: "u6",
			count: func(s Stats) int64 { return s.NotPod }},
		{name: "not JSON: admitted with a warning", body: "{", warning: "bad admission request",
			count: func(s Stats) int64 { return s.Errors }},
		{name: "an old review version: admitted with a warning, uid kept",
			body: strings.Replace(reviewOf("u7", bare), "admission.k8s.io/v1", "admission.k8s.io/v1beta1", 1), uid: "u7",
			warning: "bad admission request", count: func(s Stats) int64 { return s.Errors }},
		{name: "a pod that is not an object: admitted with a warning",
			body: reviewOf("u8", `[1]`), uid: "u8", warning: "decoding the pod",
			count: func(s Stats) int64 { return s.Errors }},
		{name: "a review without uid: admitted with a warning",
			body: reviewOf("", bare), warning: "no request uid", count: func(s Stats) int64 { return s.Errors }},
		{name: "a body over the limit: admitted with a warning",
			body:    reviewOf("u9", strings.Replace(bare, `"name":"p"`, `"name":"`+strings.Repeat("p", 8<<10)+`"`, 1)),
			warning: "too large", count: func(s Stats) int64 { return s.Errors }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newTestHandler(t, 4<<10)
			resp := post(t, h, tt.body)
			if !resp.Allowed || resp.UID != tt.uid {
				t.Errorf("allowed %v uid %q, want allowed, uid %q", resp.Allowed, resp.UID, tt.uid)
			}
			if tt.patch != (resp.PatchType == "JSONPatch" && len(resp.Patch) > 0) {
				t.Errorf("patch type %q patch %s", resp.PatchType, resp.Patch)
			}
			if tt.warning == "" && len(resp.Warnings) > 0 || tt.warning != "" && (len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], tt.warning)) {
				t.Errorf("warnings %q, want one with %q", resp.Warnings, tt.warning)
			}
			if st := h.Stats(); st.Requests != 1 || tt.count(st) != 1 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

func TestHandlerBoundsWarnings(t *testing.T) {
	var cs []string
	for i := range 20 {
		cs = append(cs, `{"name":"`+strings.Repeat("c", 100)+strconv.Itoa(i)+`","env":[{"name":"CUDA_INJECTION64_PATH","value":"/x"}]}`)
	}
	pod := `{"metadata":{"labels":{"slowrank.dev/inject":"true"}},"spec":{"containers":[` + strings.Join(cs, ",") + `]}}`
	h := newTestHandler(t, 0)
	resp := post(t, h, reviewOf("w", pod))
	if len(resp.Warnings) != maxWarnings || !strings.Contains(resp.Warnings[maxWarnings-1], "13 more warnings") {
		t.Errorf("%d warnings: %q", len(resp.Warnings), resp.Warnings)
	}
	for _, w := range resp.Warnings {
		if len(w) > 160 {
			t.Errorf("warning of %d bytes: %q", len(w), w)
		}
	}
	if st := h.Stats(); st.ValuesKept != 20 || st.Patched != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestHandlerRefusesOtherMethods(t *testing.T) {
	h := newTestHandler(t, 0)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, MutatePath, nil))
	if rec.Code != http.StatusMethodNotAllowed || h.Stats().Errors != 1 {
		t.Errorf("GET: status %d, stats %+v", rec.Code, h.Stats())
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Options: Options{LibDir: "opt/slowrank/lib"}},
		{Options: Options{LibDir: ""}},
		{Options: Options{LibDir: libDir}, MaxRequestBytes: -1},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

// FuzzDecodeReview: the review's bytes come from the API server, across a
// trust boundary. Whatever they are, the answer is an allowed review for the
// uid read, and a patch, when there is one, is a JSON array of adds under
// /spec that the API server's patch library applies to the pod, after which
// the pod needs no other.
func FuzzDecodeReview(f *testing.F) {
	for _, pod := range []string{bare, twoContainers, userValue, valueFrom, envFrom, byHand, withInit, `null`, `{}`, `[]`} {
		f.Add([]byte(reviewOf("u", pod)))
	}
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`))
	f.Add([]byte(`{`))
	h := newTestHandler(f, 0)
	f.Fuzz(func(t *testing.T, body []byte) {
		uid, p, err := decodeReview(body)
		if err != nil {
			if p != nil {
				t.Fatalf("error %v with a pod", err)
			}
			return
		}
		if uid == "" {
			t.Fatal("decoded a review without uid")
		}
		ops, _, _ := plan(p, h.opts)
		for _, op := range ops {
			if op.Op != "add" || !strings.HasPrefix(op.Path, "/spec/") {
				t.Fatalf("op %+v", op)
			}
		}
		// The patch applies to the object as the API server applies it,
		// and the patched pod needs nothing more.
		var rv review
		if err := json.Unmarshal(body, &rv); err != nil {
			t.Fatal(err)
		}
		after := applyPatch(t, string(rv.Request.Object), ops)
		q, err := decodePod(after)
		if err != nil {
			t.Fatalf("the patched pod %s: %v", after, err)
		}
		if again, _, _ := plan(q, h.opts); p.optedIn() && len(again) != 0 {
			t.Fatalf("patched %s, then again %+v", after, again)
		}
		resp := post(t, h, string(body))
		if !resp.Allowed || resp.UID != uid {
			t.Fatalf("answer %+v for uid %q", resp, uid)
		}
		if len(resp.Patch) > 0 {
			var arr []json.RawMessage
			if err := json.NewDecoder(bytes.NewReader(resp.Patch)).Decode(&arr); err != nil || len(arr) != len(ops) {
				t.Fatalf("patch %s: %v", resp.Patch, err)
			}
		}
	})
}

// BenchmarkHandler: one review of a labelled two-container pod, decoded,
// planned and answered (the API server waits for this within
// timeoutSeconds).
func BenchmarkHandler(b *testing.B) {
	h := newTestHandler(b, 0)
	body := reviewOf("bench", twoContainers)
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, MutatePath, strings.NewReader(body)))
		if rec.Code != http.StatusOK {
			b.Fatal(rec.Code)
		}
	}
	if h.Stats().Patched == 0 {
		b.Fatal("nothing patched")
	}
}
