package fencectl

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKubeconfigNamesNoCluster: a kubeconfig that names no cluster to talk
// to gets an explanation, not client-go's fallback to localhost:8080.
// (cmd/kubectl-fence's TestNoKubeconfigHint runs the binary with no
// kubeconfig at all.)
func TestKubeconfigNamesNoCluster(t *testing.T) {
	// Not in a pod, whatever runs the test.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	empty := write("empty", "")
	noContext := write("no-context", `apiVersion: v1
kind: Config
clusters:
- name: prod
  cluster: {server: "https://prod.example:6443"}
- name: staging
  cluster: {server: "https://staging.example:6443"}
contexts:
- name: prod
  context: {cluster: prod, user: me}
- name: staging
  context: {cluster: staging, user: me}
users:
- name: me
  user: {token: t}
`)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"status", "--kubeconfig", empty}, []string{
			"error: no kubeconfig found; kubectl fence looked for:\n",
			"  - --kubeconfig " + empty + ": is empty\n",
			"not in a pod",
			"export KUBECONFIG=/path/to/kubeconfig",
		}},
		{[]string{"status", "--kubeconfig", noContext}, []string{
			"error: no kubeconfig found: the kubeconfig (" + noContext + ") sets no current-context: pick one with --context NAME, or kubectl config use-context NAME (contexts: prod, staging)",
		}},
	} {
		var out, errOut bytes.Buffer
		code := Run(context.Background(), tc.args, &out, &errOut)
		if code != 1 {
			t.Errorf("%v: exit code %d, want 1 (%s)", tc.args, code, errOut.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut.String(), w) {
				t.Errorf("%v printed\n%s\nwant it to contain %q", tc.args, errOut.String(), w)
			}
		}
		if strings.Contains(errOut.String(), "localhost:8080") {
			t.Errorf("%v: client-go's default server leaked:\n%s", tc.args, errOut.String())
		}
	}
}
