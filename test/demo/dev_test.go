package demo_test

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/fencekeeper/fencekeeper/internal/localcp"
)

// TestDev runs make dev's program: it must print the KUBECONFIG to export,
// serve kubectl and the operator's webhooks with that kubeconfig, and on
// Ctrl-C stop everything it started.
func TestDev(t *testing.T) {
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
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dev := exec.CommandContext(ctx, bin, "-dir", dir, "-metrics-bind-address", "0")
	dev.Dir = root
	stdout, err := dev.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	dev.Stderr = os.Stderr
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
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
	host := strings.TrimPrefix(cfg.Host, "https://")
	if err := dev.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	<-drained // all output read before Wait closes the pipe
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
}
