package admission

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Paths served: the API server posts reviews to MutatePath (the chart's
// clientConfig.service.path); HealthPath answers the kubelet's probes.
const (
	MutatePath = "/mutate"
	HealthPath = "/healthz"
)

// NewServer returns the HTTPS server of h: reviews on MutatePath, a health
// check on HealthPath, the certificate from certs. Timeouts are short: the
// API server gives up after the webhook's timeoutSeconds (at most 30 s).
func NewServer(addr string, h *Handler, certs *CertReloader) *http.Server {
	mux := http.NewServeMux()
	mux.Handle(MutatePath, h)
	mux.HandleFunc(HealthPath, func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	return &http.Server{
		Addr:              addr,
		Handler:           mux,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate},
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(h.log.Handler(), slog.LevelDebug),
	}
}

// CertReloader serves a certificate and key from two PEM files and reloads
// them when either file changes — checked at a handshake, at most once a
// second — or on Reload (SIGHUP). A Secret mounted in a pod is replaced
// when cert-manager renews it; a pair that fails to load (one file written,
// not yet the other) keeps the previous certificate and is tried again.
type CertReloader struct {
	certFile, keyFile string
	log               *slog.Logger
	failures          atomic.Int64

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   [2]fileStamp
	checked time.Time
}

// fileStamp tells whether a file changed: a replaced Secret's files are new
// inodes behind the same names.
type fileStamp struct {
	ino, size int64
	mtime     time.Time
}

// NewCertReloader loads the pair once; it fails when the files are unusable.
func NewCertReloader(certFile, keyFile string, log *slog.Logger) (*CertReloader, error) {
	if log == nil {
		log = slog.Default()
	}
	c := &CertReloader{certFile: certFile, keyFile: keyFile, log: log.With("component", "webhook")}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload loads the pair now. On error the previous certificate stays.
func (c *CertReloader) Reload() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.load()
}

// Failures counts reloads that failed (the previous certificate was kept).
func (c *CertReloader) Failures() int64 { return c.failures.Load() }

// GetCertificate is tls.Config.GetCertificate.
func (c *CertReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.checked) >= time.Second {
		c.checked = time.Now()
		if stamp := c.stamps(); stamp != c.stamp {
			if err := c.load(); err != nil {
				c.log.Warn("reloading the webhook certificate, keeping the previous one", "err", err)
			} else {
				c.log.Info("webhook certificate reloaded", "cert", c.certFile)
			}
		}
	}
	return c.cert, nil
}

// load reads the pair; the caller holds mu.
func (c *CertReloader) load() error {
	stamp := c.stamps()
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		if c.cert != nil {
			c.failures.Add(1)
		}
		return fmt.Errorf("loading the webhook certificate: %w", err)
	}
	c.cert, c.stamp = &cert, stamp
	return nil
}

func (c *CertReloader) stamps() [2]fileStamp {
	return [2]fileStamp{stampOf(c.certFile), stampOf(c.keyFile)}
}

func stampOf(name string) fileStamp {
	fi, err := os.Stat(name)
	if err != nil {
		return fileStamp{}
	}
	s := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = int64(st.Ino)
	}
	return s
}
