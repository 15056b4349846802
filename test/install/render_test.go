package install

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/fencekeeper/fencekeeper/internal/localcp"
	fkrelease "github.com/fencekeeper/fencekeeper/internal/release"
)

// helmVersion must match HELM_VERSION in the Makefile: helm is built from
// the module proxy into bin/tools once, never added to go.mod.
const helmVersion = "v3.22.0"

// helmKubeVersion is the oldest Kubernetes the chart supports (its kubeVersion).
const helmKubeVersion = "1.31.0"

// object is one rendered manifest.
type object = map[string]any

// key names an object: kind, namespace and name.
func key(o object) string {
	meta, _ := o["metadata"].(map[string]any)
	ns, _ := meta["namespace"].(string)
	name, _ := meta["name"].(string)
	kind, _ := o["kind"].(string)
	return fmt.Sprintf("%s %s/%s", kind, ns, name)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := localcp.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// release is the fencekeeper release dist/ describes: the chart's appVersion.
func release(t *testing.T, root string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "dist", "chart", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(data, &chart); err != nil || chart.AppVersion == "" {
		t.Fatalf("dist/chart/Chart.yaml: no appVersion (%v)", err)
	}
	return chart.AppVersion
}

// run runs a command and returns its stdout; a failure names the command and its stderr.
func run(t *testing.T, stdin []byte, name string, args ...string) []byte {
	t.Helper()
	out, err := tryRun(stdin, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func tryRun(stdin []byte, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// renderKustomize renders config/default with the manager image set to img
// (and namespace, unless empty) as make build-installer does.
func renderKustomize(t *testing.T, root, img, namespace string) []byte {
	t.Helper()
	out, err := fkrelease.RenderInstall(context.Background(), "kubectl", root, img, namespace)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// helm returns bin/tools/helm-<version>, building it from the module proxy
// the first time (minutes on a busy machine; later runs reuse it). go install
// does not stamp helm's version, so the file name carries it (as in the Makefile).
func helm(t *testing.T, root string) string {
	t.Helper()
	bin := filepath.Join(root, "bin", "tools", "helm-"+helmVersion)
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	start := time.Now()
	t.Logf("building helm %s into %s (once)", helmVersion, bin)
	tmp := t.TempDir()
	cmd := exec.Command("go", "install", "helm.sh/helm/v3/cmd/helm@"+helmVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install helm.sh/helm/v3/cmd/helm@%s: %v\n%s", helmVersion, err, out)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(tmp, "helm"), bin); err != nil {
		t.Fatal(err)
	}
	t.Logf("built helm in %s", time.Since(start).Round(time.Second))
	return bin
}

// renderChart renders dist/chart (its CRDs are templates) with the given --set values.
func renderChart(t *testing.T, root string, set ...string) []byte {
	t.Helper()
	out, err := tryRenderChart(t, root, set...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func tryRenderChart(t *testing.T, root string, set ...string) ([]byte, error) {
	t.Helper()
	return tryRenderChartFiles(t, root, nil, set...)
}

// renderChartFiles renders dist/chart with values files (-f, in order), then --set values.
func renderChartFiles(t *testing.T, root string, files []string, set ...string) []byte {
	t.Helper()
	out, err := tryRenderChartFiles(t, root, files, set...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func tryRenderChartFiles(t *testing.T, root string, files []string, set ...string) ([]byte, error) {
	t.Helper()
	// --kube-version: the chart requires 1.31+, and helm template has no cluster to ask.
	args := []string{"template", "fencekeeper", filepath.Join(root, "dist", "chart"), "--kube-version", helmKubeVersion}
	for _, f := range files {
		args = append(args, "-f", f)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return tryRun(nil, helm(t, root), args...)
}

// parse splits multi-document YAML into objects, skipping empty documents.
func parse(t *testing.T, data []byte) []object {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var o object
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("%v in\n%s", err, doc)
		}
		if len(o) > 0 {
			out = append(out, o)
		}
	}
}

// byKey indexes objects; a duplicate key fails the test.
func byKey(t *testing.T, objs []object) map[string]object {
	t.Helper()
	m := make(map[string]object, len(objs))
	for _, o := range objs {
		k := key(o)
		if _, dup := m[k]; dup {
			t.Fatalf("%s rendered twice", k)
		}
		m[k] = o
	}
	return m
}

// chartOnlyLabels are the labels the chart adds to object metadata for Helm
// (release bookkeeping). With chartOnlyAnnotations they are the only allowed
// difference between the chart and config/default: selectors and pod
// templates are identical, so a kustomize install can be taken over by the
// chart without a re-created pod.
var chartOnlyLabels = []string{"app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/part-of", "helm.sh/chart"}

// chartOnlyAnnotations are the annotations the chart adds for Helm:
// helm.sh/resource-policy on the CRDs (crds.keep).
var chartOnlyAnnotations = []string{"helm.sh/resource-policy"}

// normalize removes the chart-only labels and annotations (and a map they leave empty).
func normalize(o object) object {
	meta, ok := o["metadata"].(map[string]any)
	if !ok {
		return o
	}
	if annotations, ok := meta["annotations"].(map[string]any); ok {
		for _, a := range chartOnlyAnnotations {
			delete(annotations, a)
		}
		if len(annotations) == 0 {
			delete(meta, "annotations")
		}
	}
	labels, ok := meta["labels"].(map[string]any)
	if !ok {
		return o
	}
	for _, l := range chartOnlyLabels {
		delete(labels, l)
	}
	if len(labels) == 0 {
		delete(meta, "labels")
	}
	return o
}

// diff lists the paths where a and b differ.
func diff(path string, a, b any) []string {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: %v != %v", path, a, b)}
		}
		keys := map[string]bool{}
		for k := range av {
			keys[k] = true
		}
		for k := range bv {
			keys[k] = true
		}
		var out []string
		for _, k := range sortedKeys(keys) {
			out = append(out, diff(path+"."+k, av[k], bv[k])...)
		}
		return out
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			return []string{fmt.Sprintf("%s: %v != %v", path, a, b)}
		}
		var out []string
		for i := range av {
			out = append(out, diff(fmt.Sprintf("%s[%d]", path, i), av[i], bv[i])...)
		}
		return out
	default:
		if !reflect.DeepEqual(a, b) {
			return []string{fmt.Sprintf("%s: %v != %v", path, a, b)}
		}
		return nil
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// compare reports every object present on one side only and every
// difference of the objects on both (after normalize).
func compare(t *testing.T, wantName string, want []object, gotName string, got []object) {
	t.Helper()
	w, g := byKey(t, want), byKey(t, got)
	for _, k := range sortedKeys(keysOf(w, g)) {
		wo, inW := w[k]
		gobj, inG := g[k]
		switch {
		case !inG:
			t.Errorf("%s is in %s but not in %s", k, wantName, gotName)
		case !inW:
			t.Errorf("%s is in %s but not in %s", k, gotName, wantName)
		default:
			if d := diff("", normalize(wo), normalize(gobj)); len(d) > 0 {
				t.Errorf("%s differs (%s != %s):\n  %s", k, wantName, gotName, strings.Join(d, "\n  "))
			}
		}
	}
}

func keysOf(ms ...map[string]object) map[string]bool {
	out := map[string]bool{}
	for _, m := range ms {
		for k := range m {
			out[k] = true
		}
	}
	return out
}
