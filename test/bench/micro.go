package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

type microResult struct {
	Benchmarks []microBench `json:"benchmarks"`
}

type microBench struct {
	Name        string  `json:"name"`
	NsPerOp     float64 `json:"ns_per_op"`
	AllocsPerOp float64 `json:"allocs_per_op"`
	BytesPerOp  float64 `json:"bytes_per_op"`
}

// microFixture is a realistic acceptance input: a signed grant at fence 7,
// an object that already accepted 32 segments of it (a full receipt log),
// and the next segment's fenced write.
type microFixture struct {
	bundle  *grant.TrustBundle
	g       grant.Grant
	digest  string
	proof   string
	stored  fence.State
	attempt fence.Attempt
	reg     fence.Registry
	data    map[string]any
	fenceA  string
	rcptA   string
	// write is the same update as the webhook hands it to fence.DecideWrite.
	write fence.Write
	entry fence.Entry
}

func newMicroFixture() (*microFixture, error) {
	signer, err := grant.GenerateSigner(rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	g := grant.Grant{Schema: grant.Schema, Resource: "billing/invoice-batch-2026-07-19", Owner: "system:serviceaccount:billing:worker-7",
		RequestID: "3f2a9c0d1e4b5a6978c0d1e2", Lease: "lease-3f2a9c0d1e4b5a6978c0d1e2",
		OperationRoot: "sha256:" + strings.Repeat("ab", 32), FenceToken: 7, BackendRevision: "123456", PolicyGeneration: 1,
		IssuerEpoch: 3, TTLSeconds: 10, IssuedAt: now.UTC().Format(time.RFC3339Nano)}
	digest, proof, err := signer.Sign(g)
	if err != nil {
		return nil, err
	}
	f := &microFixture{bundle: grant.NewTrustBundle(0, signer), g: g, digest: digest, proof: proof,
		data: map[string]any{"data": map[string]any{"seq": "33", "payload": strings.Repeat("x", 512)}}}
	// 32 accepted segments: the stored annotations.
	ann := map[string]string{}
	for seg := int64(1); seg <= 32; seg++ {
		payload, _ := fence.PayloadDigest(map[string]any{"data": map[string]any{"seq": fmt.Sprint(seg)}})
		if _, err := fence.Stamp(ann, fence.Envelope{Grant: g, Proof: proof, Operation: "settle", Segment: seg, Payload: payload}); err != nil {
			return nil, err
		}
	}
	f.fenceA, f.rcptA = ann[fence.AnnotationFence], ann[fence.AnnotationReceipts]
	if f.stored, err = fence.StateOf(f.fenceA, f.rcptA); err != nil {
		return nil, err
	}
	payload, err := fence.PayloadDigest(f.data)
	if err != nil {
		return nil, err
	}
	next := fence.Envelope{Grant: g, Proof: proof, Operation: "settle", Segment: 33, Payload: payload}
	f.attempt = fence.Attempt{User: g.Owner, Changed: true, Fence: next.Encode(), Payload: payload}
	f.reg = fence.Registry{Found: true, ResourceID: g.Resource, Generation: 1, Now: now,
		Holder: &fence.Holder{Digest: digest, Owner: g.Owner, Lease: g.Lease, RequestID: g.RequestID, Fence: 7, ExpiresAt: now.Add(time.Hour)}}
	if d := fence.Decide(f.stored, f.attempt, f.reg, f.bundle); d.Verdict != fence.Accepted {
		return nil, fmt.Errorf("fixture is not accepted: %s", d.Message)
	}
	f.entry = fence.Entry{Name: "invoice-batch", ResourceID: g.Resource}
	marks := func(annotations map[string]string) *fence.Object {
		annotations[fence.AnnotationResource] = f.entry.Name
		return &fence.Object{Kind: "ConfigMap", Name: "invoice-batch", Labels: map[string]string{fence.LabelProtected: "true"}, Annotations: annotations}
	}
	written := maps.Clone(ann)
	if _, err := fence.Stamp(written, next); err != nil {
		return nil, err
	}
	f.write = fence.Write{Operation: fence.OpUpdate, User: g.Owner, Old: marks(ann), New: marks(written), Changed: true}
	f.write.New.Payload = payload
	if d, _ := fence.DecideWrite(f.write, f.entry, f.reg, fence.Trust{Grants: f.bundle, Stored: f.bundle}); d.Verdict != fence.Accepted {
		return nil, fmt.Errorf("fixture write is not accepted: %s", d.Message)
	}
	return f, nil
}

// signature is the fixture's public key and raw signature (the proof is
// ed25519:<keyID>:<base64 signature>).
func (f *microFixture) signature() (ed25519.PublicKey, []byte, error) {
	parts := strings.SplitN(f.proof, ":", 3)
	if len(parts) != 3 {
		return nil, nil, fmt.Errorf("proof %q", f.proof)
	}
	sig, err := base64.StdEncoding.DecodeString(parts[2])
	return f.bundle.Keys[parts[1]], sig, err
}

// micro runs the floor of the acceptance point as Go benchmarks: what the
// webhook computes per protected update, without any I/O.
func (r *report) micro() error {
	f, err := newMicroFixture()
	if err != nil {
		return err
	}
	benches := []struct {
		name string
		fn   func(b *testing.B)
	}{
		{"grant verification, first time (canonical digest + Ed25519)", f.benchVerifyFirst},
		{"grant verification, again (TrustBundle.Verify: digest + remembered signature)", f.benchVerifyAgain},
		{"fence.StateOf (parse stored fence + 32-receipt log)", f.benchStateOf},
		{"fence.PayloadDigest (ConfigMap content)", f.benchPayloadDigest},
		{"fence.Decide (accepting path, includes one Verify)", f.benchDecide},
		{"webhook floor: PayloadDigest + DecideWrite (StateOf, Verify(stored), Decide, receipt log)", f.benchWebhookFloor},
	}
	m := &microResult{}
	for _, bench := range benches {
		res := testing.Benchmark(bench.fn)
		if res.N == 0 {
			return fmt.Errorf("benchmark %q failed", bench.name)
		}
		m.Benchmarks = append(m.Benchmarks, microBench{Name: bench.name, NsPerOp: float64(res.NsPerOp()),
			AllocsPerOp: float64(res.AllocsPerOp()), BytesPerOp: float64(res.AllocedBytesPerOp())})
	}
	r.Micro = m
	return nil
}

func (f *microFixture) benchVerifyFirst(b *testing.B) {
	pub, sig, err := f.signature()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if !ed25519.Verify(pub, []byte(f.g.Digest()), sig) {
			b.Fatal("signature does not verify")
		}
	}
}

func (f *microFixture) benchVerifyAgain(b *testing.B) {
	for b.Loop() {
		if err := f.bundle.Verify(f.g, f.g.Digest(), f.proof); err != nil {
			b.Fatal(err)
		}
	}
}

func (f *microFixture) benchStateOf(b *testing.B) {
	for b.Loop() {
		if _, err := fence.StateOf(f.fenceA, f.rcptA); err != nil {
			b.Fatal(err)
		}
	}
}

func (f *microFixture) benchPayloadDigest(b *testing.B) {
	for b.Loop() {
		if _, err := fence.PayloadDigest(f.data); err != nil {
			b.Fatal(err)
		}
	}
}

func (f *microFixture) benchDecide(b *testing.B) {
	for b.Loop() {
		if d := fence.Decide(f.stored, f.attempt, f.reg, f.bundle); d.Verdict != fence.Accepted {
			b.Fatal(d.Message)
		}
	}
}

func (f *microFixture) benchWebhookFloor(b *testing.B) {
	for b.Loop() {
		_, _ = fence.PayloadDigest(f.data)
		if d, _ := fence.DecideWrite(f.write, f.entry, f.reg, fence.Trust{Grants: f.bundle, Stored: f.bundle}); d.Verdict != fence.Accepted {
			b.Fatal(d.Message)
		}
	}
}
