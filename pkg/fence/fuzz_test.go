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
	fzDropLabel                  // the write drops the protected label
	fzNeverMarked                // the stored object never carried the entry's annotation, nor does the write
	fzBadReceipts                // the write's receipt log is not the stored log plus this segment
	fzStatus                     // a write of the status subresource
	fzScale                      // a write of the scale subresource
)

// decideSeeds are FuzzDecide's seed corpus, each with the verdict it must
// get; together they reach every verdict (TestDecideSeeds).
var decideSeeds = []struct {
	storedFence, storedSeg, fenceToken, segment int64
	flags                                       uint32
	raw                                         string
	want                                        fence.Verdict
	what                                        string
}{
	{3, 2, 3, 3, 0, "", fence.Accepted, "the next segment"},
	{3, 2, 4, 1, fzOtherLease | fzOtherRoot, "", fence.Accepted, "a new fence"},
	{0, 1, 1, 1, 0, "", fence.Accepted, "the first write ever"},
	{3, 2, 4, 2, fzOtherLease, "", fence.SegmentOutOfOrder, "a new fence must start at 1"},
	{3, 2, 3, 5, 0, "", fence.SegmentOutOfOrder, "a gap"},
	{3, 3, 3, 2, 0, "", fence.AlreadyApplied, "a replay"},
	{3, 3, 3, 2, fzOtherPayload, "", fence.Quarantined, "a replay with another payload"},
	{3, 2, 2, 1, fzOtherLease, "", fence.FenceRegression, "a current grant below the stored fence"},
	{3, 2, 2, 1, fzOtherLease | fzOtherHolder, "", fence.StaleOwner, "a stale grant below"},
	{3, 2, 3, 1, fzOtherRoot | fzOtherLease, "", fence.FenceRegression, "another grant at the same fence, current"},
	{3, 2, 3, 1, fzOtherRoot | fzOtherHolder, "", fence.RootMismatch, "another grant at the same fence, not current"},
	{3, 2, 3, 3, fzExpired, "", fence.NotHeld, "the lease ended"},
	{3, 2, 3, 3, fzNoHolder, "", fence.NotHeld, "nothing held"},
	{3, 2, 3, 3, fzOldPolicy, "", fence.PolicyStale, "an older policy generation"},
	{3, 2, 3, 3, fzForged, "", fence.ForgedGrant, "another key under the issuer's key ID"},
	{3, 2, 3, 3, fzTampered, "", fence.ForgedGrant, "the fence changed after signing"},
	{3, 2, 3, 3, fzOtherUser, "", fence.WrongOwner, "someone else's grant"},
	{3, 2, 3, 3, fzRevoked, "", fence.RevokedEpoch, "a revoked epoch"},
	{3, 2, 3, 3, fzContentDiffers, "", fence.PayloadMismatch, "content the envelope does not digest"},
	{3, 2, 3, 3, fzOtherResource, "", fence.WrongResource, "another resource's entry"},
	{3, 2, 3, 3, fzNoEntry, "", fence.WrongResource, "no entry"},
	{3, 2, 3, 3, fzUnchanged, "", fence.Unchanged, "an update that changes nothing"},
	{3, 2, 3, 3, fzDelete, "", fence.DeleteNotDeclared, "a deletion by the holder, not declared"},
	{3, 2, 3, 3, fzDelete | fzOtherUser, "", fence.DeleteNotDeclared, "a deletion by someone else"},
	{3, 2, 3, 3, fzDelete | fzStoredIntent, "", fence.Accepted, "a declared deletion by the holder"},
	{3, 2, 3, 3, fzDelete | fzStoredIntent | fzOtherUser, "", fence.DeleteNotDeclared, "a declared deletion by someone else"},
	{3, 2, 4, 1, fzDelete | fzStoredIntent | fzOtherLease, "", fence.DeleteNotDeclared, "declared under an older grant"},
	{3, 2, 3, 3, fzDelete | fzStoredIntent | fzExpired, "", fence.DeleteNotDeclared, "declared, the lease ended"},
	{3, 2, 3, 3, fzStoredIntent, "", fence.Accepted, "the next segment after an intent"},
	{3, 40, 3, 41, 0, "", fence.Accepted, "a long operation: the log is trimmed to 32"},
	{3, 2, 4, 1, fzPodBound, "", fence.Accepted, "the holder's pod"},
	{3, 2, 4, 1, fzPodBound | fzOtherPod, "", fence.WrongOwner, "another pod of its identity"},
	{3, 2, 3, 3, fzDelete | fzStoredIntent | fzPodBound | fzOtherPod, "", fence.WrongOwner, "a declared delete from another pod"},
	{3, 2, 3, 3, fzDropLabel, "", fence.ProtectionRemoved, "the label dropped under the current grant"},
	{3, 2, 3, 3, fzDropLabel | fzOtherUser, "", fence.ProtectionRemoved, "the label dropped by someone else"},
	{3, 2, 3, 3, fzNeverMarked, "", fence.ProtectionRemoved, "a fenced write must add the marks"},
	{3, 2, 3, 3, fzBadReceipts, "", fence.ReceiptLogMismatch, "the receipt log rewritten"},
	{3, 2, 3, 3, fzStatus, "", fence.FenceRequired, "a status write that changes a mark"},
	{3, 2, 3, 3, fzStatus | fzUnchanged, "", fence.Unchanged, "a status write that changes none"},
	{3, 2, 3, 3, fzStatus | fzDropLabel, "", fence.ProtectionRemoved, "a status write that drops the label"},
	{3, 2, 3, 3, fzScale, "", fence.FenceRequired, "a scale write"},
	{3, 2, 3, 3, fzRawAnnotation, `{"grant":{}}`, fence.BadGrant, "a malformed fence annotation"},
	{3, 2, 3, 3, fzRawAnnotation, "", fence.FenceRequired, "no fence annotation"},
}

// FuzzDecide: the acceptance function (DecideWrite, and Decide within it)
// never panics and never changes its inputs; a denial leaves the fence state
// exactly as it was; an acceptance obeys the contract's rules (re-checked
// here one by one) and moves the fence only up; and the state a client's
// Stamp writes is the state the acceptance point computed.
func FuzzDecide(f *testing.F) {
	for _, c := range decideSeeds {
		f.Add(c.storedFence, c.storedSeg, c.fenceToken, c.segment, c.flags, c.raw)
	}
	f.Fuzz(func(t *testing.T, storedFence, storedSeg, fenceToken, segment int64, flags uint32, raw string) {
		checkDecide(t, storedFence, storedSeg, fenceToken, segment, flags, raw)
	})
}

// TestDecideSeeds: each seed gets its verdict, and the seeds reach every verdict.
func TestDecideSeeds(t *testing.T) {
	reached := map[fence.Verdict]bool{}
	for _, c := range decideSeeds {
		t.Run(c.what, func(t *testing.T) {
			d := checkDecide(t, c.storedFence, c.storedSeg, c.fenceToken, c.segment, c.flags, c.raw)
			if d.Verdict != c.want {
				t.Fatalf("%s: %s", c.want, d.Message)
			}
			reached[d.Verdict] = true
		})
	}
	for _, v := range []fence.Verdict{fence.Accepted, fence.Unchanged, fence.FenceRequired, fence.BadGrant, fence.ForgedGrant,
		fence.WrongResource, fence.WrongOwner, fence.RevokedEpoch, fence.PayloadMismatch, fence.FenceRegression, fence.StaleOwner,
		fence.RootMismatch, fence.NotHeld, fence.PolicyStale, fence.SegmentOutOfOrder, fence.AlreadyApplied, fence.Quarantined,
		fence.ReceiptLogMismatch, fence.DeleteNotDeclared, fence.ProtectionRemoved} {
		if !reached[v] {
			t.Errorf("no seed reaches %s", v)
		}
	}
}

// checkDecide decides the write the arguments describe (see the fz flags)
// and checks every property FuzzDecide promises; it returns the decision.
func checkDecide(t *testing.T, storedFence, storedSeg, fenceToken, segment int64, flags uint32, raw string) fence.Decision {
	t.Helper()
	storedFence, storedSeg = clamp(storedFence, 0, 20), clamp(storedSeg, 1, 40)
	fenceToken, segment = clamp(fenceToken, 1, 22), clamp(segment, 1, 42)

	ann, stored := fuzzStored(storedFence, storedSeg, flags)
	genuine, err := fence.StateOf(ann[fence.AnnotationFence], ann[fence.AnnotationReceipts])
	if err != nil {
		t.Fatalf("StateOf of a genuine stored object: %v", err)
	}
	g := fuzzAttemptGrant(fenceToken, flags)
	env := fuzzAttemptEnvelope(g, segment, flags)
	written := stampChecked(t, ann, env)
	a := fuzzAttempt(g.Owner, written, env.Payload, flags, raw)
	reg, bundle := fuzzRegistry(g, fenceToken, flags)

	w := fuzzWrite(flags, a, ann, written)
	d, st := decideKeepingInputs(t, w, reg, bundle)
	if !strings.HasPrefix(d.Message, string(d.Verdict)) {
		t.Fatalf("the message %q does not start with the verdict %s", d.Message, d.Verdict)
	}
	if reg.ResourceID == fuzzResource && w.Subresource != "scale" && !reflect.DeepEqual(st, genuine) {
		t.Fatalf("the stored state of the entry's own verified grant was not trusted: %+v", st)
	}
	checkMarks(t, w, d)
	if d.Verdict != fence.Accepted || a.Delete {
		checkStateKept(t, d, st, a, reg, stored)
		return d
	}

	// An acceptance, checked rule by rule.
	e, err := fence.ParseEnvelope(a.Fence)
	if err != nil {
		t.Fatalf("accepted an unparsable annotation: %v", err)
	}
	checkAcceptedGrant(t, e, a, ann, reg, bundle)
	checkAcceptedSegment(t, e, a, st, d)
	checkReceiptLog(t, e, st, w, d)
	if flags&fzRawAnnotation == 0 {
		// What the client stamped is what the acceptance point computed.
		if got, err := fence.StateOf(written[fence.AnnotationFence], written[fence.AnnotationReceipts]); err != nil || !reflect.DeepEqual(got, d.State) {
			t.Fatalf("Stamp and Decide disagree on the new state: %v\n stamp  %+v\n decide %+v", err, got, d.State)
		}
	}
	return d
}

// fuzzStored is the stored object's annotations, alice's grant at
// storedFence with segments 1..storedSeg applied, and that grant.
func fuzzStored(storedFence, storedSeg int64, flags uint32) (map[string]string, grant.Grant) {
	ann := map[string]string{"unrelated": "kept", fence.AnnotationResource: "inv"}
	if flags&fzNeverMarked != 0 {
		delete(ann, fence.AnnotationResource)
	}
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
	return ann, stored
}

// fuzzAttemptGrant is the attempt's grant at fenceToken: alice's, of the
// stored operation root and lease, unless the flags bend its owner, root,
// lease or policy generation.
func fuzzAttemptGrant(fenceToken int64, flags uint32) grant.Grant {
	has := func(bit uint32) bool { return flags&bit != 0 }
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
	return g
}

// fuzzAttemptEnvelope is the envelope of segment under g: the issuer's
// signature and the segment's payload, unless the flags forge the
// signature, change the payload or tamper with the fence after signing.
func fuzzAttemptEnvelope(g grant.Grant, segment int64, flags uint32) fence.Envelope {
	has := func(bit uint32) bool { return flags&bit != 0 }
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
	return env
}

// stampChecked is ann stamped with env, as a client writes it; it checks
// Stamp changed no annotation but its own.
func stampChecked(t *testing.T, ann map[string]string, env fence.Envelope) map[string]string {
	t.Helper()
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
	return written
}

// fuzzAttempt is the request: owner, from pod-a, writes the stamped
// annotation and payload, unless the flags change the user, the pod, the
// content or the annotation (to raw).
func fuzzAttempt(owner string, written map[string]string, payload string, flags uint32, raw string) fence.Attempt {
	has := func(bit uint32) bool { return flags&bit != 0 }
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
	return a
}

// fuzzRegistry is the registry and the trust bundle: the entry of
// fuzzResource, held by g for 5 more seconds, and the issuer's key, unless
// the flags bend the entry, the holder or the revoked epochs.
func fuzzRegistry(g grant.Grant, fenceToken int64, flags uint32) (fence.Registry, *grant.TrustBundle) {
	has := func(bit uint32) bool { return flags&bit != 0 }
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
	return reg, bundle
}

// decideKeepingInputs decides w and checks DecideWrite changed none of its
// inputs; it returns the decision and the stored fence state.
func decideKeepingInputs(t *testing.T, w fence.Write, reg fence.Registry, bundle *grant.TrustBundle) (fence.Decision, fence.State) {
	t.Helper()
	wBefore, regBefore, keysBefore := copyWrite(w), copyRegistry(reg), maps.Clone(bundle.Keys)
	d, st := fence.DecideWrite(w, fence.Entry{Name: "inv", ResourceID: reg.ResourceID}, reg, fence.Trust{Grants: bundle, Stored: bundle})
	if !reflect.DeepEqual(w, wBefore) || !reflect.DeepEqual(reg, regBefore) || !maps.EqualFunc(bundle.Keys, keysBefore, func(x, y ed25519.PublicKey) bool { return bytes.Equal(x, y) }) {
		t.Fatal("DecideWrite changed one of its inputs")
	}
	return d, st
}

// checkStateKept checks a denial or a deletion left the fence state st as it
// was, and that a deletion was accepted only from the current holder, whose
// grant declared it.
func checkStateKept(t *testing.T, d fence.Decision, st fence.State, a fence.Attempt, reg fence.Registry, stored grant.Grant) {
	t.Helper()
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
}

// checkAcceptedGrant checks whose grant was accepted: a new annotation,
// verified, of the entry's resource, from its owner (and pod), of a live
// epoch, for the written payload, and the registry's current grant.
func checkAcceptedGrant(t *testing.T, e fence.Envelope, a fence.Attempt, ann map[string]string, reg fence.Registry, bundle *grant.TrustBundle) {
	t.Helper()
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
	}
}

// checkAcceptedSegment checks where the accepted segment falls: never below
// the stored fence, a new fence starting at segment 1, the stored fence
// continued by the next segment of its operation; and that the new state
// records it.
func checkAcceptedSegment(t *testing.T, e fence.Envelope, a fence.Attempt, st fence.State, d fence.Decision) {
	t.Helper()
	ag := e.Grant
	switch {
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
}

// checkReceiptLog checks the accepted segment's receipt log, the decision's
// and the written one, is the stored log plus this segment.
func checkReceiptLog(t *testing.T, e fence.Envelope, st fence.State, w fence.Write, d fence.Decision) {
	t.Helper()
	ag := e.Grant
	want := fence.AppendReceipt(st.Receipts, fence.Receipt{Fence: ag.FenceToken, Segment: e.Segment, Operation: e.Operation, Payload: e.Payload,
		Receipt: fence.ReceiptDigest(fuzzResource, ag.FenceToken, ag.OperationRoot, e.Segment, e.Operation, e.Payload)})
	if !reflect.DeepEqual(d.State.Receipts, want) || d.Receipt != want[len(want)-1].Receipt {
		t.Fatal("the new receipt log is not the stored log plus this segment")
	}
	if got, err := fence.ParseReceipts(w.New.Annotations[fence.AnnotationReceipts]); err != nil || !slices.Equal(got, want) {
		t.Fatalf("accepted a write whose receipt log is not the stored log plus this segment: %v", err)
	}
}

// fuzzWrite is the write FuzzDecide's flags describe: an update of the
// object itself (a delete, a status or a scale write by flag) from a's user
// and pod, the stored object holding ann and the written one written.
func fuzzWrite(flags uint32, a fence.Attempt, ann, written map[string]string) fence.Write {
	has := func(bit uint32) bool { return flags&bit != 0 }
	obj := func(annotations map[string]string) *fence.Object {
		return &fence.Object{Kind: "ConfigMap", Name: "inv", Labels: map[string]string{fence.LabelProtected: "true"}, Annotations: annotations}
	}
	w := fence.Write{Operation: fence.OpUpdate, User: a.User, Pod: a.Pod, Old: obj(ann), Changed: a.Changed}
	if a.Delete {
		w.Operation = fence.OpDelete
		return w
	}
	w.New = obj(maps.Clone(written))
	w.New.Annotations[fence.AnnotationFence], w.New.Payload = a.Fence, a.Payload
	switch {
	case has(fzStatus) && has(fzUnchanged):
		w.New.Annotations = maps.Clone(ann)
	case has(fzScale):
		w.Old, w.New = &fence.Object{Kind: "Scale", Name: "inv"}, &fence.Object{Kind: "Scale", Name: "inv"}
	}
	w.Subresource = map[bool]string{true: fence.SubresourceStatus}[has(fzStatus)]
	if has(fzScale) {
		w.Subresource = "scale"
	}
	if has(fzDropLabel) {
		delete(w.New.Labels, fence.LabelProtected)
	}
	if has(fzBadReceipts) {
		w.New.Annotations[fence.AnnotationReceipts] = "[]"
	}
	return w
}

// checkMarks checks the verdicts that depend on the object's marks and
// subresource: only a write of the object itself is ever accepted, with the
// marks in place; dropping them is refused first, whoever asks.
func checkMarks(t *testing.T, w fence.Write, d fence.Decision) {
	t.Helper()
	switch {
	case w.Subresource == "scale" && d.Verdict != fence.FenceRequired:
		t.Fatalf("a scale write got %s", d.Verdict)
	case w.Subresource != "" && d.Verdict == fence.Accepted:
		t.Fatalf("a write of the %s subresource was accepted", w.Subresource)
	case d.Verdict == fence.Accepted && w.New != nil && !marked(w.New):
		t.Fatal("accepted a write that leaves the target without its marks")
	case dropsMarks(w) && d.Verdict != fence.ProtectionRemoved:
		t.Fatalf("a write dropping the marks got %s, not PROTECTION_REMOVED", d.Verdict)
	}
}

func marked(o *fence.Object) bool {
	return o.Labels[fence.LabelProtected] == "true" && o.Annotations[fence.AnnotationResource] == "inv"
}

// dropsMarks: a change of the object (or its status) that drops marks it had.
func dropsMarks(w fence.Write) bool {
	return w.New != nil && w.Subresource != "scale" && marked(w.Old) && !marked(w.New) && (w.Changed || w.Subresource != "")
}

func copyWrite(w fence.Write) fence.Write {
	c := func(o *fence.Object) *fence.Object {
		if o == nil {
			return nil
		}
		x := *o
		x.Labels, x.Annotations = maps.Clone(o.Labels), maps.Clone(o.Annotations)
		return &x
	}
	w.Old, w.New = c(w.Old), c(w.New)
	return w
}

// clamp keeps v in [lo, hi]: a value there is kept (so a seed means what it
// says), any other is folded in.
func clamp(v, lo, hi int64) int64 {
	if v >= lo && v <= hi {
		return v
	}
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

func copyRegistry(r fence.Registry) fence.Registry {
	if r.Holder != nil {
		h := *r.Holder
		r.Holder = &h
	}
	return r
}
