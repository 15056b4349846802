package demo

import (
	"bytes"
	"context"
	"net"
	"sync"
	"time"
)

// pause is a worker process that stops running (a GC pause, a SIGSTOP, a VM
// migration): once triggered, every request the worker sends, to the API
// server or to the database, waits until the pause is over. A paused process
// does not notice its deadlines either.
type pause struct {
	mu    sync.Mutex
	d     time.Duration
	until time.Time
}

// arm makes the next trigger start a pause of d.
func (p *pause) arm(d time.Duration) {
	p.mu.Lock()
	p.d = d
	p.mu.Unlock()
}

// hold triggers an armed pause when trigger is true, then waits out the
// pause in progress, if any.
func (p *pause) hold(trigger bool) {
	p.mu.Lock()
	if p.d > 0 && trigger {
		p.until, p.d = time.Now().Add(p.d), 0
	}
	wait := time.Until(p.until)
	p.mu.Unlock()
	if wait > 0 {
		time.Sleep(wait)
	}
}

// dialer dials the database for a worker whose pause is triggered by the
// first message naming begin_segment: the worker passed its guard, read the
// store's state and opened its transaction, and stops just before sending
// the segment. (The worker's pool uses the simple protocol, so every
// statement goes out as text.)
func (p *pause) dialer() func(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &pausedConn{Conn: c, p: p}, nil
	}
}

type pausedConn struct {
	net.Conn
	p *pause
}

func (c *pausedConn) Write(b []byte) (int, error) {
	c.p.hold(bytes.Contains(b, []byte("begin_segment")))
	return c.Conn.Write(b)
}
