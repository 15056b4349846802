// Package examples runs pkg/lockclient's examples, exactly as written there,
// against the embedded control plane with the operator: the public library's
// own tests never start a server, and its examples are still proven to work.
package examples

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/internal/operator"
	"github.com/fencekeeper/fencekeeper/internal/pgserver"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

func TestLockclientExamples(t *testing.T) {
	ctrl.SetLogger(logr.Discard())
	ctx := context.Background()
	cp, err := localcp.Start(ctx, localcp.Options{})
	if err != nil {
		t.Fatalf("the examples need the embedded control plane: %v", err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	op, err := cp.RunOperator(ctx, operator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = op.Stop() })
	kubeconfig := setUp(ctx, t, cp)
	storeDSN := setUpStore(ctx, t, cp)

	root, err := localcp.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-v", "-run", "^Example", "./pkg/lockclient")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "FENCEKEEPER_EXAMPLES_KUBECONFIG="+kubeconfig, "FENCEKEEPER_EXAMPLES_STORE_DSN="+storeDSN)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("the examples failed: %v", err)
	}
	// Every example ran and passed (a skipped or filtered one would not print PASS).
	passed := regexp.MustCompile(`(?m)^--- PASS: Example`).FindAll(out, -1)
	if want := 5; len(passed) != want {
		t.Fatalf("%d examples passed, want %d", len(passed), want)
	}
}

// setUp creates what the examples claim (namespace billing, its
// FencedResources) and a worker, and returns the worker's kubeconfig.
func setUp(ctx context.Context, t *testing.T, cp *localcp.ControlPlane) string {
	admin, err := cp.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "billing"}}); err != nil {
		t.Fatal(err)
	}
	for name, lease := range map[string]int32{"invoice-batch": 30, "report": 30, "short-lease": 1, "retired": 30} {
		fr := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: name}, Spec: locksv1.FencedResourceSpec{
			ResourceID: "billing/" + name, LeaseDurationSeconds: lease, Enforcement: locksv1.EnforcementEnforce,
			Target: &locksv1.ObjectTarget{APIVersion: "v1", Kind: "ConfigMap", Name: name},
		}}
		if err := admin.Create(ctx, fr); err != nil {
			t.Fatal(err)
		}
	}
	worker, err := cp.AddUser("system:serviceaccount:billing:worker-7", localcp.WorkersGroup)
	if err != nil {
		t.Fatal(err)
	}
	data, err := worker.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "worker.kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// setUpStore starts the PostgreSQL database ExampleOperation_CommitTx
// writes (the fencekeeper schema, a protected table ledger, an operator and
// a worker role), names it as the store of FencedResource "ledger" for the
// operator to publish to, and returns the worker's DSN.
func setUpStore(ctx context.Context, t *testing.T, cp *localcp.ControlPlane) string {
	start, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	srv, err := pgserver.Start(start, pgserver.Options{Fast: true})
	if err != nil {
		t.Fatalf("the store example needs PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	if err := srv.Exec(ctx, "postgres", "CREATE ROLE fk_operator LOGIN; CREATE ROLE fk_worker LOGIN"); err != nil {
		t.Fatal(err)
	}
	if err := srv.CreateDatabase(ctx, "ledger"); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, srv.DSN("ledger"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if err := pgfence.Install(ctx, conn, pgfence.InstallOptions{OperatorRole: "fk_operator", WorkerRoles: []string{"fk_worker"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE ledger (id int PRIMARY KEY, amount text NOT NULL); GRANT SELECT, INSERT, UPDATE ON ledger TO fk_worker"); err != nil {
		t.Fatal(err)
	}
	if err := pgfence.Protect(ctx, conn, "ledger", "billing/ledger"); err != nil {
		t.Fatal(err)
	}
	admin, err := cp.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "ledger-store"},
		StringData: map[string]string{"dsn": srv.DSN("ledger") + " user=fk_operator"}}
	fr := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "ledger"}, Spec: locksv1.FencedResourceSpec{
		ResourceID: "billing/ledger", LeaseDurationSeconds: 30, Enforcement: locksv1.EnforcementEnforce,
		Stores: []locksv1.StoreReference{{Name: "ledger", SecretRef: locksv1.StoreSecretReference{Name: "ledger-store"}}},
	}}
	for _, o := range []client.Object{secret, fr} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	return srv.DSN("ledger") + " user=fk_worker"
}
