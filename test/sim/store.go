package sim

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// The PostgreSQL store path (pkg/pgfence, docs/postgres.md): a database the
// FencedResource names in spec.stores, beside the protected ConfigMap. Its
// trust anchor is not Ed25519 but what the operator published to it (the
// publisher, publisher.go); workers commit segments to it as
// lockclient's Operation.CommitTx does (storeworker.go); the store oracle
// (storeoracle.go) judges every segment it committed.

// storeOneIn: one schedule in this many has a store. The share is chosen
// from the seed on a stream of its own, so every other schedule plays
// exactly as it did before the store path existed (the seeds docs/gates.md
// records still replay their stories), and a 10,000-schedule go test stays
// within its time.
const storeOneIn = 3

func storeSchedule(seed uint64, cfg Config) bool {
	n := cfg.StoreOneIn
	if n == 0 {
		n = storeOneIn
	}
	return n > 0 && rand.New(rand.NewPCG(seed, 0x73746f7265)).IntN(n) == 0
}

// storeSigner stands for the store's trust anchor when its decision is put
// to fence.Decide: begin_segment does not verify a signature, it looks the
// grant document up among the published ones. A published grant is re-signed
// with this key (and only a published one), so Decide's signature check
// passes exactly for the grants the store would find (test/pgfence's
// conformance test maps the two the same way).
var storeSigner = sync.OnceValue(func() *grant.Signer {
	s, err := grant.NewSigner("sim-store-anchor", bytes.Repeat([]byte{0x5d}, 32))
	if err != nil {
		panic(err)
	}
	return s
})

var storeBundle = sync.OnceValue(func() *grant.TrustBundle { return grant.NewTrustBundle(0, storeSigner()) })

// storeBroken is a deliberately wrong store or publisher rule (tests only):
// the oracle must report what it lets through.
type storeBroken struct {
	// anyOpenHolder: begin_segment (and the check at COMMIT) takes any
	// published grant not ended for the holder, not the highest-fence one.
	anyOpenHolder bool
	// endAfterSuccessor: the publisher publishes a new holder in one
	// transaction and ends the others in the next one.
	endAfterSuccessor bool
	// ignoreHighestFence: begin_segment judges a fence below the highest
	// accepted one as if the resource had accepted nothing.
	ignoreHighestFence bool
	// resolveWithoutTerminating: a lost COMMIT is resolved from the
	// receipts without ending the server process that ran it first.
	resolveWithoutTerminating bool
	// noEpochFence: the store before schema version 3, which took a
	// publication of any issuer epoch (publish_epoch refuses nothing).
	noEpochFence bool
}

// storeGrant is a row of fencekeeper.grants.
type storeGrant struct {
	g       grant.Grant
	digest  string
	expires time.Time
	ended   bool
	seq     int // publication order (ties of fence: the later one)
}

// storeTx is one fenced transaction: begin_segment, the caller's statements,
// COMMIT. Its id is the begin request's.
type storeTx struct {
	id      int64
	from    *worker // nil: the adversary
	raw     string  // the envelope as sent
	env     fence.Envelope
	parsed  bool
	decided bool // begin_segment ran
	next    fence.State
	receipt string
	open    bool // begun and holding the resource row's lock
	// dead: aborted, or its session ended (its client gave up, a restart,
	// pg_terminate_backend): its COMMIT can never land.
	dead bool
	// oneShot: the adversary's transaction, committed as soon as it begins.
	oneShot bool
	fault   Fault
	sf      storeFault
	begun   time.Time
}

// storeWaiter is a statement waiting for the resource row's lock: a
// begin_segment, or a publication that changes the resource row (or waits
// behind one: publish_epoch holds the issuer row, one publication at a time).
type storeWaiter struct {
	tx  *storeTx
	req *request
}

// pgStore is the database: its published view and fence state (durable),
// and its sessions (lost when it restarts).
type pgStore struct {
	w *world
	// The published view, and the highest publisher epoch taken
	// (issuer.publisher_epoch).
	epoch        int64
	registered   bool
	generation   int64
	revokedBelow int64
	grants       map[string]*storeGrant
	order        []*storeGrant // in publication order, for deterministic scans
	// The resource row and the receipts of its highest fence.
	st       fence.State
	lastRaw  string // the last accepted envelope as sent (its canonical encoding)
	receipts []fence.Receipt
	// Sessions.
	txs      map[int64]*storeTx
	lock     *storeTx
	waiters  []storeWaiter
	down     bool
	upAt     time.Time
	restarts int
}

func newStore(w *world) *pgStore {
	return &pgStore{w: w, grants: map[string]*storeGrant{}, txs: map[int64]*storeTx{}}
}

// holder is the store's holder for a decision about env: the published
// grant with the highest fence that is not ended (a broken rule takes env's
// own grant when it is open).
func (s *pgStore) holder(digest string) *storeGrant {
	if s.w.cfg.storeBroken.anyOpenHolder {
		if g := s.grants[digest]; g != nil && !g.ended {
			return g
		}
	}
	var h *storeGrant
	for _, g := range s.order {
		if !g.ended && (h == nil || g.g.FenceToken >= h.g.FenceToken) {
			h = g
		}
	}
	return h
}

// decide is begin_segment on the store's view (001_core.sql): first what
// differs because the trust anchor is the published grants (the last
// accepted envelope again, an unreadable one, a resource no FencedResource
// publishes here, a grant not published, a revoked epoch), in its order,
// then fence.Decide over the published view for the fence rules.
func (s *pgStore) decide(raw string) (fence.Decision, fence.Envelope, bool) {
	deny := func(v fence.Verdict, format string, args ...any) fence.Decision {
		return fence.Decision{Verdict: v, Message: string(v) + ": " + fmt.Sprintf(format, args...), State: s.st}
	}
	if raw == "" {
		return deny(fence.FenceRequired, "begin_segment needs the fence envelope"), fence.Envelope{}, false
	}
	e, err := fence.ParseEnvelope(raw)
	switch {
	case err == nil && s.registered && e.Encode() == s.lastRaw:
		return deny(fence.FenceRequired, "the envelope is the one of the last accepted segment"), e, true
	case err != nil:
		return deny(fence.BadGrant, "%v", err), e, false
	case !s.registered || e.Grant.Resource != resourceID:
		return deny(fence.WrongResource, "no FencedResource publishes resource %s to this store", e.Grant.Resource), e, true
	}
	g := e.Grant
	pub := s.grants[g.Digest()]
	switch {
	case pub == nil || pub.g.FenceToken != g.FenceToken:
		return deny(fence.ForgedGrant, "no grant with fence %d was published to this store", g.FenceToken), e, true
	case g.IssuerEpoch < s.revokedBelow:
		return deny(fence.RevokedEpoch, "the grant was issued under epoch %d; epochs below %d are revoked", g.IssuerEpoch, s.revokedBelow), e, true
	}
	reg := fence.Registry{Found: true, ResourceID: resourceID, Generation: s.generation, Now: s.w.now}
	if h := s.holder(g.Digest()); h != nil {
		reg.Holder = &fence.Holder{Digest: h.digest, Owner: h.g.Owner, Lease: h.g.Lease, RequestID: h.g.RequestID, Fence: h.g.FenceToken, ExpiresAt: h.expires}
	}
	st := s.st
	st.Accepted = "" // compared above, on the envelope as sent
	if s.w.cfg.storeBroken.ignoreHighestFence && g.FenceToken < st.HighestFence {
		st = fence.State{}
	}
	anchored := e
	_, anchored.Proof, err = storeSigner().Sign(g)
	if err != nil {
		return deny(fence.BadGrant, "%v", err), e, true
	}
	pod, _ := grant.LeasePod(g.Lease)
	d := fence.Decide(st, fence.Attempt{User: g.Owner, Pod: pod, Changed: true, Fence: anchored.Encode(), Payload: e.Payload}, reg, storeBundle())
	if d.Verdict != fence.Accepted {
		d.State = s.st
	}
	return d, e, true
}

// serve answers a request to the store; nil when the answer comes later
// (a statement waiting for the row lock) or never (the store is down).
func (s *pgStore) serve(r *request) *reply {
	rp := &reply{req: r, store: &storeAnswer{}}
	if s.down {
		s.w.tracef("store: down; %s's %s (#%d) gets no answer", r.user, r.kind, r.id)
		if tx := s.txs[r.id]; tx != nil && r.kind == reqStoreBegin {
			tx.dead = true
		}
		return nil
	}
	switch r.kind {
	case reqStoreView:
		s.serveView(r, rp)
	case reqStoreBegin:
		return s.serveBegin(r, rp)
	case reqStoreCommit:
		s.serveCommit(r, rp)
	case reqStoreResolve:
		s.serveResolve(r, rp)
	case reqPublish:
		return s.servePublish(r, rp)
	}
	return rp
}

// serveView is fencekeeper.published and resource_state, as storeReady reads them.
func (s *pgStore) serveView(r *request, rp *reply) {
	a := rp.store
	if g := s.grants[r.storeDigest]; g != nil && !g.ended {
		a.published = true
	}
	a.state = fence.State{HighestFence: s.st.HighestFence, Root: s.st.Root, LastSegment: s.st.LastSegment, GrantDigest: s.st.GrantDigest}
}

func (s *pgStore) serveBegin(r *request, rp *reply) *reply {
	tx := s.txs[r.id]
	if tx == nil || tx.dead {
		return nil // its client gave up: the session is gone
	}
	if s.lock != nil {
		s.waiters = append(s.waiters, storeWaiter{tx: tx, req: r})
		s.w.tracef("store: %s's begin_segment (#%d) waits for the resource row's lock (held by #%d)", r.user, r.id, s.lock.id)
		return nil
	}
	s.begin(tx, rp)
	return rp
}

// begin runs begin_segment for tx, which holds the row lock from then on
// when it is accepted.
func (s *pgStore) begin(tx *storeTx, rp *reply) {
	w := s.w
	d, e, parsed := s.decide(tx.raw)
	tx.decided, tx.env, tx.parsed = true, e, parsed
	w.storeOracle.attempted(tx, d.Verdict)
	rp.store.verdict, rp.store.receipt, rp.message = d.Verdict, d.Receipt, d.Message
	w.tracef("store: begin_segment %s by %s: %s", describeEnvelope(tx.raw), rp.req.user, d.Message)
	if d.Verdict != fence.Accepted {
		tx.dead = true
		return
	}
	tx.open, tx.next, tx.receipt, tx.begun = true, d.State, d.Receipt, w.now
	s.lock = tx
	if tx.oneShot {
		v, msg := s.commit(tx)
		rp.store.verdict, rp.message = v, msg
	}
}

func (s *pgStore) serveCommit(r *request, rp *reply) {
	tx := s.txs[r.storeTx]
	if tx == nil || tx.dead || !tx.open {
		if tx == nil || !tx.dead {
			return
		}
		// The session ended (restart, terminated): an error, nothing landed.
		rp.store.verdict, rp.message = verdictNoTx, "the transaction was rolled back: its session ended"
		return
	}
	rp.store.verdict, rp.message = s.commit(tx)
	rp.store.receipt = tx.receipt
}

// verdictNoTx is the answer to a COMMIT whose transaction is gone;
// verdictNotHeldAtCommit counts the refusals of the check at COMMIT.
const (
	verdictNoTx            fence.Verdict = "(no transaction)"
	verdictNotHeldAtCommit fence.Verdict = "NOT_HELD at COMMIT"
)

// commit is COMMIT with recheck_at_commit (002_protect.sql): the grant must
// still be the store's current, unexpired holder; then the segment lands.
func (s *pgStore) commit(tx *storeTx) (fence.Verdict, string) {
	w := s.w
	h := s.holder(tx.next.GrantDigest)
	var why string
	switch {
	case h == nil || h.digest != tx.next.GrantDigest:
		why = fmt.Sprintf("NOT_HELD: the grant with fence %d ended before its segment %d committed", tx.env.Grant.FenceToken, tx.env.Segment)
	case !w.now.Before(h.expires):
		why = fmt.Sprintf("NOT_HELD: the grant with fence %d expired before its segment %d committed", tx.env.Grant.FenceToken, tx.env.Segment)
	}
	if why != "" {
		w.res.StoreRefusedAtCommit++
		w.res.countStoreVerdict(verdictNotHeldAtCommit, tx.sf)
		w.tracef("store: COMMIT of %s: %s", describeEnvelope(tx.raw), why)
		s.end(tx)
		return fence.NotHeld, why
	}
	if tx.next.HighestFence > s.st.HighestFence {
		s.receipts = nil
	}
	s.receipts = append(s.receipts, fence.Receipt{Fence: tx.env.Grant.FenceToken, Segment: tx.env.Segment, Operation: tx.env.Operation,
		Payload: tx.env.Payload, Receipt: tx.receipt})
	s.st = tx.next
	s.st.Accepted = ""
	s.lastRaw = tx.env.Encode()
	w.res.StoreCommits++
	w.tracef("store: COMMIT of %s lands (receipt %s)", describeEnvelope(tx.raw), short(tx.receipt))
	w.storeOracle.committed(tx)
	s.end(tx)
	return fence.Accepted, "ACCEPTED"
}

// end closes tx and hands the row lock to what waits for it.
func (s *pgStore) end(tx *storeTx) {
	tx.open, tx.dead = false, true
	if s.lock == tx {
		s.lock = nil
		s.runWaiters()
	}
}

// runWaiters gives the free row lock to the statements waiting for it, in
// arrival order, until one keeps it.
func (s *pgStore) runWaiters() {
	for s.lock == nil && len(s.waiters) > 0 {
		wt := s.waiters[0]
		s.waiters = s.waiters[1:]
		rp := &reply{req: wt.req, store: &storeAnswer{}}
		if wt.tx == nil {
			if wt.req.publicationTimedOut(s.w.now) {
				s.w.tracef("store: a publication that waited for the row lock is gone: its publisher gave up")
				continue
			}
			s.publish(wt.req, rp)
		} else {
			if wt.tx.dead {
				continue
			}
			s.begin(wt.tx, rp)
		}
		s.w.answer(rp)
	}
}

// abandon: the client of tx gave up on its begin_segment (its context
// ended; pgx closes the connection): the session ends, and with it the
// transaction, wherever it is.
func (s *pgStore) abandon(id int64) {
	tx := s.txs[id]
	if tx == nil || tx.dead {
		return
	}
	tx.dead = true
	s.waiters = slices.DeleteFunc(s.waiters, func(wt storeWaiter) bool { return wt.tx == tx })
	if tx.open {
		s.w.tracef("store: the session of #%d ends; its open transaction rolls back", id)
		s.end(tx)
	}
}

// serveResolve is pgfence's resolveLost on a fresh connection: end the
// server process that ran the transaction (its COMMIT can then never land),
// then read the receipts of the operation and the fence state (Resolve).
func (s *pgStore) serveResolve(r *request, rp *reply) {
	if !s.w.cfg.storeBroken.resolveWithoutTerminating {
		s.abandon(r.storeTx)
	}
	e := r.storeEnv
	g := e.Grant
	want := fence.ReceiptDigest(g.Resource, g.FenceToken, g.OperationRoot, e.Segment, e.Operation, e.Payload)
	a := rp.store
	switch {
	case slices.ContainsFunc(s.receipts, func(x fence.Receipt) bool { return x.Operation == e.Operation && x.Receipt == want }):
		a.outcome, a.receipt = resolvedApplied, want
	case s.st.HighestFence <= g.FenceToken:
		a.outcome = resolvedAbsent
	default:
		a.outcome = resolvedUndeterminable
	}
}

// Outcomes of a lost COMMIT's resolution (pgfence.Resolve).
type resolution int

const (
	resolvedApplied resolution = iota
	resolvedAbsent
	resolvedUndeterminable
)

func (o resolution) String() string {
	return [...]string{"applied", "proven absent", "undeterminable"}[o]
}

// servePublish applies a publication in one transaction (the publisher's
// publish): publish_epoch, which refuses the whole transaction
// (EPOCH_SUPERSEDED) when the publisher's epoch is below one the store
// took, then the resource row (its policy generation set to the
// registry's), the revocation, the holder (its expiry only grows), the end
// of every other open grant. A publication that changes the resource row
// waits for an open segment's row lock; one that arrives while another
// waits waits behind it (publish_epoch holds the issuer row: publications
// are one at a time).
func (s *pgStore) servePublish(r *request, rp *reply) *reply {
	p := r.pub
	if r.publicationTimedOut(s.w.now) {
		s.w.tracef("store: a publication arrives after its publisher gave up: its connection is closed")
		return nil
	}
	if s.superseded(r, rp) {
		return rp
	}
	if s.lock != nil && (!s.registered || p.generation != s.generation ||
		slices.ContainsFunc(s.waiters, func(wt storeWaiter) bool { return wt.tx == nil })) {
		s.waiters = append(s.waiters, storeWaiter{req: r})
		s.w.tracef("store: a publication waits for the resource row's lock")
		return nil
	}
	if s.publish(r, rp) && r.twice {
		s.applyPublication(r)
	}
	return rp
}

// publish runs the publication r now, unless its epoch is superseded.
func (s *pgStore) publish(r *request, rp *reply) bool {
	if s.superseded(r, rp) {
		return false
	}
	s.applyPublication(r)
	return true
}

// superseded is publish_epoch's refusal (SQLSTATE FK003): nothing of the
// publication lands.
func (s *pgStore) superseded(r *request, rp *reply) bool {
	w := s.w
	if r.pub.epoch >= s.epoch || w.cfg.storeBroken.noEpochFence {
		return false
	}
	rp.store.superseded = true
	rp.message = fmt.Sprintf("EPOCH_SUPERSEDED: this store took publications of issuer epoch %d; a publisher of epoch %d is no longer the leader", s.epoch, r.pub.epoch)
	if r.deposed {
		w.res.StoreDeposedRefused++
	}
	w.tracef("store: %s's publication refused: %s", r.user, rp.message)
	return true
}

func (s *pgStore) applyPublication(r *request) {
	w := s.w
	p := r.pub
	s.epoch = max(s.epoch, p.epoch)
	s.registered = true
	s.generation = p.generation
	s.revokedBelow = max(s.revokedBelow, p.revokedBelow)
	holder := ""
	if p.holder != nil {
		holder = p.holder.Digest()
		switch g := s.grants[holder]; {
		case g == nil:
			g = &storeGrant{g: *p.holder, digest: holder, expires: p.expiresAt, seq: len(s.order)}
			s.grants[holder] = g
			s.order = append(s.order, g)
			w.storeOracle.published(g)
		case !g.ended && p.expiresAt.After(g.expires):
			g.expires = p.expiresAt
		}
	}
	if !p.keepOthers {
		for _, g := range s.order {
			if !g.ended && g.digest != holder {
				g.ended = true
				if h := w.reg.fr.Status.Holder; h != nil && h.Digest == g.digest && p.restores == w.reg.restores {
					// Ended at the store while the registry holds it, and
					// the registry did not go back since the publication
					// was read: for good, publish_grant never re-opens a grant.
					w.oracle.violation(vStoreHolderEnded, "the registry's holder (fence %d) is ended at the store by %s's publication of holder %s (epoch %d)",
						h.FenceToken, r.user, p.describe(), p.epoch)
				}
			}
		}
	}
	w.res.StorePublications++
	if r.deposed {
		w.res.StoreDeposedLanded++
	}
	w.tracef("store: publication applied (epoch %d, generation %d, revokedBelow %d, holder %s)", p.epoch, p.generation, p.revokedBelow, p.describe())
}

// restart: the database restarts. Every session ends (open transactions
// roll back, waiting statements are gone); what committed stays.
func (s *pgStore) restart(d time.Duration) {
	s.restarts++
	for _, tx := range s.txs {
		tx.dead = true
		tx.open = false
	}
	s.lock, s.waiters = nil, nil
	s.goDown(d)
	s.w.storeOracle.checkDurable("after a restart")
}

// goDown makes the store unreachable for d.
func (s *pgStore) goDown(d time.Duration) {
	s.down = true
	if up := s.w.now.Add(d); up.After(s.upAt) {
		s.upAt = up
	}
}

func (s *pgStore) clockAdvanced() {
	if s.down && !s.w.now.Before(s.upAt) {
		s.down = false
		s.w.tracef("store: reachable again")
	}
}

func (s *pgStore) nextEvent() time.Time {
	if s.down {
		return s.upAt
	}
	return time.Time{}
}

// storeAnswer is the store's part of a reply.
type storeAnswer struct {
	verdict   fence.Verdict
	receipt   string
	published bool
	state     fence.State
	outcome   resolution
	// superseded: publish_epoch refused the publication (EPOCH_SUPERSEDED).
	superseded bool
}

// describeEnvelope summarizes an envelope for traces.
func describeEnvelope(raw string) string {
	e, err := fence.ParseEnvelope(raw)
	if err != nil {
		return "an unreadable envelope"
	}
	return fmt.Sprintf("fence %d seg %d op %s grant %s", e.Grant.FenceToken, e.Segment, e.Operation, short(e.Grant.Digest()))
}

// answer puts a reply the store gives later (after a lock wait) on the network.
func (w *world) answer(rp *reply) {
	w.tick++
	rp.served = w.tick
	if rp.req.dropReply {
		w.tracef("  lost: the answer to %s's %s (#%d: %s)", rp.req.user, rp.req.kind, rp.req.id, rp.summary())
		return
	}
	w.replies = append(w.replies, rp)
}
