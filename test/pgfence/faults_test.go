package pgfence_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekeeper/fencekeeper/internal/pgserver"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// rolePassword is the password of the suite's roles on a fault server,
// which its workers reach over TCP (scram-sha-256).
const rolePassword = "fault-test"

// faultServer starts a PostgreSQL of the test's own: the fault tests cut
// its connections and crash it, which the suite's shared server must not
// suffer. It listens on TCP too, and names a synchronous standby that never
// comes: a transaction that sets synchronous_commit = on waits after its
// commit record for as long as its server process lives, its commit
// invisible to everyone else (the default here is local: nothing else waits).
func faultServer(t *testing.T) *pgserver.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := pgserver.Start(ctx, pgserver.Options{ListenAddress: "127.0.0.1:0", Settings: map[string]string{
		"synchronous_standby_names": "nobody", "synchronous_commit": "local",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fault server log:\n%s", s.LogTail(40))
		}
		_ = s.Stop()
	})
	for _, r := range []string{operatorRole, workerRole, breakGlassRole, ownerRole} {
		if err := s.Exec(ctx, "postgres", fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", r, rolePassword)); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// storeOn is newStore on another server than the suite's.
func storeOn(t *testing.T, srv *pgserver.Server) *store {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("t%d", time.Now().UnixNano())
	must(t, srv.CreateDatabase(ctx, name))
	s := &store{name: name, admin: connect(t, srv.DSN(name))}
	must(t, pgfence.Install(ctx, s.admin, pgfence.InstallOptions{OperatorRole: operatorRole, WorkerRoles: []string{workerRole}}))
	s.worker = connect(t, srv.DSN(name)+" user="+workerRole)
	s.operator = connect(t, srv.DSN(name)+" user="+operatorRole)
	return s
}

// poolOf is a pool of the workers' role on dsn (a keyword/value string).
func poolOf(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn + " user=" + workerRole)
	must(t, err)
	cfg.MaxConns = 4
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	must(t, err)
	t.Cleanup(p.Close)
	return p
}

// tcpDSN reaches database name at addr as the workers' role.
func tcpDSN(addr, name string) string {
	host, port, _ := net.SplitHostPort(addr)
	return fmt.Sprintf("host=%s port=%s password=%s dbname=%s sslmode=disable", host, port, rolePassword, name)
}

// Cut modes: what the proxy does with the next COMMIT a client sends.
const (
	forward   int32 = iota // nothing: it passes
	cutAfter               // let the server receive it, then cut both sides before its answer
	cutBefore              // cut both sides before the server receives it
)

// proxy forwards TCP connections to a PostgreSQL server and cuts one at a
// client's COMMIT when armed. pgx's Tx.Commit sends "commit" as a simple
// query ('Q'): Exec without arguments always uses the simple protocol.
//
// It drops every cancel request. pgx sends one on a connection it gives up
// (pgconn's asyncClose), and it would end a commit still waiting on the
// server before Commit looks; a cut network would not carry it either, and
// Commit must not count on it.
type proxy struct {
	ln     net.Listener
	target string
	mode   atomic.Int32 // the next COMMIT's fate; back to forward once used
	cuts   atomic.Int32
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn // every connection, closed when the test ends
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	p := &proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// arm makes the next COMMIT meet mode.
func (p *proxy) arm(mode int32) { p.mode.Store(mode) }

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

func (p *proxy) handle(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, client, server)
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		// The server's side is read to its end even after the client's is
		// closed, so that a half-closed server gets to process what it was sent.
		_, _ = io.Copy(ignoreErrors{client}, server)
		_ = client.Close()
		close(done)
	}()
	p.clientToServer(client, server)
	<-done
	_ = server.Close()
}

// clientToServer forwards the client's messages one by one, watching for COMMIT.
func (p *proxy) clientToServer(client, server net.Conn) {
	r := bufio.NewReader(client)
	startup := true // the first message has no type byte
	for {
		msg, typ, err := readMessage(r, startup)
		if err != nil {
			_ = server.(*net.TCPConn).CloseWrite()
			return
		}
		if startup && len(msg) == 16 && binary.BigEndian.Uint32(msg[4:8]) == cancelRequestCode {
			_ = client.Close()
			_ = server.Close()
			return
		}
		startup = false
		if isCommit(typ, msg) {
			switch p.mode.Swap(forward) {
			case cutAfter:
				p.cuts.Add(1)
				_ = client.Close() // the answer can no longer reach the client
				_, _ = server.Write(msg)
				_ = server.(*net.TCPConn).CloseWrite() // after the COMMIT: the server processes it
				return
			case cutBefore:
				p.cuts.Add(1)
				_ = client.Close()
				_ = server.Close()
				return
			}
		}
		if _, err := server.Write(msg); err != nil {
			_ = client.Close()
			return
		}
	}
}

// cancelRequestCode opens a CancelRequest, in place of a protocol version.
const cancelRequestCode = 80877102

// readMessage reads one protocol message whole: a type byte (none for the
// startup message), a big-endian length counting itself, the body.
func readMessage(r *bufio.Reader, startup bool) ([]byte, byte, error) {
	head := 5
	if startup {
		head = 4
	}
	msg := make([]byte, head)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, 0, err
	}
	n := int(binary.BigEndian.Uint32(msg[head-4:]))
	if n < 4 || n > 1<<30 {
		return nil, 0, fmt.Errorf("bad message length %d", n)
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, 0, err
	}
	var typ byte
	if !startup {
		typ = msg[0]
	}
	return append(msg, body...), typ, nil
}

func isCommit(typ byte, msg []byte) bool {
	if typ != 'Q' {
		return false
	}
	q := strings.TrimRight(string(msg[5:]), "\x00")
	q = strings.TrimSuffix(strings.TrimSpace(q), ";")
	return strings.EqualFold(q, "commit") || strings.EqualFold(q, "end")
}

// ignoreErrors is a writer that drops what it cannot write.
type ignoreErrors struct{ w io.Writer }

func (i ignoreErrors) Write(b []byte) (int, error) {
	_, _ = i.w.Write(b)
	return len(b), nil
}
