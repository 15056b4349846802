// Package ha proves high availability against the embedded control plane:
// two manager processes behind a round-robin TCP front end (test/internal/front,
// standing in for the webhook Service), one killed at a time in the middle of
// fenced traffic.
package ha

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// replica is one manager process.
type replica struct {
	name    string
	port    int
	bin     string
	kubecfg string
	logPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	leading chan struct{} // closed when this process logs that it issues (it leads)
}

func (r *replica) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// start runs the manager as the operator user, leader election on, with the
// shared self-signed certificates; its log goes to logPath (appended).
func (r *replica) start() error {
	log, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(r.bin, "--leader-elect", "--namespace="+locksv1.DefaultNamespace,
		"--webhook-port="+strconv.Itoa(r.port), "--self-signed-certs", "--webhook-hosts=127.0.0.1,localhost",
		"--metrics-bind-address=0", "--health-probe-bind-address=0", "--webhook-cert-sync-interval=5s")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+r.kubecfg, "GOMEMLIMIT=256MiB")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	cmd.Stdout = log
	if err := cmd.Start(); err != nil {
		return err
	}
	exited, leading := make(chan struct{}), make(chan struct{})
	go func() {
		var once sync.Once
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(log, line)
			if strings.Contains(line, `"msg":"issuer ready"`) {
				once.Do(func() { close(leading) })
			}
		}
		_ = cmd.Wait()
		_ = log.Close()
		close(exited)
	}()
	r.mu.Lock()
	r.cmd, r.exited, r.leading = cmd, exited, leading
	r.mu.Unlock()
	return nil
}

// kill sends SIGKILL (no lease release, no graceful shutdown) and waits.
func (r *replica) kill() time.Time {
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.mu.Unlock()
	at := time.Now()
	_ = cmd.Process.Kill()
	<-exited
	return at
}

func (r *replica) stop() {
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
	default:
		_ = cmd.Process.Kill()
		<-exited
	}
}

func (r *replica) leadingCh() chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leading
}

// servedCert is the leaf this replica presents on its webhook port.
func (r *replica) servedCert(ctx context.Context) ([]byte, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := tls.Dial("tcp", r.addr(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only reads the leaf
		if err == nil {
			defer conn.Close()
			return conn.ConnectionState().PeerCertificates[0].Raw, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s does not serve TLS on %s after 60s: %w", r.name, r.addr(), err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func buildManager(root, dir string) (string, error) {
	bin := filepath.Join(dir, "manager")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/manager")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/manager: %v\n%s", err, out)
	}
	return bin, nil
}
