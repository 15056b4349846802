// Package pgserver runs a throwaway PostgreSQL server for the tests, the demo
// and the benchmarks. They need a real PostgreSQL (its locks, its crash
// recovery, its wire protocol), and nothing here may assume a container
// daemon, so the server is started from the machine's own server binaries in
// a fresh temporary directory that Stop removes.
//
// The binaries are found in Options.BinDir, else $FENCEKEEPER_PG_BINDIR,
// else the highest /usr/lib/postgresql/<version>/bin holding initdb and
// postgres (the Debian and Ubuntu layout), else `pg_config --bindir`, else
// PATH. `make postgres` installs them (apt-get) when none is found.
//
// The server listens on a unix socket in its own directory only (local
// connections are trusted, as user postgres) and, when
// Options.ListenAddress is set, on that TCP address too (scram-sha-256, with
// a password only this Server knows). Durability stays on unless
// Options.Fast: Kill then Restart is a real crash and a real recovery.
//
// Root: postgres refuses to run as root, and the tests and CI run as root.
// Then initdb and postgres run as user nobody (group nogroup) through the
// child's credentials, the directory is given to that user, and it is created
// under a temporary directory every user may traverse (os.TempDir, else
// /tmp). On Linux the postmaster gets Pdeathsig SIGKILL, so a test binary that
// dies leaves no server behind.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options configure Start. The zero value is a durable server on a unix
// socket only, from binaries found on the machine.
type Options struct {
	// BinDir holds initdb and postgres (default: $FENCEKEEPER_PG_BINDIR, then
	// the search the package comment describes).
	BinDir string
	// ListenAddress, "host:port", makes the server listen on TCP too (for a
	// fault-injecting proxy, or from another network namespace). Port 0 picks
	// a free port once; Restart keeps it.
	ListenAddress string
	// Fast turns fsync off: for benchmarks and tests that never crash the
	// server. Crash and restart tests need it false.
	Fast bool
	// Settings are extra server settings, passed as -c name=value.
	Settings map[string]string
	// StartTimeout bounds each wait for the server to accept connections
	// (default 60s: a restart after Kill replays the write-ahead log first).
	StartTimeout time.Duration
	// NetNS is a network namespace (a path such as /run/netns/NAME) the
	// postmaster runs in, on every start, so that it listens on that
	// namespace's addresses (ListenAddress) and a network cut there reaches
	// it. Linux only; it needs the privilege to enter the namespace (root).
	// The unix socket is a file and stays reachable from any namespace.
	NetNS string
}

// superuser is the bootstrap superuser initdb creates.
const superuser = "postgres"

// stopTimeout is how long Shutdown waits after SIGINT before it kills.
const stopTimeout = 30 * time.Second

// Server is one throwaway PostgreSQL server. Its methods are safe for
// concurrent use.
type Server struct {
	bin      binaries
	opts     Options
	account  *account // nil: initdb and postgres run as this process's user
	root     string   // the temporary directory: socket, log, data/
	dataDir  string
	logPath  string
	port     int
	tcpHost  string // listen_addresses; "" when on the unix socket only
	password string // the superuser's, for TCP

	mu      sync.Mutex
	proc    *exec.Cmd     // the postmaster; nil when not running
	exited  chan struct{} // closed when proc has exited
	removed bool
}

// Start creates a fresh cluster in a new temporary directory, starts
// postgres on it and waits until it accepts connections. The caller owns
// the server: Stop it (t.Cleanup(func() { _ = s.Stop() }) in tests).
func Start(ctx context.Context, opts Options) (*Server, error) {
	bin, err := findBinaries(opts.BinDir)
	if err != nil {
		return nil, err
	}
	acct, err := runAs()
	if err != nil {
		return nil, err
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	s := &Server{bin: bin, opts: opts, account: acct, port: 5432}
	if opts.ListenAddress != "" {
		if s.tcpHost, s.port, err = tcpListen(opts.ListenAddress); err != nil {
			return nil, err
		}
	}
	if s.root, err = makeRoot(acct); err != nil {
		return nil, err
	}
	s.dataDir = filepath.Join(s.root, "data")
	s.logPath = filepath.Join(s.root, "postgres.log")
	if err := s.initdb(ctx); err != nil {
		return nil, errors.Join(err, os.RemoveAll(s.root))
	}
	s.mu.Lock()
	err = s.start(ctx)
	s.mu.Unlock()
	if err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	return s, nil
}

// tcpListen splits ListenAddress into postgres's listen_addresses and port,
// choosing a free port for port 0.
func tcpListen(address string) (string, int, error) {
	host, portText, err := net.SplitHostPort(address)
	if err != nil {
		return "", 0, fmt.Errorf("pgserver: ListenAddress %q: %w", address, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("pgserver: ListenAddress %q: bad port", address)
	}
	if host == "" {
		host = "*"
	}
	if port == 0 {
		l, err := net.Listen("tcp", net.JoinHostPort(dialHost(host), "0"))
		if err != nil {
			return "", 0, fmt.Errorf("pgserver: choosing a port on %s: %w", host, err)
		}
		port = l.Addr().(*net.TCPAddr).Port
		if err := l.Close(); err != nil {
			return "", 0, err
		}
	}
	return host, port, nil
}

// dialHost is where a client reaches a server listening on host.
func dialHost(host string) string {
	switch host {
	case "*", "0.0.0.0":
		return "127.0.0.1"
	case "::":
		return "::1"
	}
	return host
}

// DSN is a libpq keyword/value connection string for database over the unix
// socket, as the superuser postgres (trusted: no password). pgx accepts it;
// pgx.ParseConfig then lets a caller connect as another role.
func (s *Server) DSN(database string) string {
	return dsn(map[string]string{
		"host": s.root, "port": strconv.Itoa(s.port), "user": superuser,
		"dbname": dbName(database), "sslmode": "disable",
	})
}

// TCPDSN is the same over TCP, with the superuser's password; "" when the
// server does not listen on TCP (Options.ListenAddress unset).
func (s *Server) TCPDSN(database string) string {
	if s.tcpHost == "" {
		return ""
	}
	return dsn(map[string]string{
		"host": dialHost(s.tcpHost), "port": strconv.Itoa(s.port), "user": superuser,
		"password": s.password, "dbname": dbName(database), "sslmode": "disable",
	})
}

// TCPAddress is the host:port a client dials to reach the server over TCP
// (what a proxy forwards to); "" when it does not listen on TCP.
func (s *Server) TCPAddress() string {
	if s.tcpHost == "" {
		return ""
	}
	return net.JoinHostPort(dialHost(s.tcpHost), strconv.Itoa(s.port))
}

// Password is the superuser's password, which TCP connections need.
func (s *Server) Password() string { return s.password }

// DataDir is the cluster's data directory.
func (s *Server) DataDir() string { return s.dataDir }

// SocketDir is the directory of the server's unix socket (libpq's host).
func (s *Server) SocketDir() string { return s.root }

func dbName(database string) string {
	if database == "" {
		return superuser
	}
	return database
}

// dsn writes keyword/value pairs in a fixed order, each value quoted.
func dsn(kv map[string]string) string {
	var b strings.Builder
	for _, k := range []string{"host", "port", "user", "password", "dbname", "sslmode"} {
		v, ok := kv[k]
		if !ok {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		v = strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v)
		fmt.Fprintf(&b, "%s='%s'", k, v)
	}
	return b.String()
}

// Exec runs sql (one or more statements, no parameters) in database as the
// superuser.
func (s *Server) Exec(ctx context.Context, database, sql string) error {
	conn, err := pgx.Connect(ctx, s.DSN(database))
	if err != nil {
		return fmt.Errorf("pgserver: connecting to %s: %w", dbName(database), err)
	}
	_, err = conn.Exec(ctx, sql)
	closeErr := conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("pgserver: in %s: %w", dbName(database), err)
	}
	return closeErr
}

// CreateDatabase creates database name, owned by the superuser.
func (s *Server) CreateDatabase(ctx context.Context, name string) error {
	return s.Exec(ctx, superuser, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
}

// LogTail is the last n lines of the server's log (initdb's output, then
// every postgres run's), for a failing test to print.
func (s *Server) LogTail(n int) string {
	raw, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if n >= 0 && len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
