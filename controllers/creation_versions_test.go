package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// TestCreationVersionsKeepTheFirstVersion: the transform keeps the version a
// LockGrant had when first received (a later change does not move it), still
// bounds the object, forgets it once ended or deleted, and keeps nothing it
// cannot compare.
func TestCreationVersionsKeepTheFirstVersion(t *testing.T) {
	v := NewCreationVersions()
	lg := func(uid, rv string, phase locksv1.LockGrantPhase) *locksv1.LockGrant {
		return &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), ResourceVersion: rv,
			Labels: map[string]string{"tenant": "x"}}, Status: locksv1.LockGrantStatus{Phase: phase}}
	}
	out, err := v.transform(lg("a", "120", ""))
	if err != nil || out.(*locksv1.LockGrant).Labels != nil {
		t.Fatalf("transform: %+v, %v; want the LockGrant bounded (no labels)", out, err)
	}
	for _, in := range []*locksv1.LockGrant{lg("a", "130", locksv1.PhasePending), lg("b", "125", ""), lg("c", "not-a-number", ""), lg("d", "90", locksv1.PhaseDenied)} {
		if _, err := v.transform(in); err != nil {
			t.Fatal(err)
		}
	}
	want := map[types.UID]struct {
		rv uint64
		ok bool
	}{"a": {120, true}, "b": {125, true}, "c": {0, false}, "d": {0, false}, "never": {0, false}}
	for uid, w := range want {
		if rv, ok := v.Of(uid); rv != w.rv || ok != w.ok {
			t.Errorf("Of(%s) = %d, %t; want %d, %t", uid, rv, ok, w.rv, w.ok)
		}
	}
	if _, err := v.transform(lg("a", "140", locksv1.PhaseReleased)); err != nil {
		t.Fatal(err)
	}
	v.forget("b")
	if n := v.len(); n != 0 {
		t.Errorf("%d versions kept after the LockGrants ended or were deleted, want 0", n)
	}
	var none *CreationVersions
	if _, ok := none.Of("a"); ok {
		t.Error("a nil memory knows a version")
	}
	if out, err := none.transform(lg("a", "1", "")); err != nil || out.(*locksv1.LockGrant).Labels != nil {
		t.Errorf("a nil memory's transform: %+v, %v; want the LockGrant bounded", out, err)
	}
}
