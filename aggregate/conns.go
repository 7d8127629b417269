package aggregate

import (
	"net"
	"sync"
	"sync/atomic"
)

// limitListener bounds the open connections, in all (Accept waits for a
// free slot) and per source address (a connection beyond its source's
// share is closed at once and counted), so that one source cannot take
// every slot.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	perSource int
	mu        sync.Mutex
	bySource  map[string]int
	refused   atomic.Int64
	closed    chan struct{}
	once      sync.Once
}

func newLimitListener(ln net.Listener, total, perSource int) *limitListener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, total), perSource: perSource,
		bySource: map[string]int{}, closed: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		select {
		case l.sem <- struct{}{}:
		case <-l.closed:
			return nil, net.ErrClosed
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.sem
			return nil, err
		}
		src := sourceKey(c.RemoteAddr())
		if !l.enter(src) {
			<-l.sem
			_ = c.Close()
			l.refused.Add(1)
			continue
		}
		return &limitConn{Conn: c, release: func() { l.leave(src); <-l.sem }}, nil
	}
}

func (l *limitListener) enter(src string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bySource[src] >= l.perSource {
		return false
	}
	l.bySource[src]++
	return true
}

func (l *limitListener) leave(src string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bySource[src]--; l.bySource[src] <= 0 {
		delete(l.bySource, src)
	}
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
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
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
