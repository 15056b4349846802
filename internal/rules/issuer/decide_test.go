package issuer

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

var t0 = time.Date(2026, 7, 19, 10, 0, 0, 0, time.UTC)

func testSigner(t *testing.T) *grant.Signer {
	t.Helper()
	s, err := grant.NewSigner("test", bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func fr(lease int32) *locksv1.FencedResource {
	return &locksv1.FencedResource{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "batch", Generation: 3, ResourceVersion: "100"},
		Spec:       locksv1.FencedResourceSpec{ResourceID: "invoice-batch/1", LeaseDurationSeconds: lease},
	}
}

func lg(name string, created time.Duration) locksv1.LockGrant {
	return locksv1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(t0.Add(created))},
		Spec: locksv1.LockGrantSpec{Resource: "batch", Owner: "owner-" + name, RequestID: "req-" + name,
			Lease: "lease-" + name, OperationRoot: "sha256:" + strings.Repeat("0", 64)},
	}
}

// apply runs one plan and applies it as the reconciler would after a successful write.
func apply(t *testing.T, in Input) Decision {
	t.Helper()
	out, err := Decide(in)
	if err != nil {
		t.Fatal(err)
	}
	in.Resource.Status = out.Status
	for _, c := range out.GrantStatus {
		for i := range in.Grants {
			if in.Grants[i].Name == c.Name {
				in.Grants[i].Status = c.Status
			}
		}
	}
	return out
}

func phases(grants []locksv1.LockGrant) string {
	var b strings.Builder
	for _, g := range grants {
		fmt.Fprintf(&b, "%s=%s ", g.Name, g.Status.Phase)
	}
	return strings.TrimSpace(b.String())
}

func TestDecideIssuesFIFOAndHandsOff(t *testing.T) {
	f := fr(10)
	grants := []locksv1.LockGrant{lg("c", 2*time.Second), lg("a", 0), lg("b", time.Second)}
	in := Input{Resource: f, Grants: grants, Now: t0.Add(3 * time.Second), Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)}
	out := apply(t, in)
	if got := phases(grants); got != "c=Pending a=Held b=Pending" {
		t.Fatalf("after first plan: %s", got)
	}
	if out.Counts.Issued != 1 || f.Status.FenceToken != 1 || f.Status.Holder.GrantName != "a" || f.Status.BackendRevision != "100" {
		t.Fatalf("unexpected registry state %+v", f.Status)
	}
	if out.RequeueAfter != 10*time.Second {
		t.Fatalf("requeueAfter %v, want the lease duration", out.RequeueAfter)
	}
	if q := f.Status.Queue; len(q) != 2 || q[0].GrantName != "b" || q[1].GrantName != "c" {
		t.Fatalf("queue %+v, want b then c", q)
	}
	// The holder's document is signed and verifies.
	h := f.Status.Holder
	if err := grant.NewTrustBundle(0, testSigner(t)).Verify(h.Grant(f.Spec.ResourceID), h.Digest, h.Proof); err != nil {
		t.Fatal(err)
	}
	// Release a: b gets fence 2 in the same decision.
	grants[1].Spec.Release = true
	out = apply(t, in)
	if got := phases(grants); got != "c=Pending a=Released b=Held" || out.Counts.Handoffs != 1 || f.Status.FenceToken != 2 {
		t.Fatalf("after release: %s, %+v", got, out)
	}
	// Changes are ordered: the ending before the new holder.
	if out.GrantStatus[0].Name != "a" || out.GrantStatus[1].Name != "b" {
		t.Fatalf("status writes out of order: %v, %v", out.GrantStatus[0].Name, out.GrantStatus[1].Name)
	}
}

func TestDecideExpiryRenewalAndFloor(t *testing.T) {
	f := fr(10)
	f.Spec.FenceFloor = 41
	grants := []locksv1.LockGrant{lg("a", 0), lg("b", time.Second)}
	in := Input{Resource: f, Grants: grants, Now: t0.Add(2 * time.Second), Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)}
	apply(t, in)
	if f.Status.FenceToken != 42 {
		t.Fatalf("first fence %d, want fenceFloor+1 = 42", f.Status.FenceToken)
	}
	// A renewal seen before expiry extends the lease from now.
	in.Now = t0.Add(11 * time.Second)
	grants[0].Spec.Renewals = 1
	apply(t, in)
	if want := t0.Add(21 * time.Second); !f.Status.Holder.ExpiresAt.Time.Equal(want) || grants[0].Status.ObservedRenewals != 1 {
		t.Fatalf("renewal: expiresAt %v want %v", f.Status.Holder.ExpiresAt, want)
	}
	// A renewal seen at or after expiry is too late.
	in.Now = t0.Add(21 * time.Second)
	grants[0].Spec.Renewals = 2
	out := apply(t, in)
	if got := phases(grants); got != "a=Expired b=Held" || out.Counts.Expiries != 1 || f.Status.FenceToken != 43 {
		t.Fatalf("expiry: %s fence %d", got, f.Status.FenceToken)
	}
}

func TestDecideNeverMovesAGrantBackwards(t *testing.T) {
	f := fr(10)
	grants := []locksv1.LockGrant{lg("a", 0)}
	in := Input{Resource: f, Grants: grants, Now: t0, Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)}
	apply(t, in)
	// A stale registry view (before the allocation) must not touch a Held grant.
	stale := fr(10)
	out, err := Decide(Input{Resource: stale, Grants: grants, Now: t0, Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range out.GrantStatus {
		if c.Name == "a" {
			t.Fatalf("stale view rewrote a Held grant to %s", c.Status.Phase)
		}
	}
	// Terminal phases never change.
	grants[0].Status.Phase = locksv1.PhaseExpired
	grants[0].Spec.Release = true
	f.Status.Holder = nil
	out = apply(t, in)
	if grants[0].Status.Phase != locksv1.PhaseExpired || len(out.GrantStatus) != 0 {
		t.Fatalf("terminal grant changed: %s", grants[0].Status.Phase)
	}
}

func TestDecideDeniesDuplicatesAndPolicyViolations(t *testing.T) {
	f := fr(10)
	f.Spec.AllowedOwners = []string{"owner-a", "owner-dup"}
	dup := lg("dup", time.Second)
	dup.Spec.RequestID = "req-a"
	dup.Spec.Owner = "owner-a"
	grants := []locksv1.LockGrant{lg("a", 0), dup, lg("stranger", 2*time.Second)}
	apply(t, Input{Resource: f, Grants: grants, Now: t0, Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)})
	if got := phases(grants); got != "a=Held dup=Denied stranger=Denied" {
		t.Fatalf("%s", got)
	}
	if len(f.Status.Queue) != 0 {
		t.Fatalf("denied requests queued: %+v", f.Status.Queue)
	}
}

func TestDecideEpochTakeoverAndRevocation(t *testing.T) {
	f := fr(30)
	grants := []locksv1.LockGrant{lg("a", 0), lg("b", time.Second)}
	in := Input{Resource: f, Grants: grants, Now: t0, Epoch: 4, TakeoverAt: t0, Signer: testSigner(t)}
	apply(t, in)
	// Epoch 5 takes over 25 s later: the lease runs to takeover + 30 s.
	in.Epoch, in.TakeoverAt, in.Now = 5, t0.Add(25*time.Second), t0.Add(26*time.Second)
	out := apply(t, in)
	if want := t0.Add(55 * time.Second); !f.Status.Holder.ExpiresAt.Time.Equal(want) || f.Status.IssuerEpoch != 5 {
		t.Fatalf("takeover: expiresAt %v want %v, epoch %d", f.Status.Holder.ExpiresAt, want, f.Status.IssuerEpoch)
	}
	if len(out.Events) != 1 || out.Events[0].Reason != "LeaseExtended" {
		t.Fatalf("events %+v", out.Events)
	}
	// Revoking epoch 4 revokes a and serves b under epoch 5.
	in.RevokedBelow = 5
	out = apply(t, in)
	if got := phases(grants); got != "a=Revoked b=Held" || out.Counts.Revocations != 1 || f.Status.Holder.IssuerEpoch != 5 {
		t.Fatalf("%s %+v", got, out)
	}
	// Revoking the issuer's own epoch stops issuing.
	in.RevokedBelow = 6
	grants = append(grants, lg("c", 2*time.Second))
	in.Grants = grants
	apply(t, in)
	if f.Status.Holder != nil || grants[2].Status.Phase != locksv1.PhasePending {
		t.Fatalf("issued under a revoked Epoch: %+v", f.Status.Holder)
	}
}

// An idle entry is not written for a takeover alone; the next grant adopts the epoch.
func TestDecideIdleEntryAdoptsEpochLazily(t *testing.T) {
	f := fr(30)
	grants := []locksv1.LockGrant{lg("a", 0)}
	in := Input{Resource: f, Grants: grants, Now: t0, Epoch: 4, TakeoverAt: t0, Signer: testSigner(t)}
	apply(t, in)
	grants[0].Spec.Release = true
	apply(t, in)
	if out := apply(t, in); out.StatusChanged || f.Status.Holder != nil {
		t.Fatalf("not idle: changed %v, holder %+v", out.StatusChanged, f.Status.Holder)
	}
	before := *f.Status.DeepCopy()
	in.Epoch, in.TakeoverAt, in.Now = 5, t0.Add(time.Minute), t0.Add(time.Minute)
	out := apply(t, in)
	if out.StatusChanged || out.Superseded || len(out.Events) != 0 || !equality.Semantic.DeepEqual(out.Status, before) {
		t.Fatalf("the takeover wrote an idle entry: changed %v, epoch %d, events %+v", out.StatusChanged, out.Status.IssuerEpoch, out.Events)
	}
	// The next arrival is issued under epoch 5, and that write adopts it.
	grants = append(grants, lg("b", time.Minute))
	in.Grants = grants
	out = apply(t, in)
	if !out.StatusChanged || grants[1].Status.Phase != locksv1.PhaseHeld || f.Status.Holder.IssuerEpoch != 5 || f.Status.IssuerEpoch != 5 {
		t.Fatalf("arrival after the takeover: %s, holder %+v, status epoch %d", phases(grants), f.Status.Holder, f.Status.IssuerEpoch)
	}
}

// A LockGrant's deletion needs no finalizer to be seen: a holder that
// vanished is released on the caller's uncached read (HolderDeleted), a
// waiter that vanished leaves the queue. The release finalizer earlier
// versions put on is removed once its LockGrant is being deleted and holds
// nothing, and never put on again.
func TestDecideHolderDeletedAndLegacyFinalizers(t *testing.T) {
	f := fr(10)
	grants := []locksv1.LockGrant{lg("a", 0), lg("b", time.Second), lg("c", 2*time.Second)}
	in := Input{Resource: f, Grants: grants, Now: t0, Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)}
	if out := apply(t, in); len(out.RemoveFinalizer) != 0 || f.Status.Holder.GrantName != "a" || len(f.Status.Queue) != 2 {
		t.Fatalf("first decision: remove %v, holder %+v, queue %+v", out.RemoveFinalizer, f.Status.Holder, f.Status.Queue)
	}
	for i := range grants {
		if len(grants[i].Finalizers) != 0 {
			t.Fatalf("%s was given finalizers %v", grants[i].Name, grants[i].Finalizers)
		}
	}

	// The holder's LockGrant vanishes: the caller's read finds it gone.
	in.Grants, in.HolderDeleted = grants[1:], true
	out := apply(t, in)
	if f.Status.Holder == nil || f.Status.Holder.GrantName != "b" || out.Counts.Releases != 1 || f.Status.FenceToken != 2 {
		t.Fatalf("vanished holder: releases %d, holder %+v", out.Counts.Releases, f.Status.Holder)
	}
	if i := slices.IndexFunc(f.Status.RecentlyEnded, func(e locksv1.EndedGrant) bool { return e.GrantUID == "uid-a" }); i < 0 ||
		f.Status.RecentlyEnded[i].Reason != locksv1.ReasonDeleted {
		t.Fatalf("the vanished holder's end is not recorded as deleted: %+v", f.Status.RecentlyEnded)
	}

	// Earlier versions' finalizers: the holder b and the waiter c carry it
	// and are deleted. c leaves the queue, b ends; each finalizer is removed
	// once its LockGrant holds nothing.
	in.Grants, in.HolderDeleted = grants[1:], false
	now := metav1.NewTime(t0)
	for i := 1; i < 3; i++ {
		grants[i].Finalizers = []string{locksv1.GrantFinalizer}
		grants[i].DeletionTimestamp = &now
	}
	out = apply(t, in)
	if f.Status.Holder != nil || len(f.Status.Queue) != 0 || !slices.Equal(out.RemoveFinalizer, []string{"b", "c"}) {
		t.Fatalf("legacy finalizers: holder %+v, queue %+v, remove %v", f.Status.Holder, f.Status.Queue, out.RemoveFinalizer)
	}
}

func TestDecideSupersededIssuerDecidesNothing(t *testing.T) {
	f := fr(10)
	f.Status.IssuerEpoch = 7
	grants := []locksv1.LockGrant{lg("a", 0)}
	out, err := Decide(Input{Resource: f, Grants: grants, Now: t0, Epoch: 6, TakeoverAt: t0, Signer: testSigner(t)})
	if err != nil {
		t.Fatal(err)
	}
	if !out.Superseded || out.StatusChanged || out.Counts.Issued != 0 || len(out.GrantStatus) != 0 {
		t.Fatalf("an older epoch acted: %+v", out)
	}
}

func TestDecideRevokesHoldersOfAnOldPolicy(t *testing.T) {
	f := fr(10)
	grants := []locksv1.LockGrant{lg("a", 0), lg("b", time.Second)}
	in := Input{Resource: f, Grants: grants, Now: t0, Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)}
	apply(t, in)
	f.Generation++ // e.g. Shadow -> Enforce
	out := apply(t, in)
	if got := phases(grants); got != "a=Revoked b=Held" || out.Counts.Revocations != 1 || f.Status.Holder.PolicyGeneration != f.Generation {
		t.Fatalf("%s", got)
	}
}

func TestDecideDoesNotRequeueAGrantedRequest(t *testing.T) {
	f := fr(10)
	grants := []locksv1.LockGrant{lg("a", 0), lg("b", time.Second)}
	in := Input{Resource: f, Grants: grants, Now: t0, Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)}
	apply(t, in)
	// a expired and b took over, but a's Expired status never landed, and the
	// cache still shows a as Pending-with-grant: it must not be queued again.
	grants[0].Status.Phase = locksv1.PhasePending
	in.Now = t0.Add(11 * time.Second)
	apply(t, in)
	grants[0].Status.Phase = locksv1.PhasePending
	out := apply(t, in)
	for _, q := range f.Status.Queue {
		if q.GrantName == "a" {
			t.Fatalf("a granted request was queued again: %+v (%+v)", f.Status.Queue, out)
		}
	}
}

// A grant whose LockGrant mirrors were all lost (a crash after the
// compare-and-swap that issued it, another after the one that ended it) looks
// like a waiting request to everything but the registry: the registry's
// record of its end keeps it from a second fence and restores its status.
func TestDecideNeverServesAnEndedGrantWhoseMirrorWasLost(t *testing.T) {
	f := fr(10)
	a, b := lg("a", 0), lg("b", time.Second)
	in := Input{Resource: f, Grants: []locksv1.LockGrant{a}, Now: t0, Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)}
	issued, err := Decide(in)
	if err != nil || issued.IssuedTo != "a" {
		t.Fatalf("issued to %q (%v), want a", issued.IssuedTo, err)
	}
	f.Status = issued.Status // the registry committed; a's Held mirror never landed
	in.Grants = []locksv1.LockGrant{a, b}
	in.Now = t0.Add(11 * time.Second) // a's lease expired
	ended, err := Decide(in)
	if err != nil || ended.IssuedTo != "b" {
		t.Fatalf("issued to %q (%v), want b after a expired", ended.IssuedTo, err)
	}
	if n := len(ended.Status.RecentlyEnded); n != 1 || ended.Status.RecentlyEnded[0].GrantUID != "uid-a" || ended.Status.RecentlyEnded[0].Phase != locksv1.PhaseExpired {
		t.Fatalf("recentlyEnded %+v, want a expired", ended.Status.RecentlyEnded)
	}
	f.Status = ended.Status           // committed; a's Expired mirror lost too, b's Held not written yet
	in.Now = t0.Add(30 * time.Second) // b expired as well
	next, err := Decide(in)
	if err != nil {
		t.Fatal(err)
	}
	if next.IssuedTo == "a" || slices.ContainsFunc(next.Status.Queue, func(q locksv1.QueuedGrant) bool { return q.GrantName == "a" }) {
		t.Fatalf("a was served again: issued to %q, queue %v", next.IssuedTo, next.Status.Queue)
	}
	var aStatus *locksv1.LockGrantStatus
	for _, s := range next.GrantStatus {
		if s.Name == "a" {
			aStatus = &s.Status
		}
	}
	if aStatus == nil || aStatus.Phase != locksv1.PhaseExpired {
		t.Fatalf("a's status planned %+v, want Expired restored from the registry", aStatus)
	}
}

// The operator's cache index holds only Active LockGrants: a resource's
// history of ended ones must not change any decision. Through a run of
// handoffs, releases, a deleted ended grant and a duplicate requestID, every
// decision made from the active grants alone equals the one made from all.
func TestDecideIgnoresEndedGrants(t *testing.T) {
	f := fr(10)
	var grants []locksv1.LockGrant
	for i, n := range []string{"a", "b", "c", "d", "e"} {
		grants = append(grants, lg(n, time.Duration(i)*time.Second))
	}
	in := Input{Resource: f, Grants: grants, Now: t0.Add(10 * time.Second), Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)}
	same := func(step string) {
		t.Helper()
		full, err := Decide(Input{Resource: f.DeepCopy(), Grants: slices.Clone(in.Grants), Now: in.Now, Epoch: 1, TakeoverAt: t0, Signer: in.Signer})
		if err != nil {
			t.Fatal(err)
		}
		active := slices.DeleteFunc(slices.Clone(in.Grants), func(g locksv1.LockGrant) bool { return !Active(&g) })
		part, err := Decide(Input{Resource: f.DeepCopy(), Grants: active, Now: in.Now, Epoch: 1, TakeoverAt: t0, Signer: in.Signer})
		if err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(withoutTransitionTimes(full), withoutTransitionTimes(part)) {
			t.Fatalf("%s: the decision from the %d active of %d grants differs:\nall:    %+v\nactive: %+v", step, len(active), len(in.Grants), full, part)
		}
	}
	ended := 0
	for step := 0; step < 12; step++ {
		same(fmt.Sprintf("step %d (%s)", step, phases(in.Grants)))
		apply(t, in)
		if h := f.Status.Holder; h != nil {
			for i := range in.Grants {
				if in.Grants[i].Name == h.GrantName {
					in.Grants[i].Spec.Release = true // the holder releases
				}
			}
		}
		for i := range in.Grants {
			if in.Grants[i].Status.Phase.Terminal() {
				ended++
			}
		}
		in.Now = in.Now.Add(time.Second)
		in.Grants = historyEvent(step, in.Grants, in.Now)
	}
	if ended == 0 {
		t.Fatal("no grant ever ended: the test compared nothing")
	}
}

// withoutTransitionTimes clears what SetCondition stamps from the wall clock.
func withoutTransitionTimes(d Decision) Decision {
	zero := func(cs []metav1.Condition) []metav1.Condition {
		cs = slices.Clone(cs)
		for i := range cs {
			cs[i].LastTransitionTime = metav1.Time{}
		}
		return cs
	}
	d.Status.Conditions = zero(d.Status.Conditions)
	d.GrantStatus = slices.Clone(d.GrantStatus)
	for i := range d.GrantStatus {
		d.GrantStatus[i].Status.Conditions = zero(d.GrantStatus[i].Status.Conditions)
	}
	return d
}

// historyEvent: at step 4 an ended grant is deleted (active again until its
// finalizer goes); at step 6 a new request arrives, with a twin of an ended
// request (same owner and requestID) under another name.
func historyEvent(step int, grants []locksv1.LockGrant, now time.Time) []locksv1.LockGrant {
	switch step {
	case 4:
		for i := range grants {
			if grants[i].Status.Phase.Terminal() {
				grants[i].DeletionTimestamp = &metav1.Time{Time: now}
				break
			}
		}
	case 6:
		nw, twin := lg("f", 9*time.Second), lg("g", 9*time.Second)
		twin.Spec.Owner, twin.Spec.RequestID = "owner-a", "req-a"
		grants = append(grants, nw, twin)
	}
	return grants
}

// TestDecideDeniesAnUnsignableRequest: a request whose fields
// fit the schema's character counts but not a grant's bytes (128 multibyte
// characters) once failed every decision, so nobody queued behind it was
// ever served. It is denied with its reason, and the next one is issued.
func TestDecideDeniesAnUnsignableRequest(t *testing.T) {
	for _, field := range []string{"requestID", "lease", "operationCategory", "owner"} {
		t.Run(field, func(t *testing.T) {
			f := fr(10)
			hostile, honest := lg("hostile", 0), lg("honest", time.Second)
			long := strings.Repeat("ü", 128) // 256 bytes
			switch field {
			case "requestID":
				hostile.Spec.RequestID = long
			case "lease":
				hostile.Spec.Lease = long
			case "operationCategory":
				hostile.Spec.OperationCategory = long
			case "owner":
				hostile.Spec.Owner = long
			}
			grants := []locksv1.LockGrant{hostile, honest}
			apply(t, Input{Resource: f, Grants: grants, Now: t0.Add(2 * time.Second), Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)})
			if got := phases(grants); got != "hostile=Denied honest=Held" {
				t.Fatalf("%s of 256 bytes: %s", field, got)
			}
			c := grants[0].Status.Conditions[0]
			if c.Reason != locksv1.ReasonUnsignable || !strings.Contains(c.Message, field+" is 256 bytes") {
				t.Errorf("the denial does not say which field and why: %s: %s", c.Reason, c.Message)
			}
		})
	}
}

// A requestID is one request per owner (docs/contract.md: one LockGrant per
// resource, owner and requestID). LockGrants written by hand may carry any
// name, so two of one owner can carry one requestID: the one already issued
// keeps its place, else the first in the queue's FIFO order is served; every
// other one is Denied naming the one it duplicates, and never holds up the
// requests behind it. Another owner's requestID is never a duplicate.
func TestDecideServesOneRequestPerOwnerAndRequestID(t *testing.T) {
	req := func(name string, created time.Duration, owner, requestID string) locksv1.LockGrant {
		g := lg(name, created)
		g.Spec.Owner, g.Spec.RequestID = owner, requestID
		return g
	}
	arrive := func(more ...locksv1.LockGrant) func([]locksv1.LockGrant) []locksv1.LockGrant {
		return func(gs []locksv1.LockGrant) []locksv1.LockGrant { return append(gs, more...) }
	}
	releases := func(name string) func([]locksv1.LockGrant) []locksv1.LockGrant {
		return func(gs []locksv1.LockGrant) []locksv1.LockGrant {
			for i := range gs {
				if gs[i].Name == name {
					gs[i].Spec.Release = true
				}
			}
			return gs
		}
	}
	for _, c := range []struct {
		name   string
		policy func(*locksv1.FencedResource)
		steps  []func([]locksv1.LockGrant) []locksv1.LockGrant // each followed by one decision
		want   string
		dupOf  map[string]string // denied duplicate -> the LockGrant it duplicates
	}{
		{name: "another owner's requestID is not a duplicate",
			steps: []func([]locksv1.LockGrant) []locksv1.LockGrant{arrive(req("a", 0, "owner-a", "nightly"), req("b", time.Second, "owner-b", "nightly"))},
			want:  "a=Held b=Pending"},
		{name: "both pending in one pass: the first in FIFO order is served, a request behind them still is",
			steps: []func([]locksv1.LockGrant) []locksv1.LockGrant{
				arrive(req("late", 2*time.Second, "owner-a", "nightly"), req("early", time.Second, "owner-a", "nightly"), req("honest", 3*time.Second, "owner-c", "other")),
				releases("early")},
			want: "late=Denied early=Released honest=Held", dupOf: map[string]string{"late": "early"}},
		{name: "a queued request keeps its place against a twin created in the same second under a smaller name",
			steps: []func([]locksv1.LockGrant) []locksv1.LockGrant{
				arrive(req("holder", 0, "owner-c", "h"), req("q", time.Second, "owner-a", "nightly")),
				arrive(req("p", time.Second, "owner-a", "nightly"))},
			want: "holder=Held q=Pending p=Denied", dupOf: map[string]string{"p": "q"}},
		{name: "a duplicate arriving while the original holds",
			steps: []func([]locksv1.LockGrant) []locksv1.LockGrant{
				arrive(req("a", 0, "owner-a", "nightly")),
				arrive(req("dup", time.Second, "owner-a", "nightly"), req("honest", 2*time.Second, "owner-b", "other"))},
			want: "a=Held dup=Denied honest=Pending", dupOf: map[string]string{"dup": "a"}},
		{name: "a duplicate arriving in the pass that releases the original; the queue moves on",
			steps: []func([]locksv1.LockGrant) []locksv1.LockGrant{
				arrive(req("a", 0, "owner-a", "nightly")),
				func(gs []locksv1.LockGrant) []locksv1.LockGrant {
					return arrive(req("dup", time.Second, "owner-a", "nightly"), req("honest", 2*time.Second, "owner-b", "other"))(releases("a")(gs))
				}},
			want: "a=Released dup=Denied honest=Held", dupOf: map[string]string{"dup": "a"}},
		{name: "after the original ended, its requestID makes a new request",
			steps: []func([]locksv1.LockGrant) []locksv1.LockGrant{
				arrive(req("a", 0, "owner-a", "nightly")), releases("a"),
				arrive(req("again", time.Second, "owner-a", "nightly"))},
			want: "a=Released again=Held"},
		{name: "a withdrawn request does not keep its place",
			steps: []func([]locksv1.LockGrant) []locksv1.LockGrant{func([]locksv1.LockGrant) []locksv1.LockGrant {
				withdrawn := req("a", 0, "owner-a", "nightly")
				withdrawn.Spec.Release = true
				return []locksv1.LockGrant{withdrawn, req("b", time.Second, "owner-a", "nightly")}
			}},
			want: "a=Released b=Held"},
		{name: "a request its policy denies does not keep its place",
			policy: func(f *locksv1.FencedResource) { f.Spec.OperationCategories = []string{"settle"} },
			steps: []func([]locksv1.LockGrant) []locksv1.LockGrant{func([]locksv1.LockGrant) []locksv1.LockGrant {
				refund, settle := req("a", 0, "owner-a", "nightly"), req("b", time.Second, "owner-a", "nightly")
				refund.Spec.OperationCategory, settle.Spec.OperationCategory = "refund", "settle"
				return []locksv1.LockGrant{refund, settle}
			}},
			want: "a=Denied b=Held"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := fr(10)
			if c.policy != nil {
				c.policy(f)
			}
			var grants []locksv1.LockGrant
			for i, step := range c.steps {
				grants = step(grants)
				apply(t, Input{Resource: f, Grants: grants, Now: t0.Add(time.Duration(10+i) * time.Second), Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)})
			}
			if got := phases(grants); got != c.want {
				t.Fatalf("got %s, want %s", got, c.want)
			}
			checkDuplicates(t, grants, f.Status.Queue, c.dupOf)
		})
	}
}

// checkDuplicates: exactly the LockGrants in dupOf are denied as duplicates,
// each naming its original, and none of them is queued.
func checkDuplicates(t *testing.T, grants []locksv1.LockGrant, queue []locksv1.QueuedGrant, dupOf map[string]string) {
	t.Helper()
	for _, g := range grants {
		cond := meta.FindStatusCondition(g.Status.Conditions, locksv1.ConditionIssued)
		orig, dup := dupOf[g.Name]
		switch {
		case dup && (cond == nil || cond.Reason != locksv1.ReasonDuplicateRequest || !strings.Contains(cond.Message, "LockGrant "+orig+" ")):
			t.Errorf("%s: condition %+v, want %s naming LockGrant %s", g.Name, cond, locksv1.ReasonDuplicateRequest, orig)
		case !dup && cond != nil && cond.Reason == locksv1.ReasonDuplicateRequest:
			t.Errorf("%s denied as a duplicate: %s", g.Name, cond.Message)
		}
	}
	for _, q := range queue {
		if _, dup := dupOf[q.GrantName]; dup {
			t.Errorf("duplicate %s queued: %+v", q.GrantName, queue)
		}
	}
}
