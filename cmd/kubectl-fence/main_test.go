package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCompletionHelper runs kubectl_complete-fence as kubectl 1.26+ does for
// `kubectl fence <TAB>`: the words after `kubectl fence`, the last one being
// completed, with kubectl-fence found on PATH.
func TestCompletionHelper(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh to run the helper script")
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "kubectl-fence"), ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
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
