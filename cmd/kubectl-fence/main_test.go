package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildPlugin builds kubectl-fence into a temporary directory and returns its path.
func buildPlugin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kubectl-fence")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestNoKubeconfigHint runs the binary where nothing names a cluster: no
// $KUBECONFIG, no ~/.kube/config, not in a pod. client-go alone would try
// http://localhost:8080 and print "connection refused"; the plugin says where
// it looked and how to point it at a cluster.
func TestNoKubeconfigHint(t *testing.T) {
	bin := buildPlugin(t)
	home := t.TempDir()
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name != "KUBECONFIG" && name != "HOME" && !strings.HasPrefix(name, "KUBERNETES_") {
			env = append(env, kv)
		}
	}
	env = append(env, "HOME="+home)
	for _, args := range [][]string{{"status"}, {"acquire", "batch"}, {"keys", "status"}} {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Fatalf("kubectl-fence %v: want exit code 1, got %v\n%s", args, err, out)
		}
		for _, want := range []string{
			"error: no kubeconfig found; kubectl fence looked for:",
			"$KUBECONFIG: not set",
			filepath.Join(home, ".kube", "config") + ": does not exist",
			"not in a pod",
			"export KUBECONFIG=/path/to/kubeconfig",
			"'make dev'",
		} {
			if !strings.Contains(string(out), want) {
				t.Errorf("kubectl-fence %v printed\n%s\nwant it to contain %q", args, out, want)
			}
		}
		if strings.Contains(string(out), "localhost:8080") {
			t.Errorf("kubectl-fence %v still reports client-go's default server:\n%s", args, out)
		}
	}

	// $KUBECONFIG naming files that are not there: the hint names them.
	missing := filepath.Join(home, "dev.kubeconfig")
	cmd := exec.Command(bin, "status")
	cmd.Env = append(env, "KUBECONFIG="+missing)
	out, _ := cmd.CombinedOutput()
	if want := "$KUBECONFIG: " + missing + " (does not exist)"; !strings.Contains(string(out), want) {
		t.Errorf("with KUBECONFIG=%s: printed\n%s\nwant it to contain %q", missing, out, want)
	}
}

// TestCompletionHelper runs kubectl_complete-fence as kubectl 1.26+ does for
// `kubectl fence <TAB>`: the words after `kubectl fence`, the last one being
// completed, with kubectl-fence found on PATH.
func TestCompletionHelper(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh to run the helper script")
	}
	dir := filepath.Dir(buildPlugin(t))
	helper, err := filepath.Abs("kubectl_complete-fence")
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) []string {
		t.Helper()
		cmd := exec.Command(helper, args...)
		cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+filepath.Join(dir, "none"))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s %v: %v", helper, args, err)
		}
		var names []string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			name, _, _ := strings.Cut(line, "\t")
			names = append(names, name)
		}
		return names
	}
	if got := run("completion", ""); strings.Join(got, " ") != "bash zsh fish powershell :4" {
		t.Errorf("completion <TAB> = %q", got)
	}
	got := strings.Join(run("re"), " ")
	for _, want := range []string{"release", "renew", "receipts"} {
		if !strings.Contains(got, want) {
			t.Errorf("re<TAB> = %q, want %s among them", got, want)
		}
	}
	if got := run("status", "-o", "ya"); strings.Join(got, " ") != "yaml :4" {
		t.Errorf("status -o ya<TAB> = %q", got)
	}
}
