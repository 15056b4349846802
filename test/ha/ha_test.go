package ha

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/certs"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
)

var (
	cp      *localcp.ControlPlane
	workDir string
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard())
	code := func() int {
		var err error
		if workDir, err = os.MkdirTemp("", "fencekeeper-ha-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(workDir)
		if cp, err = localcp.Start(context.Background(), localcp.Options{}); err != nil {
			fmt.Fprintln(os.Stderr, "the HA test needs the embedded control plane:", err)
			return 1
		}
		defer func() { _ = cp.Stop() }()
		return m.Run()
	}()
	os.Exit(code)
}

// TestRotatorsRaceOnAnEmptySecret: replicas starting together, as the
// operator user (its RBAC), all create-if-absent the same Secret; every one
// ends up serving the one CA that won.
func TestRotatorsRaceOnAnEmptySecret(t *testing.T) {
	ctx := context.Background()
	const n = 4
	rotators := make([]*certs.Rotator, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range rotators {
		c, err := client.New(cp.Operator, client.Options{Scheme: cp.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		rotators[i] = &certs.Rotator{Client: c, Namespace: locksv1.DefaultNamespace, Name: certs.DefaultSecretName,
			Hosts: []string{"127.0.0.1", "localhost"}, Policy: certs.DefaultPolicy(time.Minute)}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			errs[i] = rotators[i].Sync(ctx)
		}(i)
	}
	close(start)
	wg.Wait()
	admin, err := cp.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	var sec corev1.Secret
	if err := admin.Get(ctx, types.NamespacedName{Namespace: locksv1.DefaultNamespace, Name: certs.DefaultSecretName}, &sec); err != nil {
		t.Fatal(err)
	}
	for i, r := range rotators {
		if errs[i] != nil {
			t.Fatalf("rotator %d: %v", i, errs[i])
		}
		if !bytes.Equal(r.CABundle(), sec.Data[certs.KeyCABundle]) {
			t.Errorf("rotator %d trusts a CA other than the Secret's", i)
		}
		cert, _ := r.GetCertificate(nil)
		if !bytes.Equal(cert.Certificate[0], pemDER(t, sec.Data[certs.KeyTLSCert])) {
			t.Errorf("rotator %d serves a certificate other than the Secret's", i)
		}
	}
	if got := bytes.Count(sec.Data[certs.KeyCABundle], []byte("BEGIN CERTIFICATE")); got != 1 {
		t.Errorf("the bundle holds %d CAs after the race, want 1", got)
	}
}

func pemDER(t *testing.T, data []byte) []byte {
	t.Helper()
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatal("no PEM block")
	}
	if _, err := x509.ParseCertificate(b.Bytes); err != nil {
		t.Fatal(err)
	}
	return b.Bytes
}

// kubeconfig writes the operator user's kubeconfig for the manager processes.
func kubeconfig(t *testing.T) string {
	t.Helper()
	user, err := cp.AddUser(locksv1.OperatorUsername(locksv1.DefaultNamespace))
	if err != nil {
		t.Fatal(err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(workDir, "operator.kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func createFencedResources(ctx context.Context, t *testing.T, admin client.Client, ns string, names []string) {
	t.Helper()
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		fr := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: locksv1.FencedResourceSpec{
			ResourceID: ns + "/" + name, LeaseDurationSeconds: 30, Enforcement: locksv1.EnforcementEnforce,
			Target: &locksv1.ObjectTarget{APIVersion: "v1", Kind: "ConfigMap", Name: name},
		}}
		if err := admin.Create(ctx, fr); err != nil {
			t.Fatal(err)
		}
	}
}
