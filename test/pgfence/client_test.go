package pgfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/internal/operator"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// TestClientCommitsToTheStore is the worker's path end to end: lockclient
// acquires from the embedded control plane, the operator publishes the
// grant to the store the FencedResource names, and Operation.CommitTx
// commits segments there. Then the stale story: A's lease expires unrenewed,
// B takes over and writes; A's lock knows it expired (ErrExpired, nothing
// sent), and what a paused A would still send is refused by the database
// (STALE_OWNER). B's row stands. B's commits continue from where its lock
// stood, and are numbered again when another commit took the number.
func TestClientCommitsToTheStore(t *testing.T) {
	ctrl.SetLogger(logr.Discard())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := newStore(t, pgfence.InstallOptions{})
	s.invoices(t)
	pool := poolOf(t, server.DSN(s.name))
	cp, err := localcp.Start(ctx, localcp.Options{})
	if err != nil {
		t.Fatalf("the embedded control plane: %v", err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	op, err := cp.RunOperator(ctx, operator.Options{})
	must(t, err)
	t.Cleanup(func() { _ = op.Stop() })
	admin, err := cp.AdminClient()
	must(t, err)
	must(t, admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "billing"}}))
	must(t, admin.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "invoices-store"},
		StringData: map[string]string{"dsn": server.DSN(s.name) + " user=" + operatorRole}}))
	must(t, admin.Create(ctx, &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "invoices"},
		Spec: locksv1.FencedResourceSpec{ResourceID: resourceID, LeaseDurationSeconds: 5, Enforcement: locksv1.EnforcementEnforce,
			Stores: []locksv1.StoreReference{{Name: "main", SecretRef: locksv1.StoreSecretReference{Name: "invoices-store"}}}}}))
	clientOf := func(name string) *lockclient.Client {
		u, err := cp.AddUser("system:serviceaccount:billing:"+name, localcp.WorkersGroup)
		must(t, err)
		c, err := lockclient.NewForConfig(ctx, u.Config(), "billing")
		must(t, err)
		return c
	}
	change := func(amount string) (string, func(pgx.Tx) error) {
		payload, err := fence.PayloadDigest(map[string]any{"invoice": 1, "amount": amount})
		must(t, err)
		return payload, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO invoices VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET amount = excluded.amount", amount)
			return err
		}
	}

	// A never renews: its 5 s lease ends after its two segments.
	lockA, err := clientOf("worker-a").Acquire(ctx, "invoices", lockclient.AcquireOptions{RequestID: "a", RenewInterval: time.Hour})
	must(t, err)
	defer lockA.Orphan()
	opA := lockA.Operation("settle-a")
	for i, amount := range []string{"100", "120"} {
		payload, fn := change(amount)
		r, err := opA.CommitTx(ctx, pool, payload, fn)
		if err != nil || r.Fence != 1 || r.Segment != int64(i+1) {
			t.Fatalf("A's segment %d: %+v, %v", i+1, r, err)
		}
	}

	lockB, err := clientOf("worker-b").Acquire(ctx, "invoices", lockclient.AcquireOptions{RequestID: "b"})
	must(t, err)
	defer lockB.Orphan()
	payload, fn := change("250")
	r, err := lockB.Operation("settle-b").CommitTx(ctx, pool, payload, fn)
	if err != nil || r.Fence != 2 || r.Segment != 1 {
		t.Fatalf("B's segment: %+v, %v", r, err)
	}
	// A second process of B commits segment 2 under B's grant behind this
	// lock's back: B's next commit, numbered from where this lock stood,
	// is refused by the store, numbered again from its state, and lands as 3.
	gB, proofB := lockB.Grant()
	other, otherFn := change("260")
	if _, err := pgfence.Commit(ctx, pool, fence.Envelope{Grant: gB, Proof: proofB, Operation: "settle-b-elsewhere", Segment: 2, Payload: other}, otherFn); err != nil {
		t.Fatalf("the other commit under B's grant: %v", err)
	}
	payload, fn = change("270")
	if r, err = lockB.Operation("settle-b").CommitTx(ctx, pool, payload, fn); err != nil || r.Fence != 2 || r.Segment != 3 {
		t.Fatalf("B's segment after another took 2: %+v, %v", r, err)
	}

	payload, fn = change("999")
	if _, err := opA.CommitTx(ctx, pool, payload, fn); !errors.Is(err, lockclient.ErrExpired) {
		t.Fatalf("A after its lease ended: %v, want ErrExpired", err)
	}
	g, proof := lockA.Grant()
	_, err = pgfence.Commit(ctx, pool, fence.Envelope{Grant: g, Proof: proof, Operation: opA.ID(), Segment: 3, Payload: payload}, fn)
	if re, ok := pgfence.AsRefusal(err); !ok || re.Verdict != fence.StaleOwner {
		t.Fatalf("a paused A's segment: %v, want STALE_OWNER", err)
	}
	if got := invoiceAmount(t, s.admin, 1); got != "270" {
		t.Fatalf("invoice 1 is %q, want B's 270", got)
	}
}
