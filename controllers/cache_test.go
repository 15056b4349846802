package controllers

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// tenantMeta is metadata as a tenant may write it, with managedFields.
func tenantMeta(annotations map[string]string) metav1.ObjectMeta {
	now := metav1.Now()
	return metav1.ObjectMeta{
		Namespace: "team", Name: "batch-r", UID: "u-1", ResourceVersion: "42", Generation: 3, DeletionTimestamp: &now,
		Labels:          map[string]string{"team": strings.Repeat("a", 63)},
		Annotations:     annotations,
		Finalizers:      []string{locksv1.GrantFinalizer, "example.com/hold"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "u-2"}},
		ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl", FieldsV1: metav1.NewFieldsV1(strings.Repeat("{}", 1000))}},
	}
}

func TestBoundLockGrant(t *testing.T) {
	record := grantWithRecord("", locksv1.UnresolvedMutation{Object: "ConfigMap/x", Operation: "op", Fence: 1, Segment: 1,
		Payload: testPayload, Since: time.Now()}).Annotations[locksv1.AnnotationUnresolvedMutation]
	atBound := strings.Repeat(" ", locksv1.MaxUnresolvedMutationBytes)
	over := strings.Repeat(" ", locksv1.MaxUnresolvedMutationBytes+1)
	for name, c := range map[string]struct {
		annotations map[string]string
		want        map[string]string
	}{
		"no annotations":  {nil, nil},
		"tenant's only":   {map[string]string{"example.com/blob": strings.Repeat("x", 200<<10)}, nil},
		"a record":        {map[string]string{locksv1.AnnotationUnresolvedMutation: record, "example.com/blob": "x"}, map[string]string{locksv1.AnnotationUnresolvedMutation: record}},
		"at the bound":    {map[string]string{locksv1.AnnotationUnresolvedMutation: atBound}, map[string]string{locksv1.AnnotationUnresolvedMutation: atBound}},
		"over the bound":  {map[string]string{locksv1.AnnotationUnresolvedMutation: over}, map[string]string{locksv1.AnnotationUnresolvedMutation: "<record over 4096 bytes: 4097 bytes>"}},
		"garbage is kept": {map[string]string{locksv1.AnnotationUnresolvedMutation: "x"}, map[string]string{locksv1.AnnotationUnresolvedMutation: "x"}},
	} {
		in := &locksv1.LockGrant{ObjectMeta: tenantMeta(c.annotations),
			Spec:   locksv1.LockGrantSpec{Resource: "batch", Owner: "worker-a", RequestID: "r", Renewals: 2},
			Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld}}
		want := in.DeepCopy()
		want.Annotations, want.Labels, want.OwnerReferences, want.ManagedFields = c.want, nil, nil, nil
		out, err := boundLockGrant(in)
		if err != nil || !reflect.DeepEqual(out, want) {
			t.Errorf("%s: got %+v, %v\nwant %+v", name, out, err, want)
		}
		// A cached object may be transformed again (a relist): nothing changes.
		if again, _ := boundLockGrant(want.DeepCopy()); !reflect.DeepEqual(again, want) {
			t.Errorf("%s: transforming the bounded form changed it: %+v", name, again)
		}
	}
}

func TestReadRecordReportsTheOversizedMarker(t *testing.T) {
	_, err := readRecord(oversizedRecord(300 << 10))
	if !errors.Is(err, locksv1.ErrBadUnresolvedMutation) || !strings.Contains(err.Error(), "record over 4096 bytes: 307200 bytes, not kept in the operator's cache") {
		t.Errorf("readRecord(marker) = %v", err)
	}
	lg := grantWithRecord("g", oversizedRecord(5000))
	if recordsUnresolvedMutation(&lg) || !carriesRecord(&lg) {
		t.Error("an oversized record must be reported (indexed) and must not keep its LockGrant")
	}
}

func TestBoundFencedResource(t *testing.T) {
	in := &locksv1.FencedResource{ObjectMeta: tenantMeta(map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 100<<10)}),
		Spec:   locksv1.FencedResourceSpec{ResourceID: "r", LeaseDurationSeconds: 30, AllowedOwners: []string{"worker-a"}},
		Status: locksv1.FencedResourceStatus{FenceToken: 7}}
	want := in.DeepCopy()
	want.Annotations, want.Labels, want.OwnerReferences, want.ManagedFields, want.Finalizers = nil, nil, nil, nil, nil
	if out, err := boundFencedResource(in); err != nil || !reflect.DeepEqual(out, want) {
		t.Errorf("got %+v, %v\nwant %+v", out, err, want)
	}
}

func TestBoundNamespace(t *testing.T) {
	for name, c := range map[string]struct{ labels, want map[string]string }{
		"enrolled":     {map[string]string{locksv1.LabelEnrolledNamespace: "true", "team": "a"}, map[string]string{locksv1.LabelEnrolledNamespace: "true"}},
		"not enrolled": {map[string]string{"team": "a"}, nil},
		"label false":  {map[string]string{locksv1.LabelEnrolledNamespace: "false"}, map[string]string{locksv1.LabelEnrolledNamespace: "false"}},
	} {
		meta := tenantMeta(map[string]string{"a": "b"})
		meta.Labels = c.labels
		in := &corev1.Namespace{ObjectMeta: meta, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceTerminating}}
		want := in.DeepCopy()
		want.Annotations, want.Labels, want.OwnerReferences, want.ManagedFields = nil, c.want, nil, nil
		if out, err := boundNamespace(in); err != nil || !reflect.DeepEqual(out, want) {
			t.Errorf("%s: got %+v, %v\nwant %+v", name, out, err, want)
		}
	}
}

func TestTransformsPassOtherTypes(t *testing.T) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"a": "b"}}}
	for name, f := range map[string]func(any) (any, error){"LockGrant": boundLockGrant, "FencedResource": boundFencedResource, "Namespace": boundNamespace} {
		if out, err := f(cm); err != nil || out != any(cm) || cm.Labels["a"] != "b" {
			t.Errorf("%s transform changed a ConfigMap: %+v, %v", name, out, err)
		}
	}
}

func TestCacheOptionsBoundEveryTenantKind(t *testing.T) {
	o := CacheOptions("ops", nil)
	bounded := map[string]bool{}
	for obj, by := range o.ByObject {
		switch obj.(type) {
		case *corev1.ConfigMap:
			if _, ok := by.Namespaces["ops"]; !ok || len(by.Namespaces) != 1 {
				t.Errorf("ConfigMaps cached in %v, want only the operator's namespace", by.Namespaces)
			}
		default:
			bounded[reflect.TypeOf(obj).Elem().Name()] = by.Transform != nil
		}
	}
	if want := map[string]bool{"LockGrant": true, "FencedResource": true, "Namespace": true}; !reflect.DeepEqual(bounded, want) {
		t.Errorf("transforms %v, want %v", bounded, want)
	}
	if o.DefaultTransform == nil {
		t.Error("no default transform: managedFields of every other kind would be cached")
	}
}
