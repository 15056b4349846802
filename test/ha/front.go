// Package ha proves high availability against the embedded control plane:
// two manager processes behind a round-robin TCP front end (standing in for
// the webhook Service), one killed at a time in the middle of fenced traffic.
package ha

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// front is a round-robin TCP proxy in front of the replicas' webhook ports.
// A backend that refuses the connection (its process is gone) is skipped,
// as a Service skips an endpoint once it is removed; a connection already
// open to a replica that dies is cut, as it would be in a cluster.
type front struct {
	l        net.Listener
	backends []string
	next     atomic.Uint64
	skipped  atomic.Int64 // connections that found a dead backend first

	mu    sync.Mutex
	conns map[net.Conn]bool
}

func newFront(backends []string) (*front, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &front{l: l, backends: backends, conns: map[net.Conn]bool{}}
	go f.serve()
	return f, nil
}

func (f *front) port() int { return f.l.Addr().(*net.TCPAddr).Port }

func (f *front) close() {
	_ = f.l.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		_ = c.Close()
	}
}

func (f *front) serve() {
	for {
		in, err := f.l.Accept()
		if err != nil {
			return
		}
		go f.proxy(in)
	}
}

// dial tries the backends round-robin from the next one, skipping refusals.
func (f *front) dial() (net.Conn, error) {
	start := f.next.Add(1)
	var last error
	for i := range f.backends {
		out, err := net.Dial("tcp", f.backends[(start+uint64(i))%uint64(len(f.backends))])
		if err == nil {
			return out, nil
		}
		last = err
		if !errors.Is(err, syscall.ECONNREFUSED) {
			break
		}
		f.skipped.Add(1)
	}
	return nil, last
}

func (f *front) proxy(in net.Conn) {
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

func (f *front) track(a, b net.Conn, open bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if open {
		f.conns[a], f.conns[b] = true, true
	} else {
		delete(f.conns, a)
		delete(f.conns, b)
	}
}
