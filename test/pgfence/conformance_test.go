package pgfence_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

const resourceID = "billing/invoices"

var now = time.Now().UTC().Truncate(time.Second)

const hour = time.Hour

// world signs grants with the issuer's key; rogue is a key nobody trusts.
type world struct {
	t             *testing.T
	issuer, rogue *grant.Signer
	bundle        *grant.TrustBundle
}

func newWorld(t *testing.T) *world {
	issuer, err := grant.NewSigner("issuer", bytes.Repeat([]byte{1}, 32))
	if err != nil {
		t.Fatal(err)
	}
	rogue, _ := grant.NewSigner("issuer", bytes.Repeat([]byte{2}, 32))
	return &world{t: t, issuer: issuer, rogue: rogue, bundle: grant.NewTrustBundle(0, issuer)}
}

func rootOf(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }

func payloadOf(v string) string {
	d, _ := fence.PayloadDigest(map[string]any{"amount": v})
	return d
}

func grantOf(owner string, f int64, root string) grant.Grant {
	return grant.Grant{Schema: grant.Schema, Resource: resourceID, Owner: owner, RequestID: "req-" + owner,
		Lease: "lease-" + owner, OperationRoot: root, FenceToken: f, BackendRevision: "7",
		PolicyGeneration: 1, IssuerEpoch: 1, TTLSeconds: 10, IssuedAt: "2026-07-19T09:59:59Z"}
}

func (w *world) envelope(s *grant.Signer, g grant.Grant, segment int64, value string) fence.Envelope {
	_, proof, err := s.Sign(g)
	if err != nil {
		w.t.Fatal(err)
	}
	return fence.Envelope{Grant: g, Proof: proof, Operation: "op-" + g.Owner, Segment: segment, Payload: payloadOf(value)}
}

// A conformance case is one attempt against a stored fence state and a
// registry. The same case runs through fence.Decide and through
// fencekeeper.begin_segment; both must give the verdict the case names.
//
// What a database cannot judge is held equal on both sides: the attempt
// comes from the grant's owner and pod, and its payload is the envelope's
// (the store cannot compute the digest of the change; the client states it).
type conformanceCase struct {
	name string
	// accepted: the segments the resource accepted, in order (none: a fresh resource).
	accepted []fence.Envelope
	// keep: how many of the newest receipts the log keeps (0: all).
	keep int
	// holder: the registry's current grant (nil: none), and whether it expired.
	holder  *grant.Grant
	expired bool
	// issued: every grant the registry issued (published to the store); a
	// forged grant is signed by the rogue key and never published.
	issued       []grant.Grant
	generation   int64
	revokedBelow int64
	// unregistered: the resource is not registered (no FencedResource names the store).
	unregistered bool
	attempt      string // the envelope as sent; raw so that malformed ones can be tried
	want         fence.Verdict
}

func (w *world) cases() []conformanceCase {
	a := grantOf("worker-a", 5, rootOf('a'))
	b := grantOf("worker-b", 6, rootOf('b'))
	a2 := grantOf("worker-a2", 5, rootOf('c')) // fence 5 again: the registry went backwards
	c := grantOf("worker-c", 7, rootOf('d'))
	stale := grantOf("worker-a", 5, rootOf('a'))
	stale.PolicyGeneration = 0
	other := a
	other.Resource = "billing/elsewhere"
	forged := grantOf("mallory", 9, rootOf('e'))
	a1, a2s := w.envelope(w.issuer, a, 1, "a1"), w.envelope(w.issuer, a, 2, "a2")
	b1 := w.envelope(w.issuer, b, 1, "b1")
	enc := func(e fence.Envelope) string { return e.Encode() }
	seg := func(g grant.Grant, s int64, v string) string { return enc(w.envelope(w.issuer, g, s, v)) }
	issued := []grant.Grant{a, b, a2, c}
	base := []fence.Envelope{a1, a2s}
	return []conformanceCase{
		{name: "the holder's next segment", accepted: base, holder: &a, issued: issued, attempt: seg(a, 3, "a3"), want: fence.Accepted},
		{name: "a new fence's first segment", accepted: base, holder: &b, issued: issued, attempt: enc(b1), want: fence.Accepted},
		{name: "the first segment of a fresh resource", holder: &a, issued: issued, attempt: enc(a1), want: fence.Accepted},
		{name: "the last accepted envelope again", accepted: base, holder: &a, issued: issued, attempt: enc(a2s), want: fence.FenceRequired},
		{name: "segment zero", accepted: base, holder: &a, issued: issued, attempt: strings.Replace(seg(a, 3, "a3"), `"segment":3`, `"segment":0`, 1), want: fence.BadGrant},
		{name: "a fence token past int64", accepted: base, holder: &a, issued: issued, attempt: strings.Replace(seg(a, 3, "a3"), `"fenceToken":5`, `"fenceToken":9223372036854775808`, 1), want: fence.BadGrant},
		{name: "a fractional fence token", accepted: base, holder: &a, issued: issued, attempt: strings.Replace(seg(a, 3, "a3"), `"fenceToken":5`, `"fenceToken":1.5`, 1), want: fence.BadGrant},
		{name: "fence token zero", accepted: base, holder: &a, issued: issued, attempt: strings.Replace(seg(a, 3, "a3"), `"fenceToken":5`, `"fenceToken":0`, 1), want: fence.BadGrant},
		{name: "a negative fence token", accepted: base, holder: &a, issued: issued, attempt: strings.Replace(seg(a, 3, "a3"), `"fenceToken":5`, `"fenceToken":-5`, 1), want: fence.BadGrant},
		{name: "a fractional issuer epoch", accepted: base, holder: &a, issued: issued, attempt: strings.Replace(seg(a, 3, "a3"), `"issuerEpoch":1`, `"issuerEpoch":1.5`, 1), want: fence.BadGrant},
		{name: "a policy generation past int64", accepted: base, holder: &a, issued: issued, attempt: strings.Replace(seg(a, 3, "a3"), `"policyGeneration":1`, `"policyGeneration":9223372036854775808`, 1), want: fence.BadGrant},
		{name: "no payload", accepted: base, holder: &a, issued: issued, attempt: strings.Replace(seg(a, 3, "a3"), `"payload"`, `"paylod"`, 1), want: fence.BadGrant},
		{name: "an unknown intent", accepted: base, holder: &a, issued: issued, attempt: strings.TrimSuffix(seg(a, 3, "a3"), "}") + `,"intent":"drop"}`, want: fence.BadGrant},
		{name: "a forged grant", accepted: base, holder: &a, issued: issued, attempt: enc(w.envelope(w.rogue, forged, 1, "m")), want: fence.ForgedGrant},
		{name: "a grant for a resource this store does not serve", accepted: base, holder: &a, issued: issued, unregistered: true, attempt: enc(w.envelope(w.issuer, other, 1, "x")), want: fence.WrongResource},
		{name: "a revoked epoch", accepted: base, holder: &a, issued: issued, revokedBelow: 2, attempt: seg(a, 3, "a3"), want: fence.RevokedEpoch},
		{name: "a stale owner after the handoff", accepted: []fence.Envelope{a1, a2s, b1}, holder: &b, issued: issued, attempt: seg(a, 3, "a3"), want: fence.StaleOwner},
		{name: "a stale owner while nothing is held", accepted: []fence.Envelope{a1, b1}, issued: issued, attempt: seg(a, 2, "a2"), want: fence.StaleOwner},
		{name: "the registry's holder below the accepted fence", accepted: []fence.Envelope{a1, b1}, holder: &a, issued: issued, attempt: seg(a, 2, "a2"), want: fence.FenceRegression},
		{name: "the accepted fence reissued to another grant", accepted: base, holder: &a2, issued: issued, attempt: seg(a2, 1, "x"), want: fence.FenceRegression},
		{name: "another root at the accepted fence", accepted: base, holder: &b, issued: issued, attempt: seg(a2, 1, "x"), want: fence.RootMismatch},
		{name: "nothing held", accepted: base, issued: issued, attempt: seg(a, 3, "a3"), want: fence.NotHeld},
		{name: "another holder", accepted: base, holder: &b, issued: issued, attempt: seg(a, 3, "a3"), want: fence.NotHeld},
		{name: "an expired grant", accepted: base, holder: &a, expired: true, issued: issued, attempt: seg(a, 3, "a3"), want: fence.NotHeld},
		{name: "an older policy generation", accepted: base, holder: &stale, issued: []grant.Grant{stale, b}, generation: 1, attempt: seg(stale, 1, "s"), want: fence.PolicyStale},
		{name: "a new fence not at segment 1", accepted: base, holder: &c, issued: issued, attempt: seg(c, 2, "c2"), want: fence.SegmentOutOfOrder},
		{name: "a skipped segment", accepted: base, holder: &a, issued: issued, attempt: seg(a, 4, "a4"), want: fence.SegmentOutOfOrder},
		{name: "a replay of an applied segment", accepted: base, holder: &a, issued: issued, attempt: enc(a1), want: fence.AlreadyApplied},
		{name: "another payload for an applied segment", accepted: base, holder: &a, issued: issued, attempt: seg(a, 1, "changed"), want: fence.Quarantined},
		{name: "a segment whose receipt is no longer kept", accepted: base, keep: 1, holder: &a, issued: issued, attempt: enc(a1), want: fence.SegmentOutOfOrder},
	}
}

// TestConformance runs every case through fence.Decide and through the
// database: the verdicts and receipts must be the case's, on both sides.
func TestConformance(t *testing.T) {
	w := newWorld(t)
	s := newStore(t, pgfence.InstallOptions{})
	for _, c := range w.cases() {
		t.Run(c.name, func(t *testing.T) {
			model := w.decide(t, c)
			if model.Verdict != c.want {
				t.Fatalf("fence.Decide: %s, want %s", model.Message, c.want)
			}
			v, receipt, msg := s.decide(t, c)
			if v != c.want {
				t.Fatalf("begin_segment: %s, want %s (fence.Decide: %s)", msg, c.want, model.Message)
			}
			if receipt != model.Receipt {
				t.Fatalf("receipt %q, fence.Decide's %q", receipt, model.Receipt)
			}
		})
	}
}

func registryOf(c conformanceCase) fence.Registry {
	reg := fence.Registry{Found: !c.unregistered, ResourceID: resourceID, Generation: c.generation, Now: now}
	if reg.Generation == 0 {
		reg.Generation = 1
	}
	if c.holder != nil {
		g := c.holder
		reg.Holder = &fence.Holder{Digest: g.Digest(), Owner: g.Owner, Lease: g.Lease, RequestID: g.RequestID,
			Fence: g.FenceToken, ExpiresAt: expiry(c)}
	}
	return reg
}

func expiry(c conformanceCase) time.Time {
	if c.expired {
		return now.Add(-time.Second)
	}
	return now.Add(time.Hour)
}

// stateOf is the fence state the accepted segments leave, built the way
// the acceptance point builds it.
func stateOf(c conformanceCase) fence.State {
	var st fence.State
	for _, e := range c.accepted {
		g := e.Grant
		r := fence.Receipt{Fence: g.FenceToken, Segment: e.Segment, Operation: e.Operation, Payload: e.Payload,
			Receipt: fence.ReceiptDigest(resourceID, g.FenceToken, g.OperationRoot, e.Segment, e.Operation, e.Payload)}
		log := st.Receipts
		if g.FenceToken > st.HighestFence {
			log = nil // the store keeps the receipts of the highest fence only
		}
		st = fence.State{HighestFence: g.FenceToken, Root: g.OperationRoot, LastSegment: e.Segment,
			Receipts: fence.AppendReceipt(log, r), Accepted: e.Encode(), GrantDigest: g.Digest()}
	}
	if c.keep > 0 && len(st.Receipts) > c.keep {
		st.Receipts = st.Receipts[len(st.Receipts)-c.keep:]
	}
	return st
}

func (w *world) decide(t *testing.T, c conformanceCase) fence.Decision {
	t.Helper()
	bundle := w.bundle
	if c.revokedBelow > 0 {
		bundle = grant.NewTrustBundle(c.revokedBelow, w.issuer)
	}
	owner, pay := "", ""
	if e, err := fence.ParseEnvelope(c.attempt); err == nil {
		owner, pay = e.Grant.Owner, e.Payload
	}
	return fence.Decide(stateOf(c), fence.Attempt{User: owner, Changed: true, Fence: c.attempt, Payload: pay}, registryOf(c), bundle)
}

// decide sets the store up as the case says (as the superuser and the
// operator's role), then sends the attempt as the worker's role.
func (s *store) decide(t *testing.T, c conformanceCase) (fence.Verdict, string, string) {
	t.Helper()
	ctx := context.Background()
	s.reset(t, c)
	tx, err := s.worker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var receipt *string
	err = tx.QueryRow(ctx, "SELECT fencekeeper.begin_segment($1::jsonb)", c.attempt).Scan(&receipt)
	if err == nil {
		return fence.Accepted, *receipt, "ACCEPTED"
	}
	re, ok := pgfence.AsRefusal(err)
	if !ok {
		t.Fatalf("begin_segment: not a refusal: %v", err)
	}
	return re.Verdict, re.Receipt, re.Message
}

func (s *store) reset(t *testing.T, c conformanceCase) {
	t.Helper()
	ctx := context.Background()
	exec(t, s.admin, "TRUNCATE fencekeeper.resources, fencekeeper.grants, fencekeeper.receipts")
	exec(t, s.admin, "UPDATE fencekeeper.issuer SET revoked_below_epoch = 0")
	if c.unregistered {
		return
	}
	gen := c.generation
	if gen == 0 {
		gen = 1
	}
	must(t, pgfence.PublishResource(ctx, s.operator, resourceID, pgfence.Enforce, gen))
	must(t, pgfence.PublishRevocation(ctx, s.operator, c.revokedBelow))
	for _, g := range c.issued {
		must(t, pgfence.PublishGrant(ctx, s.operator, g, expiry(c)))
		if c.holder == nil || g.Digest() != c.holder.Digest() {
			must(t, pgfence.EndGrant(ctx, s.operator, g.Digest(), "Released", now))
		}
	}
	st := stateOf(c)
	if st.HighestFence == 0 {
		return
	}
	exec(t, s.admin, "UPDATE fencekeeper.resources SET highest_fence = $2, root = $3, last_segment = $4, grant_digest = $5, last_envelope_digest = fencekeeper.envelope_digest($6::jsonb) WHERE resource_id = $1",
		resourceID, st.HighestFence, st.Root, st.LastSegment, st.GrantDigest, st.Accepted)
	// The stored state is written directly, so the check every commit of
	// a segment makes (recheck_at_commit) is not the setup's to pass.
	exec(t, s.admin, "SET session_replication_role = replica")
	defer exec(t, s.admin, "SET session_replication_role = DEFAULT")
	for _, r := range st.Receipts {
		exec(t, s.admin, "INSERT INTO fencekeeper.receipts (resource_id, fence, segment, operation, payload, receipt) VALUES ($1, $2, $3, $4, $5, $6)",
			resourceID, r.Fence, r.Segment, r.Operation, r.Payload, r.Receipt)
	}
}

func exec(t *testing.T, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
