package demo_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fencekeeper/fencekeeper/internal/localcp"
)

// TestDev runs make dev's program as make dev PROTECTED_KINDS=widgets.example.com/v1
// runs it: it must print the KUBECONFIG to export, serve kubectl and the
// operator's webhooks with that kubeconfig, protect the declared custom kind,
// delete namespaces and collect garbage as a cluster does, and on Ctrl-C stop
// everything it started.
func TestDev(t *testing.T) {
	ctrl.SetLogger(logr.Discard())
	root, err := localcp.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "fencekeeper-dev")
	build := exec.Command("go", "build", "-o", bin, "./cmd/dev")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build cmd/dev: %v\n%s", err, out)
	}
	checkMakeDevFlags(t, root)
	// A malformed kind is refused before anything starts, naming the variable and the form.
	bad, err := exec.Command(bin, "-protected-kinds", "widgets").CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(bad), `PROTECTED_KINDS (-protected-kinds): protected kind "widgets": no version (want <resource>.<group>/<version>`) {
		t.Fatalf("make dev PROTECTED_KINDS=widgets: want exit 2 and an error naming the form, got exit %d:\n%s", code, bad)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dev := exec.CommandContext(ctx, bin, "-dir", dir, "-metrics-bind-address", "0", "-protected-kinds", "widgets.example.com/v1")
	dev.Dir = root
	stdout, err := dev.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	dev.Stderr = os.Stderr
	// A failing check ends the test: make dev is interrupted as by Ctrl-C,
	// so that it stops its etcd, kube-apiserver and kube-controller-manager
	// (SIGKILL would leave them running).
	dev.Cancel = func() error { return dev.Process.Signal(os.Interrupt) }
	dev.WaitDelay = 30 * time.Second
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			cancel()
			_ = dev.Wait()
		}
	})
	lines := bufio.NewScanner(stdout)
	exportRE := regexp.MustCompile(`^export KUBECONFIG=(/\S+)$`)
	var kubeconfig string
	for kubeconfig == "" && lines.Scan() {
		if m := exportRE.FindStringSubmatch(lines.Text()); m != nil {
			kubeconfig = m[1]
		}
	}
	if kubeconfig != filepath.Join(dir, "kubeconfig") {
		_ = dev.Process.Kill()
		t.Fatalf("no `export KUBECONFIG=<absolute path>` line (got %q)", kubeconfig)
	}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for lines.Scan() {
			t.Log(lines.Text())
		}
	}()

	// kubectl works with it, and the operator's webhooks answer through the API server.
	kubectl := func(args ...string) (string, error) {
		cmd := exec.Command("kubectl", append([]string{"--kubeconfig", kubeconfig}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := kubectl("get", "crd", "fencedresources.locks.fencekeeper.dev"); err != nil {
		t.Fatalf("kubectl get crd: %v\n%s", err, out)
	}
	if out, err := kubectl("create", "namespace", "billing"); err != nil {
		t.Fatalf("kubectl create namespace: %v\n%s", err, out)
	}
	// The sample's FencedResource does not exist here: the LockGrant webhook
	// refuses it with a field error (422) that kubectl shows by path.
	out, err := kubectl("create", "-f", filepath.Join(root, "config/samples/lockgrant.yaml"), "--dry-run=server")
	if err == nil || !strings.Contains(out, `The LockGrant "invoice-batch-2026-07-19-req-1" is invalid: spec.resource: Invalid value`) {
		t.Fatalf("the LockGrant webhook did not judge the sample: err %v\n%s", err, out)
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl("apply", "-f", filepath.Join(root, "test/envtest/testdata/widgets.yaml")); err != nil {
		t.Fatalf("kubectl apply the Widget CRD: %v\n%s", err, out)
	}
	if out, err := kubectl("wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=30s"); err != nil {
		t.Fatalf("the Widget CRD is not established: %v\n%s", err, out)
	}
	d := &devCluster{t: t, ctx: ctx, dir: dir, admin: clientFor(t, kubeconfig)}
	d.protectWidget()
	d.namespacesDelete()
	d.garbageCollected()

	host := strings.TrimPrefix(cfg.Host, "https://")
	kcm := childPID(t, dev.Process.Pid, "kube-controller")
	if err := dev.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	<-drained // all output read before Wait closes the pipe
	waited = true
	if err := dev.Wait(); err != nil {
		t.Fatalf("make dev did not exit cleanly on Ctrl-C: %v", err)
	}
	if c, err := net.DialTimeout("tcp", host, time.Second); err == nil {
		c.Close()
		t.Fatalf("the API server at %s still answers after Ctrl-C", host)
	}
	if _, err := os.Stat(kubeconfig); !os.IsNotExist(err) {
		t.Errorf("the kubeconfig %s outlived make dev", kubeconfig)
	}
	if err := syscall.Kill(kcm, 0); err == nil {
		t.Errorf("kube-controller-manager (pid %d) outlived make dev", kcm)
	}
}

// checkMakeDevFlags checks that make dev hands PROTECTED_KINDS to the program.
func checkMakeDevFlags(t *testing.T, root string) {
	t.Helper()
	cmd := exec.Command("make", "-n", "dev", "PROTECTED_KINDS=widgets.example.com/v1")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n dev: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^bin/fencekeeper-dev .*-protected-kinds=widgets\.example\.com/v1\b`).Match(out) {
		t.Fatalf("make dev PROTECTED_KINDS=widgets.example.com/v1 does not pass -protected-kinds to bin/fencekeeper-dev:\n%s", out)
	}
}

func exitCode(err error) int {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// childPID is the pid of dev's child process whose command name starts with comm.
func childPID(t *testing.T, parent int, comm string) int {
	t.Helper()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(data)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		var pid, ppid int
		var state string
		if _, err := fmt.Sscan(s[:open], &pid); err != nil {
			continue
		}
		if _, err := fmt.Sscan(s[end+1:], &state, &ppid); err != nil {
			continue
		}
		if ppid == parent && strings.HasPrefix(s[open+1:end], comm) {
			return pid
		}
	}
	t.Fatalf("make dev (pid %d) runs no %s process", parent, comm)
	return 0
}
