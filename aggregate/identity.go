package aggregate

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/slowrank/slowrank/otel/wire"
)

// clientHosts returns the host names a client's verified certificate lets
// it claim: its DNS names, or its common name when it has none (nil
// without a client certificate).
func clientHosts(r *http.Request) []string {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.PeerCertificates) == 0 {
		return nil
	}
	cert := r.TLS.PeerCertificates[0]
	if len(cert.DNSNames) > 0 {
		return cert.DNSNames
	}
	if cert.Subject.CommonName != "" {
		return []string{cert.Subject.CommonName}
	}
	return nil
}

// client is who sent a request: the identity its quotas are kept under
// and the host names it may claim (nil: any, without client certificates).
type client struct {
	id    string
	hosts []string
}

// clientID names the client of a request for its quotas: its verified
// certificate (the host names it may claim) when it has one, else its
// source address (an IPv4 address, the /64 of an IPv6 one). A host name
// is never the key: any client may claim many of them. Without client
// certificates, clients behind one address (a NAT, a collector) share
// its quota, and each loopback address is a source of its own.
func clientID(r *http.Request, hosts []string) string {
	if len(hosts) > 0 {
		return "cert:" + strings.Join(hosts, ",")
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return "addr:" + r.RemoteAddr
	}
	return "addr:" + sourceKey(net.TCPAddrFromAddrPort(ap))
}

type clientKey struct{}

func withClient(ctx context.Context, c client) context.Context {
	return context.WithValue(ctx, clientKey{}, c)
}

func clientOf(ctx context.Context) client {
	c, _ := ctx.Value(clientKey{}).(client)
	return c
}

// checkHosts, with client certificates, rejects the facts that name a host
// the client's certificate does not: the sender (slowrank.host) and, in a
// topology, the host of every rank. Without client certificates every
// claim stands (a token holder may speak for any host).
func (s *Server) checkHosts(d wire.Decoded, hosts []string) wire.Decoded {
	if !s.mtls {
		return d
	}
	allowed := func(h string) bool {
		return slices.ContainsFunc(hosts, func(c string) bool { return strings.EqualFold(c, h) })
	}
	kept := d.Facts[:0]
	for _, f := range d.Facts {
		bad := f.Host
		if allowed(f.Host) {
			bad = ""
			if f.Topology != nil {
				for _, r := range f.Topology.Ranks {
					if !allowed(r.Host) {
						bad = r.Host
						break
					}
				}
			}
		}
		if bad != "" {
			s.stats.impersonation.Add(1)
			d.Reject(fmt.Errorf("%w: host %q is not named by the client certificate (%s)", wire.ErrInvalid, bad, strings.Join(hosts, ", ")))
			continue
		}
		kept = append(kept, f)
	}
	d.Facts = kept
	return d
}
