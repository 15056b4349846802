package install

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/fencekeeper/fencekeeper/internal/localcp"
)

// TestHelmUpgrade plays a chart's life on a real API server (a bare local
// control plane with the stand-in cert-manager and Prometheus Operator
// CRDs), as docs/install.md tells it:
//
//  1. a release installed from a chart that kept its CRDs in crds/ (Helm
//     installed them outside the release);
//  2. the docs' commands that hand those CRDs to the release, then a plain
//     `helm upgrade -f values` (no --reuse-values) to this chart with a CRD
//     changed: the API server serves the changed CRD;
//  3. `helm uninstall`: everything goes but the CRDs (crds.keep).
func TestHelmUpgrade(t *testing.T) {
	ctrllog.SetLogger(logr.Discard())
	root := repoRoot(t)
	bin := helm(t, root)
	// The installer's values file, as docs/install.md has it, and a profile.
	values := filepath.Join(t.TempDir(), "fencekeeper-values.yaml")
	if err := os.WriteFile(values, []byte("namespace:\n  create: false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	monitoring := filepath.Join(root, "test", "install", "testdata", "values", "monitoring.yaml")

	// This chart, with one CRD change an upgrade must deliver...
	newChart := filepath.Join(t.TempDir(), "chart")
	if err := os.CopyFS(newChart, os.DirFS(filepath.Join(root, "dist", "chart"))); err != nil {
		t.Fatal(err)
	}
	lockgrants := filepath.Join(newChart, "files", "crds", "locks.fencekeeper.dev_lockgrants.yaml")
	editFile(t, lockgrants, "    categories:\n    - fencekeeper\n", "    categories:\n    - fencekeeper\n    - fencekeeper-upgraded\n")
	// ...and the same chart as it was with crds/.
	oldChart := filepath.Join(t.TempDir(), "chart")
	if err := os.CopyFS(oldChart, os.DirFS(filepath.Join(root, "dist", "chart"))); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(oldChart, "files", "crds"), filepath.Join(oldChart, "crds")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(oldChart, "templates", "crds.yaml")); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cp, err := localcp.Start(ctx, localcp.Options{Root: root, Bare: true, CRDDirs: []string{filepath.Join(root, "test", "install", "testdata", "crds")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, cp.Env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	admin, err := cp.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	helmRun := func(args ...string) string {
		t.Helper()
		return string(run(t, nil, bin, append(args, "--kubeconfig", kubeconfig)...))
	}

	out := helmRun("install", "fencekeeper", oldChart, "-n", "fencekeeper-system", "--create-namespace", "-f", values, "-f", monitoring)
	for _, want := range []string{"kubectl -n fencekeeper-system rollout status deployment/fencekeeper-controller-manager",
		"troubleshooting.md#every-operator-replica-is-gone", "https://docs.example.com/fencekeeper/v0.1.0/install.md"} {
		if !strings.Contains(out, want) {
			t.Errorf("helm install's notes lack %q:\n%s", want, out)
		}
	}

	if _, err := tryRun(nil, bin, "upgrade", "fencekeeper", newChart, "-n", "fencekeeper-system", "-f", values, "-f", monitoring, "--kubeconfig", kubeconfig); err == nil ||
		!strings.Contains(err.Error(), "invalid ownership metadata") {
		t.Fatalf("upgrading over CRDs installed from crds/ without handing them over: %v; want Helm's ownership refusal (docs/install.md explains it)", err)
	}
	script := docsBlock(t, root, "### From a chart that had a crds/ directory")
	cmd := exec.Command("bash", "-ec", script)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docs/install.md's adoption commands: %v\n%s", err, b)
	}
	helmRun("upgrade", "fencekeeper", newChart, "-n", "fencekeeper-system", "-f", values, "-f", monitoring)
	crd := newCRD()
	if err := admin.Get(ctx, types.NamespacedName{Name: "lockgrants.locks.fencekeeper.dev"}, crd); err != nil {
		t.Fatal(err)
	}
	if categories, _, _ := unstructured.NestedStringSlice(crd.Object, "spec", "names", "categories"); !slices.Contains(categories, "fencekeeper-upgraded") {
		t.Errorf("after helm upgrade the API server serves the old CRD (categories %v)", categories)
	}
	if crd.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
		t.Errorf("CRD annotations %v lack the keep policy", crd.GetAnnotations())
	}

	// No kubelet runs the pre-delete cleanup Job here (TestEmergencyAndUninstall
	// plays one for it): this test is about what Helm keeps.
	out = helmRun("uninstall", "fencekeeper", "-n", "fencekeeper-system", "--no-hooks")
	for _, name := range []string{"fencedresources.locks.fencekeeper.dev", "lockgrants.locks.fencekeeper.dev"} {
		if err := admin.Get(ctx, types.NamespacedName{Name: name}, newCRD()); err != nil {
			t.Errorf("CRD %s after helm uninstall: %v; want it kept (helm said:\n%s)", name, err, out)
		}
	}
	err = admin.Get(ctx, client.ObjectKey{Namespace: "fencekeeper-system", Name: "fencekeeper-controller-manager"}, &appsv1.Deployment{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the Deployment after helm uninstall: %v; want it gone", err)
	}
}

func newCRD() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
	return u
}

// editFile replaces old (which must be there) by replacement in the file at path.
func editFile(t *testing.T, path, old, replacement string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), old) {
		t.Fatalf("%s has no %q", path, old)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(data), old, replacement, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// docsBlock returns the first sh block after heading in docs/install.md.
func docsBlock(t *testing.T, root, heading string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/install.md has no %q", heading)
	}
	_, block, ok := strings.Cut(section, "```sh\n")
	if !ok {
		t.Fatalf("docs/install.md: no sh block after %q", heading)
	}
	block, _, _ = strings.Cut(block, "```")
	return block
}
