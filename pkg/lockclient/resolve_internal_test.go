package lockclient

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

func TestResolveFromLog(t *testing.T) {
	rc := func(f, seg int64, payload string) fence.Receipt {
		return fence.Receipt{Fence: f, Segment: seg, Operation: "op", Payload: payload, Receipt: "sha256:r"}
	}
	log := []fence.Receipt{rc(3, 4, "p4"), rc(3, 5, "p5"), rc(4, 1, "q1")}
	st := fence.State{HighestFence: 4, LastSegment: 1, Receipts: log}
	for _, c := range []struct {
		name string
		st   fence.State
		want fence.Receipt
		out  Resolution
	}{
		{"in the log", st, rc(3, 5, "p5"), Applied},
		{"in the log with another payload", st, rc(3, 5, "other"), AppliedOtherPayload},
		{"a later segment of the current fence", st, rc(4, 2, "q2"), ProvenAbsent},
		{"a newer fence", st, rc(5, 1, "x"), ProvenAbsent},
		{"inside the log's reach but missing", st, rc(3, 6, "p6"), ProvenAbsent},
		{"older than the log reaches", st, rc(3, 2, "p2"), Undeterminable},
		{"at the log's oldest entry, another operation", st, fence.Receipt{Fence: 3, Segment: 4, Operation: "other", Payload: "p4"}, Undeterminable},
		{"no log at all", fence.State{HighestFence: 2, LastSegment: 3}, rc(2, 3, "p"), Undeterminable},
	} {
		if got, _ := resolveFromLog(c.st, c.want); got != c.out {
			t.Errorf("%s: got %d, want %d", c.name, got, c.out)
		}
	}
}

func TestResolveDeleted(t *testing.T) {
	want := fence.Receipt{Fence: 4, Segment: 2, Operation: "op", Payload: "p"}
	del := func(f, seg int64, digest string) *locksv1.DeletedTarget {
		return &locksv1.DeletedTarget{FenceToken: f, Segment: seg, GrantDigest: digest}
	}
	for _, c := range []struct {
		name    string
		deleted *locksv1.DeletedTarget
		out     Resolution
	}{
		{"never deleted: the write would have created it", nil, ProvenAbsent},
		{"deleted by an older fence", del(3, 7, "sha256:old"), ProvenAbsent},
		{"deleted by this grant after the segment", del(4, 3, "sha256:mine"), Applied},
		{"deleted by this grant with the segment itself", del(4, 2, "sha256:mine"), Applied},
		{"deleted by this grant before the segment", del(4, 1, "sha256:mine"), ProvenAbsent},
		// The object outlived this grant; its receipts are gone with it.
		{"deleted by a newer fence", del(5, 1, "sha256:new"), Undeterminable},
		{"same fence, another grant (a registry that went backwards)", del(4, 3, "sha256:other"), Undeterminable},
	} {
		if got, _ := resolveDeleted(c.deleted, "sha256:mine", want); got != c.out {
			t.Errorf("%s: got %d, want %d", c.name, got, c.out)
		}
	}
}

// An API server just restarted serves before its authorizer has caught up:
// for a moment it answers Forbidden to the owner reading its own LockGrant
// (found by make chaos, an API server killed and restarted). The record of
// an unknown outcome outlasts that; a LockGrant that is gone stays final.
func TestRecordUnresolvedOutlastsARestartedAPIServersForbidden(t *testing.T) {
	key := types.NamespacedName{Namespace: "billing", Name: "batch-0123456789abcdef"}
	lg := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	refusals := 2
	kube := fake.NewClientBuilder().WithScheme(locksv1.Scheme).WithObjects(lg).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, k client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*locksv1.LockGrant); ok && refusals > 0 {
				refusals--
				return apierrors.NewForbidden(locksv1.GroupVersion.WithResource("lockgrants").GroupResource(), k.Name,
					errors.New(`RBAC: clusterrole.rbac.authorization.k8s.io "lockgrant-requester" not found`))
			}
			return c.Get(ctx, k, obj, opts...)
		},
	}).Build()
	op := (&Lock{c: New(kube, "billing", "worker-a"), key: key}).Operation("op")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "batch"}}
	cm.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
	want := fence.Receipt{Fence: 3, Segment: 2, Operation: "op", Payload: "sha256:" + strings.Repeat("ab", 32)}
	if err := op.recordUnresolved(context.Background(), cm, want); err != nil {
		t.Fatalf("record after two Forbidden answers: %v", err)
	}
	var got locksv1.LockGrant
	if err := kube.Get(context.Background(), key, &got); err != nil || got.Annotations[locksv1.AnnotationUnresolvedMutation] == "" {
		t.Fatalf("LockGrant after the record: %v, annotations %v", err, got.Annotations)
	}

	start := time.Now()
	gone := (&Lock{c: New(kube, "billing", "worker-a"), key: types.NamespacedName{Namespace: "billing", Name: "gone"}}).Operation("op")
	if err := gone.recordUnresolved(context.Background(), cm, want); !apierrors.IsNotFound(err) || time.Since(start) > 5*time.Second {
		t.Fatalf("record on a LockGrant that is gone: %v after %v, want NotFound at once", err, time.Since(start))
	}
}
