package aggregate

import (
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// limitListener bounds the open connections, per source address (a
// connection beyond its source's share is closed at once and counted) and
// in all. Accept never waits for a slot: when all are taken, a new
// connection takes the slot of a connection of the source that holds the
// most, if that source holds more than the newcomer's does (evicted and
// counted; its oldest connection without a request in progress, else its
// oldest), else it is closed at once. Filling the slots from many sources
// (every loopback address is one) therefore delays nobody: a source with
// fewer connections than the largest gets in at once, and what it evicts
// is most likely a connection that sent nothing yet.
type limitListener struct {
	net.Listener
	total, perSource int
	mu               sync.Mutex
	open             int
	bySource         map[string][]*limitConn // oldest first
	refused, evicted atomic.Int64
}

func newLimitListener(ln net.Listener, total, perSource int) *limitListener {
	return &limitListener{Listener: ln, total: total, perSource: perSource, bySource: map[string][]*limitConn{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc, victim := l.admit(c)
		if victim != nil {
			_ = victim.Conn.Close() // the server's next read fails; it closes the rest
		}
		if lc == nil {
			_ = c.Close()
			l.refused.Add(1)
			continue
		}
		return lc, nil
	}
}

// admit takes a slot for c, or the slot of a victim (which the caller
// closes), or none (nil).
func (l *limitListener) admit(c net.Conn) (lc, victim *limitConn) {
	src := sourceKey(c.RemoteAddr())
	l.mu.Lock()
	defer l.mu.Unlock()
	mine := len(l.bySource[src])
	if mine >= l.perSource {
		return nil, nil
	}
	if l.open >= l.total {
		big := l.largest()
		if big == "" || len(l.bySource[big]) <= mine {
			return nil, nil
		}
		victim = oldestIdle(l.bySource[big])
		l.remove(victim)
		l.evicted.Add(1)
	}
	lc = &limitConn{Conn: c, l: l, src: src, since: time.Now()}
	l.bySource[src] = append(l.bySource[src], lc)
	l.open++
	return lc, victim
}

// largest is the source with the most connections (of two, the one whose
// oldest connection is older): O(sources), only when every slot is taken.
func (l *limitListener) largest() string {
	var best string
	for src, cs := range l.bySource {
		b := l.bySource[best]
		if best == "" || len(cs) > len(b) || len(cs) == len(b) && cs[0].since.Before(b[0].since) {
			best = src
		}
	}
	return best
}

// oldestIdle is the oldest connection without a request in progress, else
// the oldest (cs is oldest first).
func oldestIdle(cs []*limitConn) *limitConn {
	for _, c := range cs {
		if !c.busy.Load() {
			return c
		}
	}
	return cs[0]
}

// remove gives a connection's slot back once (closed or evicted); l.mu held.
func (l *limitListener) remove(c *limitConn) {
	if c.gone {
		return
	}
	c.gone = true
	cs := l.bySource[c.src]
	for i, o := range cs {
		if o == c {
			cs = append(cs[:i:i], cs[i+1:]...)
			break
		}
	}
	if len(cs) == 0 {
		delete(l.bySource, c.src)
	} else {
		l.bySource[c.src] = cs
	}
	l.open--
}

// sourceKey names the source of a connection: its IPv4 address, or the /64
// of its IPv6 address (one host usually holds a whole /64).
func sourceKey(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if ip4 := ta.IP.To4(); ip4 != nil {
		return ip4.String()
	}
	return ta.IP.Mask(net.CIDRMask(64, 128)).String()
}

type limitConn struct {
	net.Conn
	l     *limitListener
	src   string
	since time.Time
	gone  bool        // its slot was given back (l.mu)
	busy  atomic.Bool // a request is in progress (trackConnState)
}

// trackConnState is the http.Server's ConnState hook: it notes which
// connections are in a request, so that eviction spares them.
func trackConnState(c net.Conn, st http.ConnState) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if lc, ok := c.(*limitConn); ok {
		lc.busy.Store(st == http.StateActive)
	}
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.remove(c)
	c.l.mu.Unlock()
	return err
}
