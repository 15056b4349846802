package fence_test

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// The seed corpora below run in every plain `go test`; `go test -fuzz=FuzzX`
// explores from them.

const fuzzResource = "invoice-batch/2026-07-19"

var (
	fuzzNow    = time.Date(2026, 7, 19, 10, 0, 0, 0, time.UTC)
	fuzzSigner = mustSigner("issuer", 1)
	fuzzForger = mustSigner("issuer", 2) // claims the issuer's key ID
)

func mustSigner(id string, b byte) *grant.Signer {
	s, err := grant.NewSigner(id, bytes.Repeat([]byte{b}, 32))
	if err != nil {
		panic(err)
	}
	return s
}

func fuzzRoot(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }

func fuzzGrant(owner string, fenceToken int64, root, lease string) grant.Grant {
	return grant.Grant{Schema: grant.Schema, Resource: fuzzResource, Owner: owner, RequestID: "req-" + lease, Lease: lease,
		OperationRoot: root, FenceToken: fenceToken, BackendRevision: "7", PolicyGeneration: 1, IssuerEpoch: 1,
		TTLSeconds: 10, IssuedAt: "2026-07-19T09:59:59Z"}
}

func fuzzPayload(v string) string {
	d, err := fence.PayloadDigest(map[string]any{"data": map[string]any{"v": v}})
	if err != nil {
		panic(err)
	}
	return d
}

func fuzzEnvelope(signer *grant.Signer, g grant.Grant, segment int64, payload string) fence.Envelope {
	_, proof, err := signer.Sign(g)
	if err != nil {
		panic(err)
	}
	return fence.Envelope{Grant: g, Proof: proof, Operation: "op-" + g.Lease, Segment: segment, Payload: payload}
}

// FuzzParseEnvelope: the fence annotation parser never panics, fails only
// with ErrBadEnvelope, returns only well-formed envelopes, and round-trips.
func FuzzParseEnvelope(f *testing.F) {
	e := fuzzEnvelope(fuzzSigner, fuzzGrant("alice", 3, fuzzRoot('a'), "lease-a"), 2, fuzzPayload("x"))
	enc := e.Encode()
	f.Add(enc)
	f.Add(strings.Replace(enc, `"segment":2`, `"segment":2.0`, 1))
	f.Add(strings.Replace(enc, `"segment":2`, `"segment":0`, 1))
	f.Add(strings.Replace(enc, `"segment":2`, `"segment":"2"`, 1))
	f.Add(strings.Replace(enc, `"segment":2`, `"segment":9223372036854775808`, 1))
	f.Add(strings.Replace(enc, `"fenceToken":3`, `"fenceToken":-3`, 1))
	f.Add(strings.Replace(enc, `{"grant":`, `{ "grant" : `, 1))
	f.Add(strings.Replace(enc, `"proof":`, `"extra":1,"proof":`, 1))
	f.Add(enc + "{}")
	f.Add(strings.Replace(enc, `"operation":"op-lease-a"`, `"operation":"`+strings.Repeat("o", 9000)+`"`, 1))
	f.Add(`{"grant":{},"proof":"","operation":"","segment":1,"payload":""}`)
	f.Add(`null`)
	f.Add(strings.Replace(enc, `"grant":`, `"Grant":`, 1))
	f.Add(strings.Replace(enc, `"proof":`, `"segment":3,"proof":`, 1))
	f.Add(strings.TrimSuffix(enc, "}") + `,"intent":"delete"}`)
	f.Add(strings.TrimSuffix(enc, "}") + `,"intent":"DELETE"}`)
	f.Add(strings.TrimSuffix(enc, "}") + `,"intent":""}`)
	f.Fuzz(func(t *testing.T, s string) {
		e, err := fence.ParseEnvelope(s)
		if err != nil {
			if !errors.Is(err, fence.ErrBadEnvelope) {
				t.Fatalf("ParseEnvelope error %v is not ErrBadEnvelope", err)
			}
			if _, err := fence.StateOf(s, ""); s != "" && err == nil {
				t.Fatal("StateOf accepted a fence annotation ParseEnvelope rejects")
			}
			return
		}
		if len(s) > fence.MaxFenceAnnotationBytes || e.Segment < 1 || e.Proof == "" || e.Operation == "" || !grant.IsDigest(e.Payload) ||
			(e.Intent != "" && e.Intent != fence.IntentDelete) {
			t.Fatalf("ParseEnvelope accepted a malformed envelope: %+v", e)
		}
		if err := e.Grant.Validate(); err != nil {
			t.Fatalf("ParseEnvelope accepted an invalid grant: %v", err)
		}
		enc := e.Encode()
		again, err := fence.ParseEnvelope(enc)
		if err != nil || again != e || again.Encode() != enc {
			t.Fatalf("the envelope does not round-trip: %v\n%s", err, enc)
		}
		st, err := fence.StateOf(s, "")
		if err != nil || st.HighestFence != e.Grant.FenceToken || st.Root != e.Grant.OperationRoot ||
			st.LastSegment != e.Segment || st.Accepted != s || st.GrantDigest != e.Grant.Digest() {
			t.Fatalf("StateOf disagrees with ParseEnvelope: %+v, %v", st, err)
		}
	})
}

// FuzzParseReceipts: the receipt log parser never panics, keeps the bound,
// and round-trips; AppendReceipt never changes the log it is given.
func FuzzParseReceipts(f *testing.F) {
	var log []fence.Receipt
	for i := range int64(33) {
		r := fence.Receipt{Fence: 3, Segment: i + 1, Operation: "op", Payload: fuzzPayload(fmt.Sprint(i))}
		r.Receipt = fence.ReceiptDigest(fuzzResource, r.Fence, fuzzRoot('a'), r.Segment, r.Operation, r.Payload)
		log = append(log, r)
	}
	f.Add(fence.EncodeReceipts(log[:1]))
	f.Add(fence.EncodeReceipts(log[:32]))
	f.Add(fence.EncodeReceipts(log)) // one too many
	f.Add(`[]`)
	f.Add(`null`)
	f.Add(`[{"fence":1,"segment":1,"operation":"o","payload":"p","receipt":"r","extra":0}]`)
	f.Add(`[{"fence":1e400}]`)
	f.Add(`{`)
	f.Add(strings.Replace(fence.EncodeReceipts(log[:2]), `"fence":`, `"FENCE":`, 1))
	f.Add(strings.Replace(fence.EncodeReceipts(log[:1]), `"segment":1`, `"segment":1,"segment":2`, 1))
	f.Add(fence.EncodeReceipts(log[:1]) + `[]`)
	f.Add(`[{"fence":1}]`)
	f.Fuzz(func(t *testing.T, s string) {
		rs, err := fence.ParseReceipts(s)
		if err != nil {
			return
		}
		if len(rs) > fence.MaxReceipts {
			t.Fatalf("ParseReceipts returned %d receipts", len(rs))
		}
		for _, r := range rs {
			if r.Fence < 1 || r.Segment < 1 {
				t.Fatalf("ParseReceipts accepted an entry without a positive fence and segment: %+v", r)
			}
		}
		again, err := fence.ParseReceipts(fence.EncodeReceipts(rs))
		if err != nil || len(again) != len(rs) || (len(rs) > 0 && !reflect.DeepEqual(again, rs)) {
			t.Fatalf("the receipt log does not round-trip: %v", err)
		}
		before := slices.Clone(rs)
		next := fence.Receipt{Fence: 9, Segment: 1, Operation: "next"}
		out := fence.AppendReceipt(rs, next)
		if !reflect.DeepEqual(rs, before) || len(out) > fence.MaxReceipts || out[len(out)-1] != next {
			t.Fatalf("AppendReceipt changed its input or broke the bound: %d receipts", len(out))
		}
	})
}

// Bits of FuzzDecide's flags: each one bends one input away from the
// happy path of "the current holder writes its next segment".
const (
	fzOtherOwner     = 1 << iota // the grant belongs to bob, not alice (the stored grant's owner)
	fzOtherRoot                  // another operation root
	fzOtherLease                 // another lease (so another grant at the same fence)
	fzOldPolicy                  // the grant is of policy generation 2, the registry is at 1
	fzRevoked                    // the trust bundle revokes epoch 1
	fzOtherPayload               // the envelope's payload is another content's
	fzContentDiffers             // the new content is not what the envelope digests
	fzForged                     // signed by another key under the issuer's key ID
	fzTampered                   // the fence changed after signing
	fzOtherUser                  // the request comes from mallory
	fzUnchanged                  // the update changes nothing
	fzDelete                     // a deletion
	fzRawAnnotation              // the fence annotation is the fuzzer's raw string
	fzNoEntry                    // no registry entry
	fzOtherResource              // the registry entry is another resource's
	fzOtherHolder                // the registry's holder is another grant (fence+1)
	fzNoHolder                   // nothing is held
	fzExpired                    // the holder's lease ended
	fzStoredIntent               // the stored last segment declares intent "delete"
	fzPodBound                   // the grant's lease binds it to pod "pod-a"
	fzOtherPod                   // the request comes from pod "pod-b" of the same identity
)

// FuzzDecide: the acceptance function never panics and never changes its
// inputs; a denial leaves the fence state exactly as it was; an acceptance
// obeys DESIGN.md's rules (re-checked here one by one) and moves the fence
// only up; and the state a client's Stamp writes is the state Decide computed.
func FuzzDecide(f *testing.F) {
	add := func(storedFence, storedSeg, fenceToken, segment int64, flags uint32) {
		f.Add(storedFence, storedSeg, fenceToken, segment, flags, "")
	}
	add(3, 2, 3, 3, 0)                          // next segment: accepted
	add(3, 2, 4, 1, fzOtherLease|fzOtherRoot)   // a new fence: accepted
	add(0, 1, 1, 1, 0)                          // the first write ever
	add(3, 2, 4, 2, fzOtherLease)               // a new fence must start at 1
	add(3, 2, 3, 5, 0)                          // a gap
	add(3, 3, 3, 2, 0)                          // a replay: ALREADY_APPLIED
	add(3, 3, 3, 2, fzOtherPayload)             // a replay with another payload: QUARANTINED
	add(3, 2, 2, 1, fzOtherLease)               // a current grant below the stored fence: FENCE_REGRESSION
	add(3, 2, 2, 1, fzOtherLease|fzOtherHolder) // a stale grant below: STALE_OWNER
	add(3, 2, 3, 1, fzOtherRoot|fzOtherLease)   // another grant at the same fence, current: FENCE_REGRESSION
	add(3, 2, 3, 1, fzOtherRoot|fzOtherHolder)  // ... not current: ROOT_MISMATCH
	add(3, 2, 3, 3, fzExpired)                  // NOT_HELD
	add(3, 2, 3, 3, fzNoHolder)                 // NOT_HELD
	add(3, 2, 3, 3, fzOldPolicy)                // POLICY_STALE
	add(3, 2, 3, 3, fzForged)                   // FORGED_GRANT
	add(3, 2, 3, 3, fzTampered)                 // FORGED_GRANT
	add(3, 2, 3, 3, fzOtherUser)                // WRONG_OWNER
	add(3, 2, 3, 3, fzRevoked)                  // REVOKED_EPOCH
	add(3, 2, 3, 3, fzContentDiffers)           // PAYLOAD_MISMATCH
	add(3, 2, 3, 3, fzOtherResource)            // WRONG_RESOURCE
	add(3, 2, 3, 3, fzNoEntry)                  // WRONG_RESOURCE
	add(3, 2, 3, 3, fzUnchanged)                // UNCHANGED
	add(3, 2, 3, 3, fzDelete)                   // a deletion by the holder
	add(3, 2, 3, 3, fzDelete|fzOtherUser)       // a deletion by someone else
	add(3, 2, 3, 3, fzDelete|fzStoredIntent)    // a declared deletion by the holder
	add(3, 2, 3, 3, fzDelete|fzStoredIntent|fzOtherUser)
	add(3, 2, 4, 1, fzDelete|fzStoredIntent|fzOtherLease) // declared under an older grant
	add(3, 2, 3, 3, fzDelete|fzStoredIntent|fzExpired)
	add(3, 2, 3, 3, fzStoredIntent)                                // the next segment after an intent
	add(3, 40, 3, 41, 0)                                           // a long operation: the log is trimmed to 32
	add(3, 2, 3, 3, fzPodBound)                                    // the holder's pod: accepted
	add(3, 2, 3, 3, fzPodBound|fzOtherPod)                         // another pod of its identity: WRONG_OWNER
	add(3, 2, 3, 3, fzDelete|fzStoredIntent|fzPodBound|fzOtherPod) // a declared delete from another pod
	f.Add(int64(3), int64(2), int64(3), int64(3), uint32(fzRawAnnotation), `{"grant":{}}`)
	f.Add(int64(3), int64(2), int64(3), int64(3), uint32(fzRawAnnotation), "")
	f.Fuzz(func(t *testing.T, storedFence, storedSeg, fenceToken, segment int64, flags uint32, raw string) {
		has := func(bit uint32) bool { return flags&bit != 0 }
		storedFence, storedSeg = clamp(storedFence, 0, 20), clamp(storedSeg, 1, 40)
		fenceToken, segment = clamp(fenceToken, 1, 22), clamp(segment, 1, 42)

		// The stored object: alice's grant at storedFence, segments 1..storedSeg applied.
		ann := map[string]string{"unrelated": "kept"}
		stored := fuzzGrant("alice", storedFence, fuzzRoot('a'), "lease-a")
		if storedFence > 0 {
			var log []fence.Receipt
			for s := int64(1); s <= storedSeg; s++ {
				op, payload := "op-"+stored.Lease, fuzzPayload(fmt.Sprint(s))
				log = fence.AppendReceipt(log, fence.Receipt{Fence: storedFence, Segment: s, Operation: op, Payload: payload,
					Receipt: fence.ReceiptDigest(fuzzResource, storedFence, stored.OperationRoot, s, op, payload)})
			}
			last := fuzzEnvelope(fuzzSigner, stored, storedSeg, fuzzPayload(fmt.Sprint(storedSeg)))
			if flags&fzStoredIntent != 0 {
				last.Intent = fence.IntentDelete
			}
			ann[fence.AnnotationFence], ann[fence.AnnotationReceipts] = last.Encode(), fence.EncodeReceipts(log)
		}
		st, err := fence.StateOf(ann[fence.AnnotationFence], ann[fence.AnnotationReceipts])
		if err != nil {
			t.Fatalf("StateOf of a genuine stored object: %v", err)
		}

		// The attempt.
		owner, root, lease := "alice", fuzzRoot('a'), "lease-a"
		if has(fzOtherOwner) {
			owner = "bob"
		}
		if has(fzOtherRoot) {
			root = fuzzRoot('b')
		}
		if has(fzOtherLease) {
			lease = "lease-b"
		}
		if has(fzPodBound) {
			lease = grant.PodLease("pod-a")
		}
		g := fuzzGrant(owner, fenceToken, root, lease)
		if has(fzOldPolicy) {
			g.PolicyGeneration = 2
		}
		signer := fuzzSigner
		if has(fzForged) {
			signer = fuzzForger
		}
		payload := fuzzPayload(fmt.Sprint(segment))
		if has(fzOtherPayload) {
			payload = fuzzPayload("other")
		}
		env := fuzzEnvelope(signer, g, segment, payload)
		if has(fzTampered) {
			env.Grant.FenceToken++
		}
		written := maps.Clone(ann)
		if _, err := fence.Stamp(written, env); err != nil {
			t.Fatalf("Stamp: %v", err)
		}
		stampedKeys := func(k string) bool { return k == fence.AnnotationFence || k == fence.AnnotationReceipts }
		for k := range mergeKeys(ann, written) {
			if !stampedKeys(k) && ann[k] != written[k] {
				t.Fatalf("Stamp changed annotation %q", k)
			}
		}
		a := fence.Attempt{User: owner, Changed: !has(fzUnchanged), Delete: has(fzDelete), Fence: written[fence.AnnotationFence], Payload: payload}
		if has(fzOtherUser) {
			a.User = "mallory"
		}
		a.Pod = "pod-a"
		if has(fzOtherPod) {
			a.Pod = "pod-b"
		}
		if has(fzContentDiffers) {
			a.Payload = fuzzPayload("what was really written")
		}
		if has(fzRawAnnotation) {
			a.Fence = raw
		}

		// The registry and the trust bundle.
		reg := fence.Registry{Found: !has(fzNoEntry), ResourceID: fuzzResource, Generation: 1, Now: fuzzNow}
		if has(fzOtherResource) {
			reg.ResourceID = "invoice-batch/2026-07-20"
		}
		holder := g
		if has(fzOtherHolder) {
			holder = fuzzGrant("carol", fenceToken+1, fuzzRoot('c'), "lease-c")
		}
		if !has(fzNoHolder) {
			reg.Holder = &fence.Holder{Digest: holder.Digest(), Owner: holder.Owner, Lease: holder.Lease, RequestID: holder.RequestID,
				Fence: holder.FenceToken, ExpiresAt: fuzzNow.Add(5 * time.Second)}
			if has(fzExpired) {
				reg.Holder.ExpiresAt = fuzzNow.Add(-time.Millisecond)
			}
		}
		bundle := grant.NewTrustBundle(0, fuzzSigner)
		if has(fzRevoked) {
			bundle.RevokedBelowEpoch = 2
		}

		stBefore, regBefore, keysBefore := copyState(st), copyRegistry(reg), maps.Clone(bundle.Keys)
		d := fence.Decide(st, a, reg, bundle)
		if !reflect.DeepEqual(st, stBefore) || !reflect.DeepEqual(reg, regBefore) || !maps.EqualFunc(bundle.Keys, keysBefore, func(x, y ed25519.PublicKey) bool { return bytes.Equal(x, y) }) {
			t.Fatal("Decide changed one of its inputs")
		}
		if !strings.HasPrefix(d.Message, string(d.Verdict)) {
			t.Fatalf("the message %q does not start with the verdict %s", d.Message, d.Verdict)
		}
		if d.Verdict != fence.Accepted || a.Delete {
			if !reflect.DeepEqual(d.State, st) {
				t.Fatalf("verdict %s changed the fence state:\n before %+v\n after  %+v", d.Verdict, st, d.State)
			}
			if d.Verdict == fence.Accepted && (reg.Holder == nil || a.User != reg.Holder.Owner || !grant.LeaseAdmits(reg.Holder.Lease, a.Pod) ||
				reg.Holder.Fence < st.HighestFence || !fuzzNow.Before(reg.Holder.ExpiresAt)) {
				t.Fatalf("a deletion was accepted from %s without the current holder's grant", a.User)
			}
			if d.Verdict == fence.Accepted && (!st.DeleteIntent || st.GrantDigest != reg.Holder.Digest || stored.PolicyGeneration != reg.Generation) {
				t.Fatalf("a deletion was accepted that the current grant did not declare: %+v", st)
			}
			return
		}

		// An acceptance, checked rule by rule.
		e, err := fence.ParseEnvelope(a.Fence)
		if err != nil {
			t.Fatalf("accepted an unparsable annotation: %v", err)
		}
		ag := e.Grant
		switch {
		case a.Fence == ann[fence.AnnotationFence]:
			t.Fatal("accepted the stored annotation again")
		case bundle.Verify(ag, ag.Digest(), e.Proof) != nil:
			t.Fatal("accepted a grant that does not verify")
		case !reg.Found || ag.Resource != reg.ResourceID:
			t.Fatal("accepted another resource's grant")
		case a.User != ag.Owner:
			t.Fatal("accepted a grant from someone else")
		case !grant.LeaseAdmits(ag.Lease, a.Pod):
			t.Fatal("accepted a pod-bound grant from another pod")
		case bundle.Revoked(ag.IssuerEpoch):
			t.Fatal("accepted a revoked epoch")
		case e.Payload != a.Payload:
			t.Fatal("accepted a payload mismatch")
		case reg.Holder == nil || reg.Holder.Digest != ag.Digest() || !fuzzNow.Before(reg.Holder.ExpiresAt) || ag.PolicyGeneration != reg.Generation:
			t.Fatal("accepted a grant that is not the registry's current one")
		case ag.FenceToken < st.HighestFence:
			t.Fatalf("accepted fence %d below the stored %d", ag.FenceToken, st.HighestFence)
		case ag.FenceToken > st.HighestFence && e.Segment != 1:
			t.Fatalf("a new fence started at segment %d", e.Segment)
		case ag.FenceToken == st.HighestFence && (ag.OperationRoot != st.Root || e.Segment != st.LastSegment+1 ||
			(st.GrantDigest != "" && st.GrantDigest != ag.Digest())):
			t.Fatalf("accepted segment %d of fence %d after segment %d (another grant or root: %t)", e.Segment, ag.FenceToken,
				st.LastSegment, ag.OperationRoot != st.Root)
		case d.State.HighestFence != ag.FenceToken || d.State.HighestFence < st.HighestFence || d.State.Accepted != a.Fence:
			t.Fatalf("the new state %+v does not record the accepted segment", d.State)
		}
		want := fence.AppendReceipt(st.Receipts, fence.Receipt{Fence: ag.FenceToken, Segment: e.Segment, Operation: e.Operation, Payload: e.Payload,
			Receipt: fence.ReceiptDigest(fuzzResource, ag.FenceToken, ag.OperationRoot, e.Segment, e.Operation, e.Payload)})
		if !reflect.DeepEqual(d.State.Receipts, want) || d.Receipt != want[len(want)-1].Receipt {
			t.Fatal("the new receipt log is not the stored log plus this segment")
		}
		if !has(fzRawAnnotation) {
			// What the client stamped is what the acceptance point computed.
			if got, err := fence.StateOf(written[fence.AnnotationFence], written[fence.AnnotationReceipts]); err != nil || !reflect.DeepEqual(got, d.State) {
				t.Fatalf("Stamp and Decide disagree on the new state: %v\n stamp  %+v\n decide %+v", err, got, d.State)
			}
		}
	})
}

func clamp(v, lo, hi int64) int64 {
	if v < 0 {
		v = -(v + 1) // no overflow at math.MinInt64
	}
	return lo + v%(hi-lo+1)
}

func mergeKeys(a, b map[string]string) map[string]bool {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	return keys
}

func copyState(st fence.State) fence.State {
	st.Receipts = slices.Clone(st.Receipts)
	return st
}

func copyRegistry(r fence.Registry) fence.Registry {
	if r.Holder != nil {
		h := *r.Holder
		r.Holder = &h
	}
	return r
}
