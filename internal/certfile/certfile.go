// Package certfile serves a TLS certificate and key from two PEM files and
// reloads them when either changes, for every slowrank process that speaks
// TLS with files a Secret or cert-manager replaces while it runs: the pod
// webhook and the aggregator (server certificates) and the agent's
// forwarder (its client certificate). It imports no slowrank package.
package certfile

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// checkEvery is how often a handshake may stat the files: a renewal shows
// within a second, and a busy server does not stat twice per handshake.
const checkEvery = time.Second

// Reloader holds a certificate and key loaded from two PEM files. A
// handshake (GetCertificate, GetClientCertificate) reloads the pair when
// either file changed — checked at most once a second — and Reload does it
// at once (SIGHUP). A mounted Secret is replaced when cert-manager renews
// it; a pair that fails to load (one file written, not yet the other)
// keeps the previous certificate, is counted and is tried again.
type Reloader struct {
	certFile, keyFile string
	what              string
	log               *slog.Logger
	failures          atomic.Int64
	reloads           atomic.Int64

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

// New loads the pair once; it fails when the files are unusable. what
// names the certificate in logs and errors ("webhook certificate").
func New(certFile, keyFile, what string, log *slog.Logger) (*Reloader, error) {
	if log == nil {
		log = slog.Default()
	}
	r := &Reloader{certFile: certFile, keyFile: keyFile, what: what, log: log}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload loads the pair now. On error the previous certificate stays.
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.load()
}

// Failures counts reloads that failed (the previous certificate was kept).
func (r *Reloader) Failures() int64 { return r.failures.Load() }

// Reloads counts certificates loaded after the first.
func (r *Reloader) Reloads() int64 { return r.reloads.Load() }

// GetCertificate is tls.Config.GetCertificate (a server's certificate).
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.current(), nil
}

// GetClientCertificate is tls.Config.GetClientCertificate (a client's
// certificate, sent whatever CAs the server asks for: the server judges).
func (r *Reloader) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return r.current(), nil
}

// current returns the certificate, reloading it first when a file changed.
func (r *Reloader) current() *tls.Certificate {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) >= checkEvery {
		r.checked = time.Now()
		if stamp := r.stamps(); stamp != r.stamp {
			if err := r.load(); err != nil {
				r.log.Warn("reloading the "+r.what+", keeping the previous one", "err", err)
			} else {
				r.log.Info(r.what+" reloaded", "cert", r.certFile)
			}
		}
	}
	return r.cert
}

// load reads the pair; the caller holds mu.
func (r *Reloader) load() error {
	stamp := r.stamps()
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		if r.cert != nil {
			r.failures.Add(1)
		}
		return fmt.Errorf("loading the %s: %w", r.what, err)
	}
	if r.cert != nil {
		r.reloads.Add(1)
	}
	r.cert, r.stamp = &cert, stamp
	return nil
}

func (r *Reloader) stamps() [2]fileStamp {
	return [2]fileStamp{stampOf(r.certFile), stampOf(r.keyFile)}
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
