package operator

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// The embedded shape is the generated one: make manifests copies it.
func TestWebhookShapeIsGenerated(t *testing.T) {
	generated, err := os.ReadFile(filepath.Join("..", "..", "config", "webhook", "manifests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(generated, webhookShape) {
		t.Fatal("internal/operator/webhooks.yaml is not config/webhook/manifests.yaml: run make manifests, and raise WebhookShapeGeneration if the shape changed")
	}
	hooks, err := ShapeWebhooks()
	if err != nil || len(hooks) != 4 {
		t.Fatalf("ShapeWebhooks() = %d webhooks, %v", len(hooks), err)
	}
}

func TestPointedLike(t *testing.T) {
	hooks, err := ShapeWebhooks()
	if err != nil {
		t.Fatal(err)
	}
	url := "https://127.0.0.1:9443" + locksv1.ProtectedWebhookPath
	live := []admissionregistrationv1.ValidatingWebhook{{Name: "vprotected.fencekeeper.dev",
		ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: []byte("ca")}}}
	out, err := PointedLike(hooks, live)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range out {
		if w.ClientConfig.URL == nil || w.ClientConfig.Service != nil || len(w.ClientConfig.CABundle) != 0 {
			t.Fatalf("%s: clientConfig %+v; want the live server's URL and no caBundle", w.Name, w.ClientConfig)
		}
		want := "https://127.0.0.1:9443" + *hooks[indexOf(hooks, w.Name)].ClientConfig.Service.Path
		if *w.ClientConfig.URL != want {
			t.Errorf("%s: URL %s, want %s (same server, its own path)", w.Name, *w.ClientConfig.URL, want)
		}
	}
	if _, err := PointedLike(hooks, nil); err == nil {
		t.Error("PointedLike without live webhooks succeeded")
	}
}

func indexOf(hooks []admissionregistrationv1.ValidatingWebhook, name string) int {
	for i := range hooks {
		if hooks[i].Name == name {
			return i
		}
	}
	return -1
}

func TestWithExemptions(t *testing.T) {
	hooks, err := ShapeWebhooks()
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"locks-ops", "kube-public", "kube-system", "monitoring"}
	out := WithExemptions(hooks, names)
	for _, w := range out {
		var got []string
		if w.NamespaceSelector != nil {
			for _, e := range w.NamespaceSelector.MatchExpressions {
				if e.Key == corev1.LabelMetadataName && e.Operator == metav1.LabelSelectorOpNotIn {
					got = e.Values
				}
			}
		}
		protected := w.Name == "vprotected.fencekeeper.dev" || w.Name == "vprotected-enrolled.fencekeeper.dev"
		if protected && !reflect.DeepEqual(got, names) {
			t.Errorf("%s excludes %v, want %v", w.Name, got, names)
		}
		if !protected && got != nil {
			t.Errorf("%s excludes %v: only the protected entries exclude namespaces (the FencedResource webhook must see an entry there to refuse it)", w.Name, got)
		}
	}
	// Another order of the same names is no drift.
	reordered := WithExemptions(hooks, []string{"monitoring", "kube-system", "locks-ops", "kube-public"})
	if _, drift := WebhookDrift(out, reordered, false); drift != nil {
		t.Errorf("reordered exemptions are drift: %v", drift)
	}
}

func TestShapeGeneration(t *testing.T) {
	for v, want := range map[string]int{"": 0, "3": 3} {
		cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if v != "" {
			cfg.Annotations = map[string]string{locksv1.AnnotationWebhookShapeGeneration: v}
		}
		if got, err := ShapeGeneration(cfg); got != want || err != nil {
			t.Errorf("ShapeGeneration(%q) = %d, %v; want %d", v, got, err, want)
		}
	}
	bad := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{locksv1.AnnotationWebhookShapeGeneration: "newest"}}}
	if got, err := ShapeGeneration(bad); got != 0 || err == nil {
		t.Errorf("ShapeGeneration(newest) = %d, %v; want 0 and an error", got, err)
	}
}
