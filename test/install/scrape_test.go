package install

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// TestServiceMonitorScrape installs the chart with the monitoring profile on
// a bare dev cluster, runs one manager replica from its Deployment (as
// TestREADMEInstall does; this test also plays cert-manager for both
// Certificates and the token controller for the scraper's Secret), then
// scrapes /metrics exactly as the rendered ServiceMonitor tells Prometheus
// to: the Bearer token from its Secret, the CA from its Secret, its
// serverName. The scrape succeeds, and fails without the token or for a name
// the certificate does not carry: the verification is real.
func TestServiceMonitorScrape(t *testing.T) {
	ctrllog.SetLogger(logr.Discard())
	root := repoRoot(t)
	bin := t.TempDir()
	for name, pkg := range map[string]string{"fencekeeper-dev": "./cmd/dev", "manager": "./cmd/manager"} {
		run(t, nil, "go", "build", "-C", root, "-o", filepath.Join(bin, name), pkg)
	}
	if err := os.Symlink(helm(t, root), filepath.Join(bin, "helm")); err != nil {
		t.Fatal(err)
	}
	c := startBareDev(t, root, bin)
	shell(t, c, "kubectl apply -f "+filepath.Join(root, "test", "install", "testdata", "crds"))
	shell(t, c, "helm install fencekeeper dist/chart -n fencekeeper-system --create-namespace --set namespace.create=false -f "+
		filepath.Join(root, "test", "install", "testdata", "values", "monitoring.yaml"))
	c.issueCertificates(t)
	c.fillServiceAccountToken(t, "fencekeeper-system", "fencekeeper-metrics-scraper-token")
	c.runManagerPod(t, bin)

	scrape := c.serviceMonitorScrape(t, "fencekeeper-system", "fencekeeper-metrics")
	url := fmt.Sprintf("https://127.0.0.1:%d/metrics", c.metricsPort)
	// Ready means the webhook server serves; the metrics server may start a moment later.
	status, body, err := scrape.get(url)
	for deadline := time.Now().Add(15 * time.Second); err != nil && strings.Contains(err.Error(), "connection refused") && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		status, body, err = scrape.get(url)
	}
	if err != nil || status != http.StatusOK || !strings.Contains(body, "fencekeeper_build_info") {
		t.Fatalf("scrape as the ServiceMonitor says: status %d, error %v, body %.300s", status, err, body)
	}
	noToken := scrape
	noToken.token = ""
	if status, _, err := noToken.get(url); err != nil || status != http.StatusUnauthorized {
		t.Errorf("scrape without the token: status %d, error %v; want 401", status, err)
	}
	otherName := scrape
	otherName.serverName = "fencekeeper-webhook-service.fencekeeper-system.svc"
	if _, _, err := otherName.get(url); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("scrape verifying another name: %v; want a certificate error", err)
	}
}

// scrapeConfig is what a ServiceMonitor endpoint tells Prometheus.
type scrapeConfig struct {
	token, serverName string
	roots             *x509.CertPool
}

func (s scrapeConfig) get(url string) (int, string, error) {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.roots, ServerName: s.serverName, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// serviceMonitorScrape reads the installed ServiceMonitor's first endpoint
// and the Secrets it names, as the Prometheus Operator does.
func (c *devCluster) serviceMonitorScrape(t *testing.T, ns, name string) scrapeConfig {
	t.Helper()
	ctx := context.Background()
	sm := &unstructured.Unstructured{}
	sm.SetGroupVersionKind(schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"})
	if err := c.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, sm); err != nil {
		t.Fatal(err)
	}
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(endpoints) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v", endpoints)
	}
	ep := endpoints[0].(map[string]any)
	secretKey := func(path ...string) []byte {
		t.Helper()
		name, _, _ := unstructured.NestedString(ep, append(path, "name")...)
		key, _, _ := unstructured.NestedString(ep, append(path, "key")...)
		var s corev1.Secret
		if err := c.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil || len(s.Data[key]) == 0 {
			t.Fatalf("ServiceMonitor %v: Secret %s key %q: %v", path, name, key, err)
		}
		return s.Data[key]
	}
	if typ, _, _ := unstructured.NestedString(ep, "authorization", "type"); typ != "Bearer" {
		t.Fatalf("authorization type %q", typ)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(secretKey("tlsConfig", "ca", "secret")) {
		t.Fatal("the ServiceMonitor's CA is not PEM")
	}
	serverName, _, _ := unstructured.NestedString(ep, "tlsConfig", "serverName")
	return scrapeConfig{token: string(secretKey("authorization", "credentials")), serverName: serverName, roots: roots}
}

// fillServiceAccountToken does the token controller's part for a
// kubernetes.io/service-account-token Secret: a token of its service account.
func (c *devCluster) fillServiceAccountToken(t *testing.T, ns, name string) {
	t.Helper()
	ctx := context.Background()
	var s corev1.Secret
	if err := c.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	sa := s.Annotations[corev1.ServiceAccountNameKey]
	tr, err := c.kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, sa, err)
	}
	s.Data = map[string][]byte{"token": []byte(tr.Status.Token)}
	if err := c.admin.Update(ctx, &s); err != nil {
		t.Fatal(err)
	}
}
