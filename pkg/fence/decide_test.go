package fence

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

var now = time.Date(2026, 7, 19, 10, 0, 0, 0, time.UTC)

const resourceID = "invoice-batch/2026-07-19"

type world struct {
	t      *testing.T
	signer *grant.Signer
	bundle *grant.TrustBundle
}

func newWorld(t *testing.T) *world {
	s, err := grant.NewSigner("issuer", bytes.Repeat([]byte{1}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, signer: s, bundle: grant.NewTrustBundle(0, s)}
}

func rootOf(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }

func (w *world) grant(owner string, fence int64, root string) grant.Grant {
	return grant.Grant{Schema: grant.Schema, Resource: resourceID, Owner: owner, RequestID: "req-" + owner,
		Lease: "lease-" + owner, OperationRoot: root, FenceToken: fence, BackendRevision: "7",
		PolicyGeneration: 1, IssuerEpoch: 1, TTLSeconds: 10, IssuedAt: "2026-07-19T09:59:59Z"}
}

func (w *world) envelope(g grant.Grant, segment int64, payload string) string {
	_, proof, err := w.signer.Sign(g)
	if err != nil {
		w.t.Fatal(err)
	}
	e := Envelope{Grant: g, Proof: proof, Operation: "op-" + g.Owner, Segment: segment, Payload: payload}
	return e.Encode()
}

func payload(s string) string {
	d, _ := PayloadDigest(map[string]any{"data": map[string]string{"v": s}})
	return d
}

// held is a registry whose current holder is g.
func held(g grant.Grant) Registry {
	return Registry{Found: true, ResourceID: resourceID, Generation: 1, Now: now,
		Holder: &Holder{Digest: g.Digest(), Owner: g.Owner, Lease: g.Lease, RequestID: g.RequestID, Fence: g.FenceToken, ExpiresAt: now.Add(5 * time.Second)}}
}

// write is an accepted write of g's segment with content v.
func (w *world) write(st State, g grant.Grant, segment int64, v string) State {
	w.t.Helper()
	d := Decide(st, Attempt{User: g.Owner, Changed: true, Fence: w.envelope(g, segment, payload(v)), Payload: payload(v)}, held(g), w.bundle)
	if d.Verdict != Accepted {
		w.t.Fatalf("setup write fence %d segment %d: %s", g.FenceToken, segment, d.Message)
	}
	return d.State
}

func TestDecideVerdicts(t *testing.T) {
	w := newWorld(t)
	a := w.grant("worker-a", 5, rootOf('a'))
	b := w.grant("worker-b", 6, rootOf('b'))
	// The object accepted a's segments 1 and 2.
	st := w.write(w.write(State{}, a, 1, "a1"), a, 2, "a2")

	other, _ := grant.NewSigner("rogue", bytes.Repeat([]byte{2}, 32))
	forge := func(g grant.Grant, seg int64, p string) string {
		_, proof, _ := other.Sign(g)
		e := Envelope{Grant: g, Proof: strings.Replace(proof, "rogue", "issuer", 1), Operation: "op", Segment: seg, Payload: p}
		return e.Encode()
	}
	tampered := func() string {
		e, _ := ParseEnvelope(w.envelope(a, 3, payload("a3")))
		e.Grant.FenceToken = 99
		return e.Encode()
	}
	rawEnvelope := func(mutate func(string) string) string { return mutate(w.envelope(a, 3, payload("a3"))) }
	crossResource := a
	crossResource.Resource = "invoice-batch/other-day"
	revoked := w.grant("worker-a", 5, rootOf('a'))
	revoked.IssuerEpoch = 0
	revokedBundle := grant.NewTrustBundle(1, w.signer)
	mallory := a
	mallory.Owner = "mallory"
	policyMoved := held(a)
	policyMoved.Generation = 2
	regressed := w.grant("worker-c", 4, rootOf('c')) // the registry went back and issued fence 4
	sameFenceOtherRoot := w.grant("worker-c", 5, rootOf('c'))
	sameFenceSameRoot := w.grant("worker-c", 5, rootOf('a'))

	expired := held(a)
	expired.Now = now.Add(time.Minute)

	cases := []struct {
		name   string
		st     State
		a      Attempt
		reg    Registry
		bundle *grant.TrustBundle
		want   Verdict
	}{
		{"no-op update", st, Attempt{User: "anyone", Changed: false}, held(a), nil, Unchanged},
		{"missing annotation", st, Attempt{User: "worker-a", Changed: true, Payload: payload("x")}, held(a), nil, FenceRequired},
		{"stale annotation reused", st, Attempt{User: "worker-a", Changed: true, Fence: st.Accepted, Payload: payload("x")}, held(a), nil, FenceRequired},
		{"not json", st, Attempt{User: "worker-a", Changed: true, Fence: "{", Payload: payload("a3")}, held(a), nil, BadGrant},
		{"oversized", st, Attempt{User: "worker-a", Changed: true, Fence: strings.Repeat(" ", MaxFenceAnnotationBytes+1), Payload: payload("a3")}, held(a), nil, BadGrant},
		{"negative fence", st, Attempt{User: "worker-a", Changed: true, Fence: rawEnvelope(func(s string) string { return strings.Replace(s, `"fenceToken":5`, `"fenceToken":-5`, 1) }), Payload: payload("a3")}, held(a), nil, BadGrant},
		{"fence over int64", st, Attempt{User: "worker-a", Changed: true, Fence: rawEnvelope(func(s string) string {
			return strings.Replace(s, `"fenceToken":5`, `"fenceToken":92233720368547758070`, 1)
		}), Payload: payload("a3")}, held(a), nil, BadGrant},
		{"segment zero", st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(a, 0, payload("a3")), Payload: payload("a3")}, held(a), nil, BadGrant},
		{"wrong schema", st, Attempt{User: "worker-a", Changed: true, Fence: rawEnvelope(func(s string) string { return strings.Replace(s, "lockGrant.v1", "lockGrant.v9", 1) }), Payload: payload("a3")}, held(a), nil, BadGrant},
		{"forged signature", st, Attempt{User: "worker-a", Changed: true, Fence: forge(a, 3, payload("a3")), Payload: payload("a3")}, held(a), nil, ForgedGrant},
		{"tampered fence", st, Attempt{User: "worker-a", Changed: true, Fence: tampered(), Payload: payload("a3")}, held(a), nil, ForgedGrant},
		{"cross-resource replay", st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(crossResource, 3, payload("a3")), Payload: payload("a3")}, held(a), nil, WrongResource},
		{"unregistered", st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(a, 3, payload("a3")), Payload: payload("a3")}, Registry{Now: now}, nil, WrongResource},
		{"wrong owner", st, Attempt{User: "worker-b", Changed: true, Fence: w.envelope(a, 3, payload("a3")), Payload: payload("a3")}, held(a), nil, WrongOwner},
		{"revoked epoch", st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(revoked, 3, payload("a3")), Payload: payload("a3")}, held(a), revokedBundle, RevokedEpoch},
		{"payload mismatch", st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(a, 3, payload("a3")), Payload: payload("other")}, held(a), nil, PayloadMismatch},
		{"registry regressed below the object", st, Attempt{User: "worker-c", Changed: true, Fence: w.envelope(regressed, 1, payload("c1")), Payload: payload("c1")}, held(regressed), nil, FenceRegression},
		{"registry reissued the same fence", st, Attempt{User: "worker-c", Changed: true, Fence: w.envelope(sameFenceOtherRoot, 1, payload("c1")), Payload: payload("c1")}, held(sameFenceOtherRoot), nil, FenceRegression},
		{"older fence, not current", st, Attempt{User: "worker-z", Changed: true, Fence: w.envelope(w.grant("worker-z", 3, rootOf('e')), 1, payload("z")), Payload: payload("z")}, held(a), nil, StaleOwner},
		{"registry reissued the same fence and root", st, Attempt{User: "worker-c", Changed: true, Fence: w.envelope(sameFenceSameRoot, 1, payload("c1")), Payload: payload("c1")}, held(sameFenceSameRoot), nil, FenceRegression},
		{"equal fence, other root, not current", st, Attempt{User: "worker-c", Changed: true, Fence: w.envelope(sameFenceOtherRoot, 3, payload("c1")), Payload: payload("c1")}, held(b), nil, RootMismatch},
		{"expired holder continues", st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(a, 3, payload("a3")), Payload: payload("a3")}, expired, nil, NotHeld},
		{"a copy of the holder's fence, lease and requestID for another owner", st, Attempt{User: "mallory", Changed: true, Fence: w.envelope(mallory, 3, payload("m")), Payload: payload("m")}, held(a), nil, NotHeld},
		{"holder moved on", st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(a, 3, payload("a3")), Payload: payload("a3")}, held(b), nil, NotHeld},
		{"policy changed", st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(a, 3, payload("a3")), Payload: payload("a3")}, policyMoved, nil, PolicyStale},
		{"higher fence with segment 2", st, Attempt{User: "worker-b", Changed: true, Fence: w.envelope(b, 2, payload("b2")), Payload: payload("b2")}, held(b), nil, SegmentOutOfOrder},
		{"higher fence with segment 1", st, Attempt{User: "worker-b", Changed: true, Fence: w.envelope(b, 1, payload("b1")), Payload: payload("b1")}, held(b), nil, Accepted},
		{"equal fence, next segment", st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(a, 3, payload("a3")), Payload: payload("a3")}, held(a), nil, Accepted},
		{"equal fence, skipped segment", st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(a, 4, payload("a4")), Payload: payload("a4")}, held(a), nil, SegmentOutOfOrder},
		{"duplicate segment, same payload", st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(a, 1, payload("a1")), Payload: payload("a1")}, held(a), nil, AlreadyApplied},
		{"duplicate segment, other payload", st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(a, 2, payload("evil")), Payload: payload("evil")}, held(a), nil, Quarantined},
		{"undeclared delete by holder", st, Attempt{User: "worker-a", Delete: true}, held(a), nil, DeleteNotDeclared},
		{"delete by regressed holder", st, Attempt{User: "worker-c", Delete: true}, held(regressed), nil, FenceRegression},
	}
	seen := map[Verdict]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bundle := c.bundle
			if bundle == nil {
				bundle = w.bundle
			}
			before := cloneState(c.st)
			d := Decide(c.st, c.a, c.reg, bundle)
			if d.Verdict != c.want {
				t.Fatalf("verdict %s, want %s (%s)", d.Verdict, c.want, d.Message)
			}
			if !strings.HasPrefix(d.Message, string(c.want)) {
				t.Fatalf("message %q does not start with the verdict", d.Message)
			}
			if !reflect.DeepEqual(c.st, before) {
				t.Fatal("Decide modified its input state")
			}
			if c.want != Accepted && !reflect.DeepEqual(d.State, before) {
				t.Fatalf("a %s decision changed the state: %+v", c.want, d.State)
			}
			seen[d.Verdict] = true
		})
	}
	for _, v := range []Verdict{Accepted, Unchanged, FenceRequired, BadGrant, ForgedGrant, WrongResource, WrongOwner, RevokedEpoch,
		PayloadMismatch, FenceRegression, StaleOwner, RootMismatch, NotHeld, PolicyStale, SegmentOutOfOrder, AlreadyApplied, Quarantined, DeleteNotDeclared} {
		if !seen[v] {
			t.Errorf("no case reaches %s", v)
		}
	}
}

func TestStaleOwnerWithUnusedLaterSegment(t *testing.T) {
	w := newWorld(t)
	a := w.grant("worker-a", 5, rootOf('a'))
	b := w.grant("worker-b", 6, rootOf('b'))
	st := w.write(State{}, a, 1, "a1")     // A wrote segment 1 and paused
	st = w.write(st, b, 1, "b1")           // B took over with fence 6
	for _, seg := range []int64{1, 2, 3} { // A resumes with any segment, even unused ones
		d := Decide(st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(a, seg, payload("a")), Payload: payload("a")}, held(b), w.bundle)
		if d.Verdict != StaleOwner {
			t.Fatalf("segment %d: %s", seg, d.Message)
		}
	}
	// Even if the registry (wrongly) still showed A as holder, a lower fence is never accepted.
	d := Decide(st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(a, 2, payload("a")), Payload: payload("a")}, held(a), w.bundle)
	if d.Verdict != FenceRegression {
		t.Fatalf("lower fence from a current grant: %s", d.Message)
	}
}

func TestAcceptedStateAndReceipts(t *testing.T) {
	w := newWorld(t)
	a := w.grant("worker-a", 1, rootOf('a'))
	st := State{}
	for seg := int64(1); seg <= MaxReceipts+5; seg++ {
		v := payload(string(rune('a' + seg%26)))
		env := w.envelope(a, seg, v)
		d := Decide(st, Attempt{User: "worker-a", Changed: true, Fence: env, Payload: v}, held(a), w.bundle)
		if d.Verdict != Accepted {
			t.Fatalf("segment %d: %s", seg, d.Message)
		}
		want := ReceiptDigest(resourceID, 1, a.OperationRoot, seg, "op-worker-a", v)
		if d.Receipt != want || d.State.LastSegment != seg || d.State.HighestFence != 1 || d.State.Accepted != env {
			t.Fatalf("segment %d: state %+v receipt %s", seg, d.State, d.Receipt)
		}
		st = d.State
	}
	if len(st.Receipts) != MaxReceipts || st.Receipts[0].Segment != 6 {
		t.Fatalf("log not trimmed to the newest %d: first segment %d, len %d", MaxReceipts, st.Receipts[0].Segment, len(st.Receipts))
	}
	// State round-trips through the annotations.
	back, err := StateOf(st.Accepted, EncodeReceipts(st.Receipts))
	if err != nil || !reflect.DeepEqual(back, st) {
		t.Fatalf("StateOf: %v\n%+v\n%+v", err, back, st)
	}
	// A segment whose receipt fell out of the log cannot be proven a replay.
	d := Decide(st, Attempt{User: "worker-a", Changed: true, Fence: w.envelope(a, 2, payload("x")), Payload: payload("x")}, held(a), w.bundle)
	if d.Verdict != SegmentOutOfOrder {
		t.Fatalf("trimmed replay: %s", d.Message)
	}
}

func TestReceiptDigestAndPayloadEncoding(t *testing.T) {
	// Fixed vectors: any change to the encodings breaks clients in the field.
	if got := ReceiptDigest("r", 3, "sha256:00", 2, "op", "sha256:11"); got != "sha256:"+sha256hex("r\n3\nsha256:00\n2\nop\nsha256:11") {
		t.Fatalf("receipt digest %s", got)
	}
	b, _ := CanonicalJSON(ConfigMapPayload(map[string]string{"b": "<&>", "a": "1"}, map[string][]byte{"bin": {0, 1, 2}}))
	if string(b) != `{"binaryData":{"bin":"AAEC"},"data":{"a":"1","b":"<&>"}}` {
		t.Fatalf("configmap payload %s", b)
	}
	if b, _ := CanonicalJSON(ConfigMapPayload(nil, nil)); string(b) != `{}` {
		t.Fatalf("empty configmap payload %s", b)
	}
}

func TestParseEnvelopeRejects(t *testing.T) {
	w := newWorld(t)
	good := w.envelope(w.grant("a", 1, rootOf('a')), 1, payload("x"))
	for name, s := range map[string]string{
		"unknown field":  strings.Replace(good, `"proof"`, `"x":1,"proof"`, 1),
		"bad payload":    strings.Replace(good, `"payload":"sha256:`, `"payload":"md5:`, 1),
		"empty op":       strings.Replace(good, `"operation":"op-a"`, `"operation":""`, 1),
		"segment float":  strings.Replace(good, `"segment":1`, `"segment":1.5`, 1),
		"segment string": strings.Replace(good, `"segment":1`, `"segment":"1"`, 1),
		"no proof":       strings.Replace(good, `"proof":"`, `"proof":"`+`"`+`,"_":"`, 1),
		"trailing":       good + "{}",
	} {
		if _, err := ParseEnvelope(s); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	if _, err := ParseEnvelope(good); err != nil {
		t.Fatal(err)
	}
}

func cloneState(s State) State {
	s.Receipts = append([]Receipt(nil), s.Receipts...)
	return s
}

func TestObjectPayloadMatchesTypedConfigMap(t *testing.T) {
	cm := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "x"},
		"data": map[string]any{"a": "1"}, "binaryData": map[string]any{"bin": "AAEC"}}
	got, _ := PayloadDigest(ObjectPayload(cm))
	want, _ := PayloadDigest(ConfigMapPayload(map[string]string{"a": "1"}, map[string][]byte{"bin": {0, 1, 2}}))
	if got != want {
		t.Fatalf("unstructured %s != typed %s", got, want)
	}
	cr := map[string]any{"apiVersion": "billing.example.com/v1", "kind": "InvoiceBatch", "spec": map[string]any{"total": int64(3)}}
	if b, _ := CanonicalJSON(ObjectPayload(cr)); string(b) != `{"total":3}` {
		t.Fatalf("cr payload %s", b)
	}
	if b, _ := CanonicalJSON(ObjectPayload(map[string]any{"kind": "X"})); string(b) != `{}` {
		t.Fatalf("no spec %s", b)
	}
}

func TestStampProducesWhatDecideAccepts(t *testing.T) {
	w := newWorld(t)
	a := w.grant("worker-a", 1, rootOf('a'))
	ann := map[string]string{}
	st := State{}
	for seg := int64(1); seg <= 3; seg++ {
		_, proof, _ := w.signer.Sign(a)
		env := Envelope{Grant: a, Proof: proof, Operation: "op", Segment: seg, Payload: payload("v")}
		r, err := Stamp(ann, env)
		if err != nil {
			t.Fatal(err)
		}
		d := Decide(st, Attempt{User: "worker-a", Changed: true, Fence: ann[AnnotationFence], Payload: payload("v")}, held(a), w.bundle)
		if d.Verdict != Accepted || d.Receipt != r.Receipt || EncodeReceipts(d.State.Receipts) != ann[AnnotationReceipts] {
			t.Fatalf("segment %d: %s", seg, d.Message)
		}
		st = d.State
	}
}

// declare is an accepted write of g's segment that declares the delete.
func (w *world) declare(st State, g grant.Grant, segment int64, v string) State {
	w.t.Helper()
	_, proof, _ := w.signer.Sign(g)
	env := (&Envelope{Grant: g, Proof: proof, Operation: "op-" + g.Owner, Segment: segment, Payload: payload(v), Intent: IntentDelete}).Encode()
	d := Decide(st, Attempt{User: g.Owner, Changed: true, Fence: env, Payload: payload(v)}, held(g), w.bundle)
	if d.Verdict != Accepted || !d.State.DeleteIntent {
		w.t.Fatalf("setup intent fence %d segment %d: %s", g.FenceToken, segment, d.Message)
	}
	return d.State
}

func TestDecideDelete(t *testing.T) {
	w := newWorld(t)
	a := w.grant("worker-a", 5, rootOf('a'))
	plain := w.write(w.write(State{}, a, 1, "a1"), a, 2, "a2")
	declared := w.declare(plain, a, 3, "a2") // same content, intent delete

	// worker-a takes the lock again under a new grant (fence 6): the intent
	// its earlier grant declared does not carry over.
	a2 := w.grant("worker-a", 6, rootOf('a'))
	a2.RequestID, a2.Lease = "req-a-again", "lease-a-again"
	b := w.grant("worker-b", 6, rootOf('b'))
	expired := held(a)
	expired.Now = now.Add(time.Minute)
	policyMoved := held(a)
	policyMoved.Generation = 2
	noDigest := held(a)
	noDigest.Holder.Digest = ""
	regressed := held(w.grant("worker-a", 4, rootOf('c')))
	// A planted state (the webhook only passes verified ones, but Decide does
	// not rely on it): the intent envelope cannot be read.
	unreadable := declared
	unreadable.Accepted = `{"grant":{}}`
	// After a write that drops the intent, the delete is undeclared again.
	undone := w.write(declared, a, 4, "a4")
	// The registry remembers a higher fence than the object shows.
	floorOnly := State{HighestFence: 5}

	cases := []struct {
		name string
		st   State
		user string
		reg  Registry
		want Verdict
	}{
		{"intent declared by the current grant, deleted by its owner", declared, "worker-a", held(a), Accepted},
		{"a stale process sharing the holder's identity, no intent", plain, "worker-a", held(a), DeleteNotDeclared},
		{"intent declared, but another user deletes", declared, "worker-b", held(a), DeleteNotDeclared},
		{"intent declared, holder expired", declared, "worker-a", expired, DeleteNotDeclared},
		{"intent declared, nothing held", declared, "worker-a", Registry{Found: true, ResourceID: resourceID, Generation: 1, Now: now}, DeleteNotDeclared},
		{"intent declared under an older grant, same identity holds a new one", declared, "worker-a", held(a2), DeleteNotDeclared},
		{"intent declared under an older grant, another holder now", declared, "worker-b", held(b), DeleteNotDeclared},
		{"intent declared, policy changed since the grant", declared, "worker-a", policyMoved, DeleteNotDeclared},
		{"intent declared, registry shows no digest", declared, "worker-a", noDigest, DeleteNotDeclared},
		{"intent undone by a later segment", undone, "worker-a", held(a), DeleteNotDeclared},
		{"unreadable stored segment", unreadable, "worker-a", held(a), DeleteNotDeclared},
		{"no stored segment at all", floorOnly, "worker-a", held(a), DeleteNotDeclared},
		{"nothing ever written", State{}, "worker-a", held(a), DeleteNotDeclared},
		{"no registry entry", declared, "worker-a", Registry{Now: now}, WrongResource},
		{"the holder's fence is below the object's", declared, "worker-a", regressed, FenceRegression},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := cloneState(c.st)
			d := Decide(c.st, Attempt{User: c.user, Delete: true}, c.reg, w.bundle)
			if d.Verdict != c.want {
				t.Fatalf("verdict %s, want %s (%s)", d.Verdict, c.want, d.Message)
			}
			if !strings.HasPrefix(d.Message, string(c.want)+": ") {
				t.Fatalf("message %q does not start with the verdict", d.Message)
			}
			if !reflect.DeepEqual(d.State, before) || !reflect.DeepEqual(c.st, before) {
				t.Fatal("a delete decision changed the state")
			}
		})
	}
	if DeleteNotDeclared.Authentication() || ProtectionRemoved.Authentication() || DeleteNotDeclared.Allowed() {
		t.Fatal("DELETE_NOT_DECLARED and PROTECTION_REMOVED are neither authentication failures nor allowed")
	}
}

func TestIntentSegmentIsOrdinary(t *testing.T) {
	w := newWorld(t)
	a := w.grant("worker-a", 5, rootOf('a'))
	st := w.declare(w.write(State{}, a, 1, "a1"), a, 2, "a1")
	// Its receipt uses the unchanged formula; it round-trips through StateOf.
	if got := st.Receipts[1].Receipt; got != ReceiptDigest(resourceID, 5, a.OperationRoot, 2, "op-worker-a", payload("a1")) {
		t.Fatalf("receipt %s", got)
	}
	back, err := StateOf(st.Accepted, EncodeReceipts(st.Receipts))
	if err != nil || !reflect.DeepEqual(back, st) || !back.DeleteIntent {
		t.Fatalf("StateOf: %v %+v", err, back)
	}
	// The next segment continues as usual, and clears the intent.
	next := w.write(st, a, 3, "a3")
	if next.DeleteIntent || next.LastSegment != 3 {
		t.Fatalf("after the intent: %+v", next)
	}
}

// TestNextSegment: a write continues its own grant's segments and starts a new
// fence at 1, and what it computes is what Decide accepts next.
func TestNextSegment(t *testing.T) {
	w := newWorld(t)
	a := w.grant("worker-a", 5, rootOf('a'))
	if got := NextSegment(State{}, a); got != 1 {
		t.Fatalf("empty object: segment %d", got)
	}
	st := w.write(w.write(State{}, a, 1, "a1"), a, 2, "a2")
	if got := NextSegment(st, a); got != 3 {
		t.Fatalf("after two segments of a: %d", got)
	}
	w.write(st, a, NextSegment(st, a), "a3") // Decide accepts it (write fails the test otherwise)
	b := w.grant("worker-b", 6, rootOf('b'))
	if got := NextSegment(st, b); got != 1 {
		t.Fatalf("a newer fence: %d", got)
	}
	twin := a
	twin.Lease = "another lease" // same fence, another grant: the registry issued it twice
	if got := NextSegment(st, twin); got != 1 {
		t.Fatalf("another grant with the same fence: %d", got)
	}
}

// TestPodBoundGrant: a grant whose lease names a pod is its pod's alone.
// Another pod of the same identity, or the identity without a pod (kubectl
// as the ServiceAccount), gets WRONG_OWNER for writes, delete intents and
// deletes; the holder's pod is served.
func TestPodBoundGrant(t *testing.T) {
	w := newWorld(t)
	g := w.grant("system:serviceaccount:jobs:worker", 5, rootOf('a'))
	g.Lease = grant.PodLease("uid-a")
	write := func(st State, pod string, seg int64, v string) Decision {
		return Decide(st, Attempt{User: g.Owner, Pod: pod, Changed: true, Fence: w.envelope(g, seg, payload(v)), Payload: payload(v)}, held(g), w.bundle)
	}
	for _, pod := range []string{"uid-b", ""} {
		if d := write(State{}, pod, 1, "x"); d.Verdict != WrongOwner {
			t.Errorf("write from %s: %s, want WRONG_OWNER", grant.DescribePod(pod), d.Message)
		}
	}
	d := write(State{}, "uid-a", 1, "x")
	if d.Verdict != Accepted {
		t.Fatalf("write from the holder's pod: %s", d.Message)
	}
	// The holder declares a delete; only its pod may then delete.
	e := Envelope{Grant: g, Operation: "op-del", Segment: 2, Payload: payload("x"), Intent: IntentDelete}
	_, e.Proof, _ = w.signer.Sign(g)
	declared := Decide(d.State, Attempt{User: g.Owner, Pod: "uid-b", Changed: true, Fence: e.Encode(), Payload: payload("x")}, held(g), w.bundle)
	if declared.Verdict != WrongOwner {
		t.Errorf("delete intent from another pod: %s, want WRONG_OWNER", declared.Message)
	}
	declared = Decide(d.State, Attempt{User: g.Owner, Pod: "uid-a", Changed: true, Fence: e.Encode(), Payload: payload("x")}, held(g), w.bundle)
	if declared.Verdict != Accepted {
		t.Fatalf("delete intent from the holder's pod: %s", declared.Message)
	}
	for _, pod := range []string{"uid-b", ""} {
		if del := Decide(declared.State, Attempt{User: g.Owner, Pod: pod, Delete: true}, held(g), w.bundle); del.Verdict != WrongOwner {
			t.Errorf("delete from %s: %s, want WRONG_OWNER", grant.DescribePod(pod), del.Message)
		}
	}
	if del := Decide(declared.State, Attempt{User: g.Owner, Pod: "uid-a", Delete: true}, held(g), w.bundle); del.Verdict != Accepted {
		t.Errorf("delete from the holder's pod: %s", del.Message)
	}
}
