package admission

import (
	"crypto/tls"
	"log/slog"
	"net/http"
	"time"
)

// Paths served: the API server posts reviews to MutatePath (the chart's
// clientConfig.service.path); HealthPath answers the kubelet's probes.
const (
	MutatePath = "/mutate"
	HealthPath = "/healthz"
)

// NewServer returns the HTTPS server of h: reviews on MutatePath, a health
// check on HealthPath, the certificate from getCert (internal/certfile's
// Reloader, which follows a renewed Secret). Timeouts are short: the API
// server gives up after the webhook's timeoutSeconds (at most 30 s).
func NewServer(addr string, h *Handler, getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *http.Server {
	mux := http.NewServeMux()
	mux.Handle(MutatePath, h)
	mux.HandleFunc(HealthPath, func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	return &http.Server{
		Addr:              addr,
		Handler:           mux,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCert},
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(h.log.Handler(), slog.LevelDebug),
	}
}
