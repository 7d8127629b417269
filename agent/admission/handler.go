package admission

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path"
	"sync/atomic"
)

// DefaultMaxRequestBytes bounds a review's body: the API server's own limit
// on an object is 3 MiB, and the review wraps one object for a creation.
const DefaultMaxRequestBytes = 4 << 20

// Config configures a Handler.
type Config struct {
	Options
	// MaxRequestBytes bounds a request's body (default DefaultMaxRequestBytes).
	MaxRequestBytes int64
	Logger          *slog.Logger
}

// Handler answers AdmissionReviews over HTTP (ServeHTTP).
type Handler struct {
	opts  Options
	max   int64
	log   *slog.Logger
	stats stats
}

// Stats counts the reviews answered, by outcome; every request is counted
// in exactly one of Patched, NotOptedIn, Unchanged, NotPod and Errors.
type Stats struct {
	Requests   int64 // reviews received
	Patched    int64 // opted-in pods answered with a patch
	NotOptedIn int64 // pods without InjectLabel="true": left alone
	Unchanged  int64 // opted-in pods that already had everything
	NotPod     int64 // reviews of something other than a pod's creation
	Errors     int64 // bad input (too large, not a v1 review of a pod): admitted unpatched
	ValuesKept int64 // variables a container set to another value itself, kept
}

type stats struct {
	requests, patched, notOptedIn, unchanged, notPod, errors, kept atomic.Int64
}

// New returns a Handler, or an error when cfg is unusable.
func New(cfg Config) (*Handler, error) {
	if !path.IsAbs(cfg.LibDir) {
		return nil, fmt.Errorf("the library directory must be an absolute path, got %q", cfg.LibDir)
	}
	if cfg.MaxRequestBytes < 0 {
		return nil, fmt.Errorf("the request size limit must be positive, got %d", cfg.MaxRequestBytes)
	}
	h := &Handler{opts: cfg.Options, max: cfg.MaxRequestBytes, log: cfg.Logger}
	h.opts.LibDir = path.Clean(h.opts.LibDir)
	if h.max == 0 {
		h.max = DefaultMaxRequestBytes
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	h.log = h.log.With("component", "webhook")
	return h, nil
}

// Stats returns the counters so far.
func (h *Handler) Stats() Stats {
	s := &h.stats
	return Stats{Requests: s.requests.Load(), Patched: s.patched.Load(), NotOptedIn: s.notOptedIn.Load(),
		Unchanged: s.unchanged.Load(), NotPod: s.notPod.Load(), Errors: s.errors.Load(), ValuesKept: s.kept.Load()}
}

// ServeHTTP answers one AdmissionReview. The answer always allows the pod:
// on bad input it carries no patch and a warning that says why.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.stats.requests.Add(1)
	if r.Method != http.MethodPost {
		h.stats.errors.Add(1)
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST an admission.k8s.io/v1 AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	uid, ops, warns := h.review(r)
	out, err := encodeReview(uid, ops, warns)
	if err != nil {
		// Only a patch of values read from the pod could fail to encode;
		// answer without it.
		h.log.Warn("answering without a patch", "uid", uid, "err", err)
		out, _ = encodeReview(uid, nil, []string{"slowrank: webhook error, the pod is admitted without the library"})
	}
	w.Header().Set("Content-Type", "application/json")
	if _, err := w.Write(out); err != nil {
		// The API server went away (its timeout): it applies the webhook's
		// failurePolicy, and the pod may start without what was decided
		// for it, counted above as if answered.
		h.log.Warn("admission answer not delivered", "uid", uid, "err", err)
	}
}

// review reads and decides one request, and counts its outcome.
func (h *Handler) review(r *http.Request) (uid string, ops []Op, warns []string) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, h.max))
	if err != nil {
		return "", nil, h.fail("", fmt.Errorf("reading the request: %w", err))
	}
	uid, p, err := decodeReview(body)
	switch {
	case errors.Is(err, errNotPodCreate):
		h.stats.notPod.Add(1)
		return uid, nil, nil
	case err != nil:
		return uid, nil, h.fail(uid, err)
	case !p.optedIn():
		h.stats.notOptedIn.Add(1)
		return uid, nil, nil
	}
	ops, warns, kept := plan(p, h.opts)
	h.stats.kept.Add(int64(kept))
	warns = capWarnings(warns)
	if len(ops) == 0 {
		h.stats.unchanged.Add(1)
		return uid, nil, warns
	}
	h.stats.patched.Add(1)
	h.log.Debug("pod patched", "uid", uid, "pod", podName(p), "operations", len(ops), "warnings", len(warns))
	return uid, ops, warns
}

// fail counts bad input and returns the warning the answer carries.
func (h *Handler) fail(uid string, err error) []string {
	h.stats.errors.Add(1)
	h.log.Warn("bad admission request, pod admitted unpatched", "uid", uid, "err", err)
	return []string{"slowrank: bad admission request, the pod is admitted without the library: " + truncate(err.Error(), 200)}
}

// maxWarnings bounds the warnings of one answer: they come back to the
// user through the API server, which is not the place for one per container
// of a pod that has hundreds.
const maxWarnings = 8

func capWarnings(warns []string) []string {
	if len(warns) <= maxWarnings {
		return warns
	}
	return append(warns[:maxWarnings-1:maxWarnings-1], fmt.Sprintf("slowrank: %d more warnings like these", len(warns)-maxWarnings+1))
}

func podName(p *pod) string {
	if p.Metadata.Name != "" {
		return p.Metadata.Name
	}
	return p.Metadata.GenerateName + "*"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
