package pgserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// errShmInUse is how postgres refuses to start while backends of a killed
// postmaster still hold its shared memory; they exit within moments.
const errShmInUse = "pre-existing shared memory block"

// initdb creates the cluster in s.dataDir, its output appended to the log.
func (s *Server) initdb(ctx context.Context) error {
	secret := make([]byte, 16)
	if _, err := rand.Read(secret); err != nil {
		return err
	}
	s.password = hex.EncodeToString(secret)
	pwfile := filepath.Join(s.root, "pwfile")
	if err := s.writeOwned(pwfile, s.password+"\n", 0o600); err != nil {
		return err
	}
	defer func() { _ = os.Remove(pwfile) }()
	log, err := s.openLog()
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }()
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin.dir, "initdb"),
		"-D", s.dataDir, "-U", superuser, "--pwfile", pwfile,
		"--auth-local=trust", "--auth-host=scram-sha-256",
		"--no-sync", "-E", "UTF8", "--locale=C")
	s.prepare(cmd, log)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgserver: initdb %s%s: %w\n%s", s.dataDir, s.account.describe(), err, s.LogTail(20))
	}
	return nil
}

// writeOwned writes a file the server's user owns.
func (s *Server) writeOwned(path, content string, mode os.FileMode) error {
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		return err
	}
	return s.account.chown(path)
}

func (s *Server) openLog() (*os.File, error) {
	return os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
}

// prepare sets what initdb and postgres share: the directory, an environment
// without PG* variables, the log, the user and the parent-death signal.
func (s *Server) prepare(cmd *exec.Cmd, log io.Writer) {
	cmd.Dir = s.root
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PG") })
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr(s.account)
}

// postgresArgs are the postmaster's flags: the data directory, the socket in
// s.root, TCP only when asked, fsync off only when Fast.
func (s *Server) postgresArgs() []string {
	args := []string{"-D", s.dataDir, "-k", s.root, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=" + s.tcpHost}
	if s.opts.Fast {
		args = append(args, "-c", "fsync=off")
	}
	for _, name := range slices.Sorted(maps.Keys(s.opts.Settings)) {
		args = append(args, "-c", name+"="+s.opts.Settings[name])
	}
	return args
}

// start runs the postmaster and waits until it accepts connections; it
// tries again while a killed postmaster's backends still hold its shared
// memory. s.mu is held.
func (s *Server) start(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.StartTimeout)
	defer cancel()
	for {
		err := s.startOnce(ctx)
		if err == nil || !errors.Is(err, errExited) || !strings.Contains(s.LogTail(5), errShmInUse) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

var errExited = errors.New("postgres exited before it accepted connections")

func (s *Server) startOnce(ctx context.Context) error {
	log, err := s.openLog()
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }() // the child has its own descriptor
	cmd := exec.Command(filepath.Join(s.bin.dir, "postgres"), s.postgresArgs()...)
	s.prepare(cmd, log)
	if err := startIn(s.opts.NetNS, cmd); err != nil {
		return fmt.Errorf("pgserver: starting postgres%s: %w", s.account.describe(), err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.proc, s.exited = cmd, exited
	if err := s.waitReady(ctx); err != nil {
		_ = s.halt(cmdKill)
		return fmt.Errorf("pgserver: postgres on %s: %w\nlog tail:\n%s", s.dataDir, err, s.LogTail(20))
	}
	return nil
}

// waitReady connects until a connection succeeds, the postmaster exits or
// ctx ends.
func (s *Server) waitReady(ctx context.Context) error {
	for {
		attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgconn.Connect(attempt, s.DSN(superuser))
		cancel()
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-s.exited:
			return errExited
		case <-ctx.Done():
			return fmt.Errorf("not accepting connections after %s (%w): last attempt: %w", s.opts.StartTimeout, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// signal names what halt sends.
type signal int

const (
	cmdInterrupt signal = iota // fast shutdown: roll back, checkpoint, exit
	cmdKill                    // a crash: no checkpoint
)

// halt signals the postmaster and waits for it to exit, killing it after
// stopTimeout. s.mu is held; a server not running is no error.
func (s *Server) halt(sig signal) error {
	if s.proc == nil {
		return nil
	}
	defer func() { s.proc, s.exited = nil, nil }()
	select {
	case <-s.exited:
		return nil // it had already exited (a crash, the OOM killer)
	default:
	}
	var err error
	if sig == cmdKill {
		err = s.proc.Process.Kill()
	} else {
		err = s.proc.Process.Signal(os.Interrupt)
	}
	if err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgserver: signalling postgres: %w", err)
	}
	select {
	case <-s.exited:
		return nil
	case <-time.After(stopTimeout):
	}
	_ = s.proc.Process.Kill()
	<-s.exited
	return fmt.Errorf("pgserver: postgres did not stop within %s of SIGINT; killed it\n%s", stopTimeout, s.LogTail(20))
}

// Shutdown stops the server cleanly (SIGINT: postgres's fast shutdown) and
// keeps its directory, so Restart can start it again. A server not running
// is no error.
func (s *Server) Shutdown() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.halt(cmdInterrupt)
}

// Stop shuts the server down (as Shutdown) and removes its directory. It is
// idempotent; the Server is unusable after it.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed {
		return nil
	}
	err := s.halt(cmdInterrupt)
	s.removed = true
	return errors.Join(err, os.RemoveAll(s.root))
}

// Kill crashes the server: SIGKILL to the postmaster, no checkpoint, the
// data directory kept. Restart then recovers from the write-ahead log.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return errors.New("pgserver: Kill: the server is not running")
	}
	return s.halt(cmdKill)
}

// Restart starts the server again on the same data directory, socket and
// port, after Kill or Shutdown (a running server is shut down first), and
// waits until it accepts connections.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed {
		return errors.New("pgserver: Restart: the server was stopped and its directory removed")
	}
	if err := s.halt(cmdInterrupt); err != nil {
		return err
	}
	return s.start(ctx)
}
