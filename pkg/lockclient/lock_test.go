package lockclient

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Acquire creates its LockGrant under the name derived from the resource,
// its own identity and the requestID. Meeting AlreadyExists there, it takes
// the stored LockGrant as its own only when it is exactly the request it
// would have created; anything else (a LockGrant of the same owner written
// by hand under that name with another lease) is ErrRequestIDTaken, saying
// what differs.
func TestAcquireFindsOnlyItsOwnRequestUnderItsName(t *testing.T) {
	name := locksv1.LockGrantName("batch", "worker-a", "nightly")
	byHand := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: name},
		Spec: locksv1.LockGrantSpec{Resource: "batch", Owner: "worker-a", RequestID: "nightly",
			Lease: "by-hand", OperationRoot: OperationRoot("batch/nightly")}}
	kube := fake.NewClientBuilder().WithScheme(locksv1.Scheme).WithObjects(byHand).Build()
	c := New(kube, "billing", "worker-a")
	if got := c.LockGrantName("batch", "nightly"); got != name {
		t.Fatalf("client names the request %s, want %s", got, name)
	}
	// Taken as its own, the request would wait for an issuer: bound the wait.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := c.Acquire(ctx, "batch", AcquireOptions{RequestID: "nightly"})
	if !errors.Is(err, ErrRequestIDTaken) || !strings.Contains(err.Error(), `spec.lease is "by-hand", not "lease-nightly"`) ||
		!strings.Contains(err.Error(), name) {
		t.Fatalf("Acquire over another request under its name: %v, want ErrRequestIDTaken naming %s and the lease", err, name)
	}
}

func TestSpecDiff(t *testing.T) {
	a := locksv1.LockGrantSpec{Resource: "batch", Owner: "worker-a", RequestID: "r", Lease: "l", OperationRoot: "sha256:0", OperationCategory: "settle"}
	if d := specDiff(a, a); d != "" {
		t.Fatalf("same spec: %s", d)
	}
	b := a
	b.OperationRoot, b.OperationCategory = "sha256:1", ""
	b.Renewals, b.Release = 3, true // not part of the request
	if d, want := specDiff(b, a), `spec.operationRoot is "sha256:1", not "sha256:0", spec.operationCategory is "", not "settle"`; d != want {
		t.Fatalf("specDiff = %s, want %s", d, want)
	}
}
