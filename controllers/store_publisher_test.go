package controllers

import (
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func TestDecideEnds(t *testing.T) {
	uids := map[string]string{"d1": "uid-1", "d2": "uid-2", "d3": ""}
	ended := []locksv1.EndedGrant{{GrantUID: "uid-1", Phase: locksv1.PhaseExpired, Reason: locksv1.ReasonExpired}}
	cases := map[string]struct {
		open   []string
		holder string
		want   []storeEnd
	}{
		"nothing open":          {nil, "d2", nil},
		"only the holder":       {[]string{"d2"}, "d2", nil},
		"the old holder ends":   {[]string{"d1", "d2"}, "d2", []storeEnd{{"d1", locksv1.ReasonExpired}}},
		"nothing held":          {[]string{"d1"}, "", []storeEnd{{"d1", locksv1.ReasonExpired}}},
		"why is not recorded":   {[]string{"d2"}, "", []storeEnd{{"d2", endReasonUnknown}}},
		"not published by us":   {[]string{"dx"}, "d2", []storeEnd{{"dx", endReasonUnknown}}},
		"a LockGrant UID empty": {[]string{"d3"}, "", []storeEnd{{"d3", endReasonUnknown}}},
	}
	for name, c := range cases {
		if got := decideEnds(c.open, c.holder, uids, ended); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %v, want %v", name, got, c.want)
		}
	}
}

func TestDecideStoreStatuses(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 7, 19, 10, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	held := func(fence int64, digest string) storeOutcome {
		return storeOutcome{name: "db", ok: true, fence: fence, digest: digest}
	}

	// A first success: written, no Event (nothing went wrong).
	next, evs, changed := decideStoreStatuses(nil, []storeOutcome{held(1, "d1")}, t0)
	if !changed || len(evs) != 0 || next[0].Reason != locksv1.ReasonStorePublished || next[0].PublishedFence != 1 ||
		next[0].PublishedDigest != "d1" || !next[0].LastPublishTime.Equal(&t0) {
		t.Fatalf("first success: %+v %+v %v", next, evs, changed)
	}
	// The same holder again (a renewal): nothing to write.
	if _, evs, changed := decideStoreStatuses(next, []storeOutcome{held(1, "d1")}, t1); changed || len(evs) != 0 {
		t.Fatalf("renewal: %+v %v", evs, changed)
	}
	// A new holder: written, the publish time moves, no Event.
	handoff, evs, changed := decideStoreStatuses(next, []storeOutcome{held(2, "d2")}, t1)
	if !changed || len(evs) != 0 || handoff[0].PublishedFence != 2 || !handoff[0].LastPublishTime.Equal(&t1) {
		t.Fatalf("handoff: %+v %+v %v", handoff, evs, changed)
	}
	// Nothing held: published as nothing.
	if free, _, changed := decideStoreStatuses(handoff, []storeOutcome{held(0, "")}, t1); !changed || free[0].PublishedDigest != "" {
		t.Fatalf("released: %+v %v", free, changed)
	}
	// A store removed from the spec leaves the status.
	if next, _, changed := decideStoreStatuses(handoff, nil, t1); !changed || len(next) != 0 {
		t.Fatalf("removed: %+v %v", next, changed)
	}
}

func TestDecideStoreStatusesFailures(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 7, 19, 10, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	held := func(fence int64, digest string) storeOutcome {
		return storeOutcome{name: "db", ok: true, fence: fence, digest: digest}
	}
	down := storeOutcome{name: "db", reason: locksv1.ReasonStoreUnreachable, message: "cannot reach the store (dial 1)"}
	next, _, _ := decideStoreStatuses(nil, []storeOutcome{held(1, "d1")}, t0)

	// Down: one Warning; what the store last took is kept.
	failing, evs, changed := decideStoreStatuses(next, []storeOutcome{down}, t1)
	if !changed || len(evs) != 1 || !evs[0].warning || evs[0].reason != locksv1.EventReasonStorePublishFailed ||
		failing[0].Reason != locksv1.ReasonStoreUnreachable || failing[0].PublishedDigest != "d1" || !failing[0].LastPublishTime.Equal(&t0) {
		t.Fatalf("down: %+v %+v %v", failing, evs, changed)
	}
	// Still down, another message: no write, no Event.
	again := down
	again.message = "cannot reach the store (dial 2)"
	if _, evs, changed := decideStoreStatuses(failing, []storeOutcome{again}, t1); changed || len(evs) != 0 {
		t.Fatalf("still down: %+v %v", evs, changed)
	}
	// Failing for another reason: written, one more Warning.
	schema := storeOutcome{name: "db", reason: locksv1.ReasonStoreSchemaNotInstalled, message: "run kubectl fence pg install"}
	if _, evs, changed := decideStoreStatuses(failing, []storeOutcome{schema}, t1); !changed || len(evs) != 1 || !evs[0].warning {
		t.Fatalf("another reason: %+v %v", evs, changed)
	}
	// Back: one StoreRecovered, the new holder published.
	back, evs, changed := decideStoreStatuses(failing, []storeOutcome{held(2, "d2")}, t1)
	if !changed || len(evs) != 1 || evs[0].warning || evs[0].reason != locksv1.EventReasonStoreRecovered || back[0].PublishedFence != 2 {
		t.Fatalf("recovered: %+v %+v %v", back, evs, changed)
	}
}

func TestStoresCondition(t *testing.T) {
	ok := locksv1.StoreStatus{Name: "a", Reason: locksv1.ReasonStorePublished}
	down := locksv1.StoreStatus{Name: "b", Reason: locksv1.ReasonStoreUnreachable, Message: "cannot reach"}
	schema := locksv1.StoreStatus{Name: "c", Reason: locksv1.ReasonStoreSchemaNotInstalled, Message: "run kubectl fence pg install"}
	if c := storesCondition([]locksv1.StoreStatus{ok}, 3); c.Status != metav1.ConditionTrue || c.Reason != locksv1.ReasonStorePublished || c.ObservedGeneration != 3 {
		t.Fatalf("all published: %+v", c)
	}
	c := storesCondition([]locksv1.StoreStatus{ok, down, schema}, 3)
	if c.Status != metav1.ConditionFalse || c.Reason != locksv1.ReasonStoreUnreachable || c.Message != "2 of 3 stores fail; store b: cannot reach" {
		t.Fatalf("failing: %+v", c)
	}
	conds := []metav1.Condition{c}
	if conditionChanged(conds, c) || !conditionChanged(conds, storesCondition([]locksv1.StoreStatus{ok}, 3)) {
		t.Fatal("conditionChanged")
	}
}

func TestStorePoolsShareCloseAndReplace(t *testing.T) {
	var p storePools
	fr1, fr2 := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	k := poolKey{namespace: "ns", secret: "db", key: "dsn"}
	dsn := "host=/nonexistent port=1 user=op dbname=x"
	p1, err := p.get(storeKey{fr1, "db"}, k, "1", dsn)
	if err != nil {
		t.Fatal(err)
	}
	p2, _ := p.get(storeKey{fr2, "db"}, k, "1", dsn)
	if p1 != p2 || p.open() != 1 {
		t.Fatalf("one Secret, one pool: %p %p, %d open", p1, p2, p.open())
	}
	// The Secret changed: a new pool replaces the old one for both.
	p3, _ := p.get(storeKey{fr1, "db"}, k, "2", dsn)
	if p3 == p1 || p.open() != 1 {
		t.Fatalf("new resourceVersion: %d open", p.open())
	}
	p.forget(fr1, func(string) bool { return false })
	if p.open() != 1 {
		t.Fatal("closed while fr2 uses it")
	}
	p.forget(fr2, func(string) bool { return false })
	if p.open() != 0 {
		t.Fatal("still open with no user")
	}
	if _, err := p.get(storeKey{fr1, "db"}, k, "3", "host=h port=notaport"); err == nil || err.Error() != "the DSN does not parse" {
		t.Fatalf("a bad DSN: %v", err)
	}
}

// TestPublicationChanged: the publisher follows what the stores are
// published, not its own status write.
func TestPublicationChanged(t *testing.T) {
	base := func() *locksv1.FencedResource {
		return &locksv1.FencedResource{
			ObjectMeta: metav1.ObjectMeta{Generation: 1},
			Spec:       locksv1.FencedResourceSpec{ResourceID: "r", Stores: []locksv1.StoreReference{{Name: "db"}}},
			Status:     locksv1.FencedResourceStatus{Holder: &locksv1.Holder{GrantUID: "u1", Owner: "a"}},
		}
	}
	cases := map[string]struct {
		change func(*locksv1.FencedResource)
		want   bool
	}{
		"its own status.stores write": {func(fr *locksv1.FencedResource) {
			fr.Status.Stores = []locksv1.StoreStatus{{Name: "db", PublishedFence: 1}}
		}, false},
		"a new holder": {func(fr *locksv1.FencedResource) { fr.Status.Holder = &locksv1.Holder{GrantUID: "u2", Owner: "b"} }, true},
		"a renewal":    {func(fr *locksv1.FencedResource) { fr.Status.Holder.ExpiresAt = metav1.NowMicro() }, true},
		"nothing held": {func(fr *locksv1.FencedResource) { fr.Status.Holder = nil }, true},
		"an ended grant": {func(fr *locksv1.FencedResource) {
			fr.Status.RecentlyEnded = []locksv1.EndedGrant{{GrantUID: "u1"}}
		}, true},
		"the policy":        {func(fr *locksv1.FencedResource) { fr.Generation = 2 }, true},
		"the stores listed": {func(fr *locksv1.FencedResource) { fr.Spec.Stores = nil }, true},
	}
	for name, c := range cases {
		n := base()
		c.change(n)
		if got := publicationChanged(base(), n); got != c.want {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
	}
	noStores := base()
	noStores.Spec.Stores = nil
	other := noStores.DeepCopy()
	other.Status.Holder = nil
	if publicationChanged(noStores, other) {
		t.Error("a resource without stores is not the publisher's")
	}
}
