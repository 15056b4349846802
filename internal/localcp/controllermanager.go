package localcp

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
)

const (
	// ControllerManagerBinary is kube-controller-manager's file name in the
	// assets directory (hack/build-control-plane.sh kube-controller-manager).
	ControllerManagerBinary = "kube-controller-manager"
	// ControllerManagerUser is the identity kube-controller-manager itself
	// runs as: the API server's bootstrap RBAC binds it to the role that lets
	// it create its controllers' service accounts and request their tokens.
	ControllerManagerUser = "system:kube-controller-manager"
)

// ControllerServiceAccounts are the kube-system service accounts the two
// controllers act as (--use-service-account-credentials), each created as its
// controller starts: the namespace controller is the user the webhooks let
// empty a terminating namespace (api/v1alpha1 NamespaceControllerUsername).
var ControllerServiceAccounts = []string{"namespace-controller", "generic-garbage-collector"}

// ControllerManagerArgs are kube-controller-manager's flags: only the
// namespace and garbage-collector controllers, each acting as its own service
// account, no leader election (one instance), no serving port.
func ControllerManagerArgs(kubeconfig string) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=namespace-controller,garbage-collector-controller",
		"--use-service-account-credentials",
		"--leader-elect=false",
		"--secure-port=0",
		"--v=1",
	}
}

// ControllerManager is a running kube-controller-manager process.
type ControllerManager struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // Wait's result, once exited is closed
	tail   *tailWriter
	dir    string
}

// StartControllerManager runs kube-controller-manager from assets with a
// kubeconfig of ControllerManagerUser (kubeconfig: its contents), its output
// copied to out (nil: kept only for errors). It returns once both controllers
// have their service accounts, i.e. have started; admin reads them.
func StartControllerManager(ctx context.Context, assets string, kubeconfig []byte, out io.Writer, admin client.Reader) (*ControllerManager, error) {
	bin := filepath.Join(assets, ControllerManagerBinary)
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s is not built in %s: run `make controller-manager` (hack/build-control-plane.sh kube-controller-manager) first", ControllerManagerBinary, assets)
	}
	dir, err := os.MkdirTemp("", "fencekeeper-kcm-")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	m := &ControllerManager{exited: make(chan struct{}), tail: &tailWriter{max: 16 << 10}, dir: dir}
	m.cmd = exec.Command(bin, ControllerManagerArgs(path)...)
	var w io.Writer = m.tail
	if out != nil {
		w = io.MultiWriter(out, m.tail)
	}
	m.cmd.Stdout, m.cmd.Stderr = w, w
	if err := m.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		m.err = m.cmd.Wait()
		close(m.exited)
	}()
	if err := m.waitStarted(ctx, admin); err != nil {
		_ = m.Stop()
		return nil, err
	}
	return m, nil
}

// waitStarted waits until each controller has created its service account
// (it does so as it starts), failing early if the process exits.
func (m *ControllerManager) waitStarted(ctx context.Context, admin client.Reader) error {
	deadline := time.Now().Add(60 * time.Second)
	for _, name := range ControllerServiceAccounts {
		for {
			select {
			case <-m.exited:
				return fmt.Errorf("kube-controller-manager exited before its controllers started (%v); its last output:\n%s", m.err, m.tail)
			default:
			}
			err := admin.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: name}, &corev1.ServiceAccount{})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("kube-controller-manager did not start its controllers within 60s (no service account kube-system/%s: %v); its last output:\n%s", name, err, m.tail)
			}
			if err := ctxtime.Sleep(ctx, 100*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// Stop ends kube-controller-manager (SIGTERM, then SIGKILL after 5 s) and
// removes its kubeconfig. Stopping an already stopped one does nothing.
func (m *ControllerManager) Stop() error {
	if m == nil {
		return nil
	}
	defer os.RemoveAll(m.dir)
	select {
	case <-m.exited:
		return nil
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(5 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
	return nil
}

// tailWriter keeps the last max bytes written, for error messages.
type tailWriter struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailWriter) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(t.buf))
	if s == "" {
		return "(none)"
	}
	return s
}
