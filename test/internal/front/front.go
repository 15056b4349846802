// Package front is a test-only TCP front end standing in for a webhook
// Service: it spreads connections round-robin over the operator replicas'
// webhook ports and skips a replica it cannot reach (its process is gone, or
// a partition cuts it off), as a Service skips an endpoint once it is
// removed. A connection already open to a replica that dies is cut, as it
// would be in a cluster. test/ha runs it in process; test/chaos runs it, as
// `chaos front`, in each API server's network namespace.
package front

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Front is a running front end.
type Front struct {
	l           net.Listener
	backends    []string
	dialTimeout time.Duration
	next        atomic.Uint64
	skipped     atomic.Int64 // connections that found an unreachable backend first

	mu    sync.Mutex
	conns map[net.Conn]bool
}

// Listen serves on addr (host:port; port 0 picks one). dialTimeout bounds
// each try of a backend: a partitioned backend never refuses, it hangs.
func Listen(addr string, backends []string, dialTimeout time.Duration) (*Front, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	f := &Front{l: l, backends: backends, dialTimeout: dialTimeout, conns: map[net.Conn]bool{}}
	go f.serve()
	return f, nil
}

// Port is the port it listens on.
func (f *Front) Port() int { return f.l.Addr().(*net.TCPAddr).Port }

// Skipped counts connections that found an unreachable backend first.
func (f *Front) Skipped() int64 { return f.skipped.Load() }

// Close stops listening and cuts every open connection.
func (f *Front) Close() {
	_ = f.l.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		_ = c.Close()
	}
}

func (f *Front) serve() {
	for {
		in, err := f.l.Accept()
		if err != nil {
			return
		}
		go f.proxy(in)
	}
}

// dial tries the backends round-robin from the next one, skipping any it
// cannot connect to.
func (f *Front) dial() (net.Conn, error) {
	start := f.next.Add(1)
	var last error
	for i := range f.backends {
		out, err := net.DialTimeout("tcp", f.backends[(start+uint64(i))%uint64(len(f.backends))], f.dialTimeout)
		if err == nil {
			return out, nil
		}
		last = err
		f.skipped.Add(1)
	}
	return nil, last
}

func (f *Front) proxy(in net.Conn) {
	out, err := f.dial()
	if err != nil {
		_ = in.Close()
		return
	}
	f.track(in, out, true)
	defer f.track(in, out, false)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	_ = in.Close()
	_ = out.Close()
	<-done
}

func (f *Front) track(a, b net.Conn, open bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if open {
		f.conns[a], f.conns[b] = true, true
	} else {
		delete(f.conns, a)
		delete(f.conns, b)
	}
}
