package issuer

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// newView is the decision state Decide builds before its steps run.
func newView(t *testing.T, in *Input) *view {
	t.Helper()
	v := &view{in: in, byName: map[string]*locksv1.LockGrant{}, st: *in.Resource.Status.DeepCopy(),
		lease: time.Duration(in.Resource.Spec.LeaseDurationSeconds) * time.Second}
	for i := range in.Grants {
		v.byName[in.Grants[i].Name] = &in.Grants[i]
	}
	v.served = servedRequests(in)
	return v
}

func TestServedRequests(t *testing.T) {
	twin := func(name string, created time.Duration, granted bool) locksv1.LockGrant {
		g := lg(name, created)
		g.Spec.Owner, g.Spec.RequestID = "owner", "same"
		if granted {
			g.Status.Grant = &locksv1.GrantDocument{FenceToken: 1}
		}
		return g
	}
	queued := func(names ...string) func(*Input) {
		return func(in *Input) {
			for _, n := range names {
				in.Resource.Status.Queue = append(in.Resource.Status.Queue, locksv1.QueuedGrant{GrantName: n, GrantUID: "uid-" + n})
			}
		}
	}
	seen := func(name string, at time.Duration) func(*Input) {
		return func(in *Input) {
			in.SeenNow = t0.Add(time.Minute)
			in.Seen.FirstSeen = map[types.UID]time.Time{types.UID("uid-" + name): t0.Add(at)}
		}
	}
	ended := func(g locksv1.LockGrant) locksv1.LockGrant {
		g.Status.Phase = locksv1.PhaseReleased
		return g
	}
	withdrawn := func(g locksv1.LockGrant) locksv1.LockGrant {
		g.Spec.Release = true
		return g
	}
	for _, c := range []struct {
		name   string
		grants []locksv1.LockGrant
		input  func(*Input)
		want   string // "" when none is served
	}{
		{"the earliest of two twins", []locksv1.LockGrant{twin("b", 2*time.Second, false), twin("a", time.Second, false)}, nil, "a"},
		{"the granted one, even if later", []locksv1.LockGrant{twin("a", time.Second, false), twin("b", 2*time.Second, true)}, nil, "b"},
		{"same creation time: by name", []locksv1.LockGrant{twin("y", time.Second, false), twin("x", time.Second, false)}, nil, "x"},
		{"the queued one, even if created later", []locksv1.LockGrant{twin("a", time.Second, false), twin("b", 2*time.Second, false)}, queued("b"), "b"},
		{"by place in the queue", []locksv1.LockGrant{twin("a", time.Second, false), twin("b", 2*time.Second, false)}, queued("b", "a"), "b"},
		{"the one seen first, when neither is queued", []locksv1.LockGrant{twin("a", time.Second, false), twin("b", 2*time.Second, false)}, seen("b", 0), "b"},
		{"an ended LockGrant changes nothing", []locksv1.LockGrant{ended(twin("a", time.Second, true)), twin("b", 2*time.Second, false)}, nil, "b"},
		{"a withdrawn request leaves its place", []locksv1.LockGrant{withdrawn(twin("a", time.Second, false)), twin("b", 2*time.Second, false)}, nil, "b"},
		{"nobody contends", []locksv1.LockGrant{withdrawn(twin("a", time.Second, false))}, nil, ""},
	} {
		in := &Input{Resource: fr(10), Grants: c.grants}
		if c.input != nil {
			c.input(in)
		}
		if got := servedRequests(in)[requestKey{"owner", "same"}]; got != c.want {
			t.Errorf("%s: served %q, want %q", c.name, got, c.want)
		}
	}
	// Another owner's requestID is another request.
	a, b := lg("a", 0), lg("b", time.Second)
	a.Spec.RequestID, b.Spec.RequestID = "same", "same"
	served := servedRequests(&Input{Resource: fr(10), Grants: []locksv1.LockGrant{a, b}})
	if served[keyOf(&a)] != "a" || served[keyOf(&b)] != "b" {
		t.Errorf("two owners' requests: served %v", served)
	}
}

func TestEnding(t *testing.T) {
	now := t0.Add(time.Minute)
	live := GrantFacts{IssuerEpoch: 2, PolicyGeneration: 3, ExpiresAt: now.Add(time.Second)}
	with := func(mut func(*GrantFacts)) GrantFacts { f := live; mut(&f); return f }
	for _, c := range []struct {
		name   string
		facts  GrantFacts
		phase  locksv1.LockGrantPhase
		reason string
	}{
		{"holds", live, "", ""},
		{"gone wins over everything", with(func(f *GrantFacts) { f.Gone, f.IssuerEpoch, f.Release = true, 0, true }), locksv1.PhaseReleased, locksv1.ReasonDeleted},
		{"revoked epoch wins over release", with(func(f *GrantFacts) { f.IssuerEpoch, f.Release = 1, true }), locksv1.PhaseRevoked, locksv1.ReasonRevoked},
		{"an old policy", with(func(f *GrantFacts) { f.PolicyGeneration = 2 }), locksv1.PhaseRevoked, locksv1.ReasonPolicyChanged},
		{"deleting wins over expiry", with(func(f *GrantFacts) { f.Deleting, f.ExpiresAt = true, now }), locksv1.PhaseReleased, locksv1.ReasonDeleted},
		{"expired at expiresAt exactly", with(func(f *GrantFacts) { f.ExpiresAt = now }), locksv1.PhaseExpired, locksv1.ReasonExpired},
		{"a release seen after expiry counts as expiry", with(func(f *GrantFacts) { f.ExpiresAt, f.Release = now.Add(-time.Millisecond), true }), locksv1.PhaseExpired, locksv1.ReasonExpired},
		{"a release before expiry", with(func(f *GrantFacts) { f.Release = true }), locksv1.PhaseReleased, locksv1.ReasonReleased},
		{"expiry unknown: a release counts", with(func(f *GrantFacts) { f.ExpiryUnknown, f.ExpiresAt, f.Release = true, now.Add(-time.Hour), true }), locksv1.PhaseReleased, locksv1.ReasonReleased},
		{"expiry unknown, nothing else: holds", with(func(f *GrantFacts) { f.ExpiryUnknown, f.ExpiresAt = true, time.Time{} }), "", ""},
	} {
		if p, r := Ending(c.facts, 2, 3, now); p != c.phase || r != c.reason {
			t.Errorf("%s: got %q/%q, want %q/%q", c.name, p, r, c.phase, c.reason)
		}
	}
}

func TestAdoptEpoch(t *testing.T) {
	holder := func(expires time.Time) *locksv1.FencedResource {
		f := fr(10)
		f.Status.IssuerEpoch = 1
		f.Status.Holder = &locksv1.Holder{GrantUID: "uid-a", FenceToken: 4, ExpiresAt: metav1.NewMicroTime(expires)}
		return f
	}
	for _, c := range []struct {
		name        string
		f           *locksv1.FencedResource
		epoch       int64
		wantExpires time.Time
		wantEvents  int
	}{
		{"same epoch: nothing changes", holder(t0.Add(3 * time.Second)), 1, t0.Add(3 * time.Second), 0},
		{"new epoch extends to takeover + lease", holder(t0.Add(3 * time.Second)), 2, t0.Add(10 * time.Second), 1},
		{"new epoch never shortens a lease", holder(t0.Add(time.Minute)), 2, t0.Add(time.Minute), 0},
	} {
		v := newView(t, &Input{Resource: c.f, Epoch: c.epoch, TakeoverAt: t0})
		events := adoptEpoch(v)
		if v.st.IssuerEpoch != c.epoch || !v.st.Holder.ExpiresAt.Time.Equal(c.wantExpires) || len(events) != c.wantEvents {
			t.Errorf("%s: epoch %d, expires %s, %d events", c.name, v.st.IssuerEpoch, v.st.Holder.ExpiresAt.Time, len(events))
		}
	}
}

func TestDeferIdleAdoption(t *testing.T) {
	ready := func(f *locksv1.FencedResource) {
		SetCondition(&f.Status.Conditions, f.Generation, locksv1.ConditionReady, true, locksv1.ReasonIssuing, "grants are issued")
	}
	for _, c := range []struct {
		name   string
		old    func(*locksv1.FencedResource)
		next   func(*locksv1.FencedResourceStatus) // the status the earlier steps built
		wantEp int64
	}{
		{"idle, only the epoch changes: not written", nil, nil, 1},
		{"idle, something else changes too: the write adopts it", nil, func(st *locksv1.FencedResourceStatus) {
			st.FenceToken = 8
		}, 2},
		{"held: written, the extension must reach the webhook", func(f *locksv1.FencedResource) {
			f.Status.Holder = &locksv1.Holder{GrantUID: "uid-a", FenceToken: 7}
		}, nil, 2},
		{"waiters queued: written", func(f *locksv1.FencedResource) {
			f.Status.Queue = []locksv1.QueuedGrant{{GrantName: "b", GrantUID: "uid-b"}}
		}, nil, 2},
		{"a holder issued just now: written", nil, func(st *locksv1.FencedResourceStatus) {
			st.Holder = &locksv1.Holder{GrantUID: "uid-b", FenceToken: 8, IssuerEpoch: 2}
		}, 2},
	} {
		f := fr(10)
		f.Status.IssuerEpoch, f.Status.FenceToken = 1, 7
		ready(f)
		if c.old != nil {
			c.old(f)
		}
		v := newView(t, &Input{Resource: f, Epoch: 2, TakeoverAt: t0})
		v.st.IssuerEpoch = 2 // what adoptEpoch did
		if c.next != nil {
			c.next(&v.st)
		}
		deferIdleAdoption(v)
		if v.st.IssuerEpoch != c.wantEp {
			t.Errorf("%s: status epoch %d, want %d", c.name, v.st.IssuerEpoch, c.wantEp)
		}
	}
}

func TestRebuildQueue(t *testing.T) {
	f := fr(10)
	f.Spec.AllowedOwners = []string{"owner-a", "owner-b", "owner-c", "owner-d", "owner-e"}
	released, deleting, denied, granted := lg("r", 0), lg("d", 0), lg("x", 0), lg("g", 0)
	released.Spec.Release = true
	now := metav1.NewTime(t0)
	deleting.DeletionTimestamp = &now
	denied.Spec.Owner = "stranger"
	granted.Status.Grant = &locksv1.GrantDocument{FenceToken: 1}
	f.Status.Queue = []locksv1.QueuedGrant{{GrantName: "c"}, {GrantName: "r"}, {GrantName: "gone"}, {GrantName: "a"}}
	in := &Input{Resource: f, Grants: []locksv1.LockGrant{lg("a", 3), lg("b", 2), lg("c", 5), lg("e", 1), released, deleting, denied, granted}}
	v := newView(t, in)
	var d Decision
	rebuildQueue(v, &d)
	var got []string
	for _, q := range v.st.Queue {
		got = append(got, q.GrantName)
	}
	// The kept order first (c, a), then arrivals by creation (e, b).
	if want := []string{"c", "a", "e", "b"}; !slices.Equal(got, want) {
		t.Fatalf("queue %v, want %v", got, want)
	}
	// Only the arrivals are new to the registry, queued under their UIDs.
	if want := []string{"e", "b"}; !slices.Equal(d.Unconfirmed, want) {
		t.Fatalf("unconfirmed %v, want %v", d.Unconfirmed, want)
	}
	if q := v.st.Queue[2]; q.GrantUID != "uid-e" {
		t.Fatalf("arrival queued as %+v, want its UID", q)
	}
}

// TestRebuildQueueWithinOneSecond: requests first seen in one pass and
// created in the same second are queued by their creations' versions
// (Input.CreationVersion), not by name; one the caller cannot place comes
// after those it can, and without versions the name decides.
func TestRebuildQueueWithinOneSecond(t *testing.T) {
	f := fr(10)
	versions := map[types.UID]uint64{"uid-c": 7, "uid-a": 9, "uid-b": 8}
	created := func(uid types.UID) (uint64, bool) { rv, ok := versions[uid]; return rv, ok }
	queue := func(in *Input) []string {
		v := newView(t, in)
		rebuildQueue(v, &Decision{})
		var got []string
		for _, q := range v.st.Queue {
			got = append(got, q.GrantName)
		}
		return got
	}
	grants := func() []locksv1.LockGrant {
		return []locksv1.LockGrant{lg("a", 0), lg("b", 0), lg("c", 0), lg("d", 0), lg("e", -time.Second)}
	}
	for _, tc := range []struct {
		name    string
		created func(types.UID) (uint64, bool)
		want    []string
	}{
		{"by version, unplaced last", created, []string{"e", "c", "b", "a", "d"}},
		{"no versions", nil, []string{"e", "a", "b", "c", "d"}},
	} {
		in := &Input{Resource: f, Grants: grants(), CreationVersion: tc.created}
		if got := queue(in); !slices.Equal(got, tc.want) {
			t.Errorf("%s: queue %v, want %v (an earlier second first)", tc.name, got, tc.want)
		}
	}
}

// TestConfirmation: a fence goes without a read around the cache only to a
// head the committed queue holds under its UID; everything else the cache
// says for the first time is for the caller to confirm.
func TestConfirmation(t *testing.T) {
	recreated := lg("a", 0)
	recreated.UID = "uid-a-again"
	for _, c := range []struct {
		name        string
		queue       []locksv1.QueuedGrant
		grants      []locksv1.LockGrant
		issued      string
		unconfirmed []string
		queued      []string
	}{
		{"head confirmed when queued", []locksv1.QueuedGrant{{GrantName: "a", GrantUID: "uid-a"}},
			[]locksv1.LockGrant{lg("a", 0)}, "a", nil, nil},
		{"head queued before UIDs were recorded", []locksv1.QueuedGrant{{GrantName: "a"}},
			[]locksv1.LockGrant{lg("a", 0)}, "a", []string{"a"}, nil},
		{"an arrival issued at once", nil,
			[]locksv1.LockGrant{lg("a", 0)}, "a", []string{"a"}, nil},
		{"the head is issued, a later arrival queued", []locksv1.QueuedGrant{{GrantName: "a", GrantUID: "uid-a"}},
			[]locksv1.LockGrant{lg("a", 0), lg("b", 1)}, "a", []string{"b"}, []string{"b"}},
		{"a re-created LockGrant is another request, and queues last", []locksv1.QueuedGrant{{GrantName: "a", GrantUID: "uid-a"}, {GrantName: "b", GrantUID: "uid-b"}},
			[]locksv1.LockGrant{recreated, lg("b", 1)}, "b", []string{"a"}, []string{"a"}},
	} {
		f := fr(10)
		f.Spec.AllowedOwners = []string{"owner-a", "owner-b"}
		f.Status.Queue = c.queue
		d, err := Decide(Input{Resource: f, Grants: c.grants, Now: t0, Epoch: 1, Signer: testSigner(t)})
		if err != nil {
			t.Fatal(err)
		}
		var queued []string
		for _, q := range d.Status.Queue {
			queued = append(queued, q.GrantName)
		}
		if d.IssuedTo != c.issued || !slices.Equal(d.Unconfirmed, c.unconfirmed) || !slices.Equal(queued, c.queued) {
			t.Errorf("%s: issued %q, unconfirmed %v, queue %v; want %q, %v, %v", c.name, d.IssuedTo, d.Unconfirmed, queued, c.issued, c.unconfirmed, c.queued)
		}
	}
}

func TestIssueToHead(t *testing.T) {
	for _, c := range []struct {
		name         string
		token, floor int64
		epoch        int64
		revoked      int64
		wantFence    int64
	}{
		{"next fence", 4, 0, 1, 0, 5},
		{"above the floor", 4, 9, 1, 0, 10},
		{"a revoked issuer issues nothing", 4, 0, 1, 2, 0},
	} {
		f := fr(10)
		f.Status.FenceToken, f.Spec.FenceFloor = c.token, c.floor
		f.Status.Queue = []locksv1.QueuedGrant{{GrantName: "a"}}
		v := newView(t, &Input{Resource: f, Grants: []locksv1.LockGrant{lg("a", 0)}, Now: t0, Epoch: c.epoch, RevokedBelow: c.revoked, Signer: testSigner(t)})
		var d Decision
		if err := issueToHead(v, &d, true); err != nil {
			t.Fatal(err)
		}
		switch {
		case c.wantFence == 0 && (v.st.Holder != nil || d.IssuedTo != ""):
			t.Errorf("%s: issued %+v", c.name, v.st.Holder)
		case c.wantFence != 0 && (v.st.Holder == nil || v.st.Holder.FenceToken != c.wantFence || v.st.FenceToken != c.wantFence ||
			v.st.Holder.Proof == "" || d.Counts.Handoffs != 1 || v.st.Queue != nil):
			t.Errorf("%s: holder %+v, token %d, decision %+v", c.name, v.st.Holder, v.st.FenceToken, d)
		}
	}
}

func TestReleasesLegacyFinalizer(t *testing.T) {
	now := metav1.NewTime(t0)
	with := func(fin, deleting bool, phase locksv1.LockGrantPhase) *locksv1.LockGrant {
		g := lg("a", 0)
		if fin {
			g.Finalizers = []string{locksv1.GrantFinalizer}
		}
		if deleting {
			g.DeletionTimestamp = &now
		}
		g.Status.Phase = phase
		return &g
	}
	for _, c := range []struct {
		name  string
		g     *locksv1.LockGrant
		holds bool
		want  bool
	}{
		{"a live request never gets it", with(false, false, locksv1.PhasePending), false, false},
		{"a live request keeps an old one", with(true, false, locksv1.PhasePending), false, false},
		{"not when terminal and not deleted", with(true, false, locksv1.PhaseExpired), false, false},
		{"deleted and not holding: removed", with(true, true, locksv1.PhaseHeld), false, true},
		{"deleted but still the holder: kept", with(true, true, locksv1.PhaseHeld), true, false},
		{"deleted without one: nothing to write", with(false, true, locksv1.PhaseHeld), false, false},
	} {
		if got := releasesLegacyFinalizer(c.g, c.holds); got != c.want {
			t.Errorf("%s: %t, want %t", c.name, got, c.want)
		}
	}
}

func TestSetConditions(t *testing.T) {
	f := fr(10)
	f.Spec.FenceFloor = 7
	f.Status.HighestObservedFence = 7
	SetCondition(&f.Status.Conditions, 1, locksv1.ConditionFenceRegression, true, locksv1.ReasonRegressionFound, "behind")
	f.Status.Holder = &locksv1.Holder{Owner: "o", FenceToken: 8, ExpiresAt: metav1.NewMicroTime(t0.Add(4 * time.Second))}
	v := newView(t, &Input{Resource: f, Now: t0, Epoch: 1, RevokedBelow: 2})
	requeue := setConditions(v)
	want := map[string]metav1.ConditionStatus{locksv1.ConditionReady: metav1.ConditionFalse,
		locksv1.ConditionFenceRegression: metav1.ConditionFalse, locksv1.ConditionHeld: metav1.ConditionTrue}
	for typ, status := range want {
		if c := findCondition(v.st.Conditions, typ); c == nil || c.Status != status {
			t.Errorf("%s: %+v, want %s", typ, c, status)
		}
	}
	if requeue != 4*time.Second {
		t.Errorf("requeue after %s, want the holder's expiry in 4s", requeue)
	}
}

func findCondition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}
