package controllers

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

var lockGrants = schema.GroupResource{Group: locksv1.GroupVersion.Group, Resource: "lockgrants"}

// fakeGrants stands for the manager's cache (Get) and the API server
// (Delete, with its preconditions) at once: a LockGrant deleted is gone from
// both. It counts the reads.
type fakeGrants struct {
	client.Client // nil: only Get and Delete are used
	objs          map[client.ObjectKey]*locksv1.LockGrant
	gets          int
	// refuse fails the next delete of a name with its error.
	refuse  map[string]error
	deleted []string
}

func (f *fakeGrants) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	f.gets++
	lg, ok := f.objs[key]
	if !ok {
		return apierrors.NewNotFound(lockGrants, key.Name)
	}
	*obj.(*locksv1.LockGrant) = *lg
	return nil
}

func (f *fakeGrants) Delete(_ context.Context, obj client.Object, opts ...client.DeleteOption) error {
	key := client.ObjectKeyFromObject(obj)
	if err := f.refuse[key.Name]; err != nil {
		delete(f.refuse, key.Name)
		return err
	}
	lg, ok := f.objs[key]
	if !ok {
		return apierrors.NewNotFound(lockGrants, key.Name)
	}
	o := (&client.DeleteOptions{}).ApplyOptions(opts)
	if p := o.Preconditions; p == nil || p.UID == nil || *p.UID != lg.UID || p.ResourceVersion == nil || *p.ResourceVersion != lg.ResourceVersion {
		return apierrors.NewConflict(lockGrants, key.Name, fmt.Errorf("preconditions %+v not met", p))
	}
	delete(f.objs, key)
	f.deleted = append(f.deleted, key.Name)
	return nil
}

// collectorTest is a collector whose informer events the test delivers.
type collectorTest struct {
	t       *testing.T
	c       *EndedGrantCollector
	clock   *clocktesting.FakeClock
	cache   *fakeGrants
	handler toolscache.ResourceEventHandler
}

func newCollectorTest(t *testing.T, retention time.Duration, maxCount int) *collectorTest {
	clk := clocktesting.NewFakeClock(time.Unix(5000, 0))
	cache := &fakeGrants{objs: map[client.ObjectKey]*locksv1.LockGrant{}, refuse: map[string]error{}}
	c := &EndedGrantCollector{Client: cache, Clock: clk, Retention: retention, MaxCount: maxCount}
	return &collectorTest{t: t, c: c, clock: clk, cache: cache, handler: c.handler()}
}

// ended is a LockGrant in phase, at resourceVersion "1".
func ended(name string, phase locksv1.LockGrantPhase) *locksv1.LockGrant {
	lg := waiting(name, 0)
	lg.Status.Phase = phase
	lg.ResourceVersion = "1"
	return &lg
}

// set stores lg in the cache and delivers the event, as an informer does.
func (ct *collectorTest) set(lg *locksv1.LockGrant) {
	key := client.ObjectKeyFromObject(lg)
	old, ok := ct.cache.objs[key]
	ct.cache.objs[key] = lg
	if ok {
		ct.handler.OnUpdate(old, lg)
	} else {
		ct.handler.OnAdd(lg, false)
	}
}

// remove deletes lg from the cache and delivers the event (a tombstone when
// the watch missed it).
func (ct *collectorTest) remove(lg *locksv1.LockGrant, tombstone bool) {
	delete(ct.cache.objs, client.ObjectKeyFromObject(lg))
	if tombstone {
		ct.handler.OnDelete(toolscache.DeletedFinalStateUnknown{Key: lg.Namespace + "/" + lg.Name, Obj: lg})
		return
	}
	ct.handler.OnDelete(lg)
}

// due names the entries due now.
func (ct *collectorTest) due() []string {
	var names []string
	for _, e := range ct.c.index.due(ct.clock.Now(), ct.c.Retention, ct.c.MaxCount) {
		names = append(names, e.key.Name)
	}
	return names
}

// collect runs a pass and returns the names it deleted.
func (ct *collectorTest) collect() []string {
	ct.t.Helper()
	ct.cache.deleted = nil
	if err := ct.c.collect(context.Background()); err != nil {
		ct.t.Fatalf("pass: %v", err)
	}
	return ct.cache.deleted
}

func TestCollectorTracksOnlyCollectable(t *testing.T) {
	ct := newCollectorTest(t, time.Minute, -1)
	unresolved := ended("unresolved", locksv1.PhaseReleased)
	unresolved.Annotations = grantWithRecord("", locksv1.UnresolvedMutation{Object: "ConfigMap/x", Operation: "op", Fence: 1, Segment: 1,
		Payload: testPayload, Since: ct.clock.Now()}).Annotations
	// A value that is no record (planted by break-glass, or stored before
	// records were checked) records no write: it keeps nothing.
	garbage := ended("garbage", locksv1.PhaseRevoked)
	garbage.Annotations = map[string]string{locksv1.AnnotationUnresolvedMutation: `{"object":"ConfigMap/x"}`}
	deleting := ended("deleting", locksv1.PhaseDenied)
	deleting.DeletionTimestamp = &metav1.Time{Time: ct.clock.Now()}
	for _, lg := range []*locksv1.LockGrant{ended("released", locksv1.PhaseReleased), ended("expired", locksv1.PhaseExpired),
		ended("held", locksv1.PhaseHeld), ended("pending", ""), unresolved, garbage, deleting} {
		ct.set(lg)
	}
	if n := ct.c.index.tracked(); n != 3 {
		t.Fatalf("tracked %d LockGrants; want the released, expired and garbage ones", n)
	}
	ct.clock.Step(time.Minute)
	if got := ct.collect(); !slices.Equal(got, []string{"released", "expired", "garbage"}) {
		t.Fatalf("collected %v; want [released expired garbage]", got)
	}
	if n := ct.c.index.tracked(); n != 0 {
		t.Fatalf("still tracking %d after collecting them", n)
	}
}

func TestCollectorDueByTimeInFirstSeenOrder(t *testing.T) {
	ct := newCollectorTest(t, time.Minute, -1)
	ct.set(ended("b", locksv1.PhaseReleased))
	ct.clock.Step(10 * time.Second)
	ct.set(ended("a", locksv1.PhaseExpired))
	ct.clock.Step(10 * time.Second)
	ct.set(ended("c", locksv1.PhaseRevoked))
	// Seen again (any update, a resync): still counted from the first sighting.
	ct.set(ended("b", locksv1.PhaseReleased))

	ct.clock.Step(39 * time.Second) // b ended 59s ago
	if got := ct.due(); len(got) != 0 {
		t.Fatalf("due before the retention: %v", got)
	}
	ct.clock.Step(time.Second)
	if got := ct.due(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("at b's retention: due %v; want [b]", got)
	}
	ct.clock.Step(time.Hour)
	if got := ct.collect(); !slices.Equal(got, []string{"b", "a", "c"}) {
		t.Fatalf("collected %v; want the order first seen, [b a c]", got)
	}

	// A clock set back is read as standing still: the order holds.
	ct.set(ended("d", locksv1.PhaseReleased))
	ct.clock.SetTime(ct.clock.Now().Add(-time.Hour))
	ct.set(ended("e", locksv1.PhaseReleased))
	ct.clock.Step(2 * time.Hour)
	if got := ct.due(); !slices.Equal(got, []string{"d", "e"}) {
		t.Fatalf("due %v; want [d e]", got)
	}
}

func TestCollectorDueByCountOldestFirst(t *testing.T) {
	ct := newCollectorTest(t, time.Hour, 2)
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		ct.set(ended(name, locksv1.PhaseReleased))
		ct.clock.Step(time.Second)
	}
	// Held ones and unresolved records neither count nor are collected.
	ct.set(ended("held", locksv1.PhaseHeld))
	if got := ct.collect(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("collected %v; want the three oldest beyond the count, [a b c]", got)
	}
	if got := ct.collect(); len(got) != 0 {
		t.Fatalf("collected %v within the count and the retention", got)
	}
	// One more: the oldest goes.
	ct.set(ended("f", locksv1.PhaseReleased))
	if got := ct.collect(); !slices.Equal(got, []string{"d"}) {
		t.Fatalf("collected %v; want [d]", got)
	}
	// By time as well: e and f have been tracked for the hour.
	ct.clock.Step(time.Hour)
	if got := ct.collect(); !slices.Equal(got, []string{"e", "f"}) {
		t.Fatalf("collected %v; want [e f]", got)
	}
	if _, ok := ct.cache.objs[client.ObjectKey{Namespace: "ns", Name: "held"}]; !ok {
		t.Fatal("a held LockGrant was collected")
	}
}

func TestCollectorForgets(t *testing.T) {
	ct := newCollectorTest(t, time.Minute, -1)
	gone, tombstoned, annotated := ended("gone", locksv1.PhaseReleased), ended("tombstoned", locksv1.PhaseReleased),
		ended("annotated", locksv1.PhaseReleased)
	for _, lg := range []*locksv1.LockGrant{gone, tombstoned, annotated, ended("kept", locksv1.PhaseReleased)} {
		ct.set(lg)
	}
	// Deleted by someone else, seen as deleted or only through a tombstone.
	ct.remove(gone, false)
	ct.remove(tombstoned, true)
	// An unresolved write recorded after it ended.
	recorded := annotated.DeepCopy()
	recorded.ResourceVersion = "2"
	recorded.Annotations = grantWithRecord("", locksv1.UnresolvedMutation{Object: "ConfigMap/x", Operation: "op", Fence: 1, Segment: 1,
		Payload: testPayload, Since: ct.clock.Now()}).Annotations
	ct.set(recorded)
	if n := ct.c.index.tracked(); n != 1 {
		t.Fatalf("tracking %d; want only the one kept", n)
	}
	ct.clock.Step(time.Minute)
	if got := ct.collect(); !slices.Equal(got, []string{"kept"}) {
		t.Fatalf("collected %v; want [kept]", got)
	}

	// Resolved: it counts from then, not from when it first ended.
	resolved := recorded.DeepCopy()
	resolved.ResourceVersion, resolved.Annotations = "3", nil
	ct.set(resolved)
	ct.clock.Step(time.Minute - time.Second)
	if got := ct.collect(); len(got) != 0 {
		t.Fatalf("collected %v before the retention counted from the resolution", got)
	}
	ct.clock.Step(time.Second)
	if got := ct.collect(); !slices.Equal(got, []string{"annotated"}) {
		t.Fatalf("collected %v; want [annotated] once the retention passed", got)
	}
}

// The pass re-reads each due LockGrant from the cache: what changed since the
// index saw it (the event not handled yet) is judged as it is now.
func TestCollectorRereadsBeforeDeleting(t *testing.T) {
	ct := newCollectorTest(t, time.Minute, -1)
	renamed, recorded, vanished := ended("namesake", locksv1.PhaseReleased), ended("recorded", locksv1.PhaseReleased),
		ended("vanished", locksv1.PhaseReleased)
	for _, lg := range []*locksv1.LockGrant{renamed, recorded, vanished} {
		ct.set(lg)
	}
	// The cache changed; the handler has not seen it yet.
	namesake := ended("namesake", locksv1.PhaseReleased)
	namesake.UID = "another-uid"
	ct.cache.objs[client.ObjectKeyFromObject(namesake)] = namesake
	annotated := recorded.DeepCopy()
	annotated.Annotations = grantWithRecord("", locksv1.UnresolvedMutation{Object: "ConfigMap/x", Operation: "op", Fence: 1, Segment: 1,
		Payload: testPayload, Since: ct.clock.Now()}).Annotations
	ct.cache.objs[client.ObjectKeyFromObject(annotated)] = annotated
	delete(ct.cache.objs, client.ObjectKeyFromObject(vanished))

	ct.clock.Step(time.Minute)
	if got := ct.collect(); len(got) != 0 {
		t.Fatalf("collected %v: a namesake, a LockGrant now recording a write, or one gone", got)
	}
	if n := ct.c.index.tracked(); n != 0 {
		t.Fatalf("still tracking %d", n)
	}
}

func TestCollectorKeepsRefusedDeletesDue(t *testing.T) {
	ct := newCollectorTest(t, time.Minute, -1)
	ct.set(ended("refused", locksv1.PhaseReleased))
	ct.set(ended("next", locksv1.PhaseReleased))
	ct.clock.Step(time.Minute)
	// A newer resourceVersion than the cache's (a write the cache has not
	// seen): refused, and due again next pass.
	ct.cache.refuse["refused"] = apierrors.NewConflict(lockGrants, "refused", fmt.Errorf("the object has been modified"))
	if got := ct.collect(); !slices.Equal(got, []string{"next"}) {
		t.Fatalf("collected %v; want [next] (and refused kept)", got)
	}
	if got := ct.due(); !slices.Equal(got, []string{"refused"}) {
		t.Fatalf("due after the refusal: %v; want [refused]", got)
	}
	if got := ct.collect(); !slices.Equal(got, []string{"refused"}) {
		t.Fatalf("collected %v; want [refused]", got)
	}
	// Gone from the API server before the cache knew: forgotten.
	ct.set(ended("gone", locksv1.PhaseReleased))
	ct.clock.Step(time.Minute)
	ct.cache.refuse["gone"] = apierrors.NewNotFound(lockGrants, "gone")
	if ct.collect(); ct.c.index.tracked() != 0 {
		t.Fatal("a LockGrant the API server no longer has is still tracked")
	}
}

// A pass costs what is due, not what is tracked.
func TestCollectorPassTouchesOnlyDueEntries(t *testing.T) {
	ct := newCollectorTest(t, time.Minute, 20_000)
	ct.set(ended("oldest", locksv1.PhaseReleased))
	ct.clock.Step(time.Second)
	for i := range 9_999 {
		ct.set(ended(fmt.Sprintf("g-%05d", i), locksv1.PhaseReleased))
	}
	ct.clock.Step(time.Minute - time.Second)
	ct.cache.gets, ct.c.index.examined = 0, 0
	if got := ct.collect(); !slices.Equal(got, []string{"oldest"}) {
		t.Fatalf("collected %v; want [oldest]", got)
	}
	if ct.cache.gets != 1 || ct.c.index.examined > 2 {
		t.Fatalf("a pass with 1 of 10,000 due read %d LockGrants and examined %d entries; want 1 and at most 2",
			ct.cache.gets, ct.c.index.examined)
	}
	if n := ct.c.index.tracked(); n != 9_999 {
		t.Fatalf("tracking %d; want 9,999", n)
	}
}

// Forgotten entries leave the FIFO even when they are not at its front.
func TestEndedIndexStaysBounded(t *testing.T) {
	var x endedIndex
	now := time.Unix(5000, 0)
	x.observe(ended("first", locksv1.PhaseReleased), now)
	const n = 10 * compactBelow
	for i := range n {
		lg := ended(fmt.Sprintf("g-%05d", i), locksv1.PhaseReleased)
		x.observe(lg, now)
		x.forget(lg.UID, nil)
		if len(x.fifo) > 2*compactBelow+2 {
			t.Fatalf("after %d forgotten: %d entries in the FIFO for %d tracked", i+1, len(x.fifo), x.tracked())
		}
	}
	if got := x.due(now.Add(time.Hour), time.Hour, -1); len(got) != 1 || got[0].uid != types.UID("uid-first") {
		t.Fatalf("due %v; want only the first", got)
	}
}

// A delete the API server refuses (its webhook down, say) keeps that entry
// due and does not keep the pass from the others behind it.
func TestCollectorGoesOnPastAFailingDelete(t *testing.T) {
	ct := newCollectorTest(t, time.Minute, -1)
	ct.set(ended("failing", locksv1.PhaseReleased))
	ct.set(ended("behind", locksv1.PhaseReleased))
	ct.clock.Step(time.Minute)
	ct.cache.refuse["failing"] = apierrors.NewInternalError(fmt.Errorf("webhook unreachable"))
	ct.cache.deleted = nil
	if err := ct.c.collect(context.Background()); err == nil {
		t.Fatal("a failed delete not reported")
	}
	if !slices.Equal(ct.cache.deleted, []string{"behind"}) {
		t.Fatalf("deleted %v; want [behind]", ct.cache.deleted)
	}
	if got := ct.due(); !slices.Equal(got, []string{"failing"}) {
		t.Fatalf("due after the failure: %v; want [failing]", got)
	}
}
