package pgserver_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekeeper/fencekeeper/internal/pgserver"
)

func start(t *testing.T, opts pgserver.Options) *pgserver.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := pgserver.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", s.LogTail(40))
		}
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func connect(ctx context.Context, t *testing.T, dsn, user string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		cfg.User = user
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connecting to %s as %s: %v", dsn, cfg.User, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func count(ctx context.Context, t *testing.T, s *pgserver.Server) int {
	t.Helper()
	conn, err := pgx.Connect(ctx, s.DSN("app"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM ledger").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestServer: a database, a role, a query (over the socket and over TCP);
// committed rows survive a crash and a clean restart, an open transaction's
// do not; Stop removes the directory.
func TestServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := start(t, pgserver.Options{ListenAddress: "127.0.0.1:0"})
	if os.Geteuid() == 0 {
		fi, err := os.Stat(s.DataDir())
		if err != nil {
			t.Fatal(err)
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid == 0 {
			t.Errorf("running as root, the data directory belongs to root; want an unprivileged user")
		}
	}

	super := connect(ctx, t, s.DSN(""), "")
	var user, version string
	if err := super.QueryRow(ctx, "SELECT current_user, version()").Scan(&user, &version); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s as %s on %s", version, user, s.SocketDir())
	if user != "postgres" {
		t.Errorf("DSN connects as %q, want postgres", user)
	}
	if err := s.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if err := s.Exec(ctx, "app", `
		CREATE ROLE worker LOGIN;
		CREATE TABLE ledger (id int PRIMARY KEY, note text NOT NULL);
		GRANT SELECT, INSERT ON ledger TO worker;`); err != nil {
		t.Fatal(err)
	}

	worker := connect(ctx, t, s.DSN("app"), "worker")
	if _, err := worker.Exec(ctx, "INSERT INTO ledger VALUES (1, 'committed')"); err != nil {
		t.Fatal(err)
	}
	if _, err := worker.Exec(ctx, "DELETE FROM ledger"); err == nil {
		t.Error("worker deleted from ledger without the privilege")
	}
	overTCP := connect(ctx, t, s.TCPDSN("app"), "")
	var n int
	if err := overTCP.QueryRow(ctx, "SELECT count(*) FROM ledger").Scan(&n); err != nil || n != 1 {
		t.Fatalf("over TCP (%s): %d rows, %v; want 1", s.TCPAddress(), n, err)
	}
	open, err := worker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open.Exec(ctx, "INSERT INTO ledger VALUES (2, 'never committed')"); err != nil {
		t.Fatal(err)
	}

	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	// The backend serving worker learns of its postmaster's death
	// asynchronously: a ping sent at once may still be answered.
	if !eventuallyFails(func() error { return worker.Ping(ctx) }, 5*time.Second) {
		t.Error("a connection to the killed server still answers 5 s after the kill")
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if got := count(ctx, t, s); got != 1 {
		t.Errorf("after Kill and Restart: %d rows, want 1 (the committed one)", got)
	}

	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if got := count(ctx, t, s); got != 1 {
		t.Errorf("after Shutdown and Restart: %d rows, want 1", got)
	}
	if _, err := pgx.Connect(ctx, s.TCPDSN("app")); err != nil {
		t.Errorf("after Restart, over TCP: %v", err)
	}

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.SocketDir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Stop, %s: %v; want it gone", s.SocketDir(), err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := s.Restart(ctx); err == nil {
		t.Error("Restart after Stop succeeded")
	}
}

func TestUnixSocketOnly(t *testing.T) {
	s := start(t, pgserver.Options{Fast: true, Settings: map[string]string{"max_connections": "20"}})
	if s.TCPDSN("") != "" || s.TCPAddress() != "" {
		t.Errorf("without ListenAddress: TCPDSN %q, TCPAddress %q; want none", s.TCPDSN(""), s.TCPAddress())
	}
	ctx := context.Background()
	conn := connect(ctx, t, s.DSN(""), "")
	var listen, fsync, maxConns string
	if err := conn.QueryRow(ctx, "SELECT current_setting('listen_addresses'), current_setting('fsync'), current_setting('max_connections')").Scan(&listen, &fsync, &maxConns); err != nil {
		t.Fatal(err)
	}
	if listen != "" || fsync != "off" || maxConns != "20" {
		t.Errorf("listen_addresses %q, fsync %s, max_connections %s; want '', off, 20", listen, fsync, maxConns)
	}
}

func TestBinDirWithoutServer(t *testing.T) {
	_, err := pgserver.Start(context.Background(), pgserver.Options{BinDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "initdb") {
		t.Fatalf("Start with an empty BinDir: %v; want an error naming initdb", err)
	}
}

// TestOrphanedServerDies: when the process that started a server is killed,
// the postmaster goes too (Pdeathsig).
func TestOrphanedServerDies(t *testing.T) {
	if os.Getenv("PGSERVER_ORPHAN") == "1" {
		orphan()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOrphanedServerDies$")
	cmd.Env = append(os.Environ(), "PGSERVER_ORPHAN=1")
	out, err := cmd.Output()
	var dir string
	var pid int
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		_, _ = fmt.Sscanf(sc.Text(), "orphan %s %d", &dir, &pid)
	}
	if pid == 0 {
		t.Fatalf("the helper printed no postmaster (%v):\n%s", err, out)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("postmaster %d outlived the process that started it", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// orphan starts a server, prints its directory and postmaster, and dies.
func orphan() {
	s, err := pgserver.Start(context.Background(), pgserver.Options{Fast: true})
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	raw, err := os.ReadFile(filepath.Join(s.DataDir(), "postmaster.pid"))
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	pid, _, _ := strings.Cut(string(raw), "\n")
	fmt.Printf("orphan %s %s\n", s.SocketDir(), pid)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
}

// alive: pid exists and is no zombie.
func alive(pid int) bool {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, after, _ := strings.Cut(string(raw), ") ")
	return !strings.HasPrefix(after, "Z")
}

// NetNS runs the postmaster in another network namespace: it listens on
// that namespace's loopback, which this one's does not reach, and its unix
// socket stays reachable; Restart starts it there again.
func TestNetNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no iproute2")
	}
	ns := fmt.Sprintf("fkpg-test-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	s := start(t, pgserver.Options{Fast: true, NetNS: "/run/netns/" + ns, ListenAddress: "127.0.0.1:15432"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, step := range []string{"start", "restart"} {
		if err := connect(ctx, t, s.DSN(""), "").Ping(ctx); err != nil {
			t.Fatalf("%s: the unix socket: %v", step, err)
		}
		dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(dctx, s.TCPDSN(""))
		dcancel()
		if err == nil {
			_ = conn.Close(ctx)
			t.Fatalf("%s: reached the server on this namespace's 127.0.0.1:15432", step)
		}
		out, err := exec.Command("ip", "netns", "exec", ns, "ss", "-ltn").CombinedOutput()
		if err == nil && !strings.Contains(string(out), "127.0.0.1:15432") {
			t.Fatalf("%s: nothing listens on 127.0.0.1:15432 in %s:\n%s", step, ns, out)
		}
		if err := s.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := s.Restart(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// eventuallyFails calls f until it returns an error, for at most within.
func eventuallyFails(f func() error, within time.Duration) bool {
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		if f() != nil {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
