package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// The operator's store publisher (controllers/store_publisher.go), as the
// simulator runs it: whenever what the registry holds for the store changes
// (the holder, its expiry, the policy generation, the revocation), the
// leader's publisher sends the registry's truth in one transaction that
// begins with publish_epoch (the leader's issuer epoch: the store refuses
// it whole, EPOCH_SUPERSEDED, below an epoch it took); a refusal or a call
// without an answer within storeCallTimeout is retried with
// controller-runtime's per-item backoff (0.5 s doubling up to 30 s), and a
// new change is published at once. One publication is in flight at a time
// (the workqueue runs a key on one worker). It runs only while the issuer
// has a leader; a new leader starts with no memory of what it published.
// The leader it replaced may still publish once, late (leaderLost).

// storeCallTimeout bounds one publication (the publisher's storeCallTimeout).
const storeCallTimeout = 5 * time.Second

const (
	storeRetryFirst   = 500 * time.Millisecond
	storeRetryLongest = 30 * time.Second
)

// publication is what one publish transaction writes (publicationOf).
type publication struct {
	// epoch: the publishing leader's issuer epoch (publish_epoch).
	epoch        int64
	generation   int64
	revokedBelow int64
	holder       *grant.Grant
	expiresAt    time.Time
	// keepOthers: the broken rule's first transaction, which does not end
	// the other grants (storeBroken.endAfterSuccessor).
	keepOthers bool
	key        string
	// restores: the registry's restores when it was read.
	restores int
}

func (p *publication) describe() string {
	if p.holder == nil {
		return "none"
	}
	return fmt.Sprintf("fence %d (grant %s, expires +%s)", p.holder.FenceToken, short(p.holder.Digest()), p.expiresAt.Sub(simStart).Truncate(time.Millisecond))
}

type publisher struct {
	w *world
	// rng draws when a deposed leader's publication arrives, on a stream of
	// its own: the rest of the schedule draws what it drew without it.
	rng *rand.Rand
	// published is the key of the last publication the store took, as this
	// leader knows it ("" after a leader change).
	published string
	inFlight  *request
	// failures and retryAt: the backoff after failed publications of failedKey.
	failures  int
	retryAt   time.Time
	failedKey string
	// ends: the broken rule's second transaction is still to be sent, at endsAt.
	ends   bool
	endsAt time.Time
	// armed one-shot faults of the next publication.
	lose, loseAnswer, delay, duplicate bool
}

func newPublisher(w *world) *publisher {
	return &publisher{w: w, rng: rand.New(rand.NewPCG(w.res.Seed, 0x6465706f736564))}
}

// snapshot is the registry's current truth for the store.
func (p *publisher) snapshot() *publication {
	r := p.w.reg
	pub := &publication{epoch: r.epoch, generation: r.fr.Generation, revokedBelow: r.revokedBelow, restores: r.restores}
	if h := r.fr.Status.Holder; h != nil {
		g := h.Grant(r.fr.Spec.ResourceID)
		pub.holder, pub.expiresAt = &g, h.ExpiresAt.Time
	}
	digest := ""
	if pub.holder != nil {
		digest = pub.holder.Digest()
	}
	pub.key = fmt.Sprintf("%d/%d/%s/%d", pub.generation, pub.revokedBelow, digest, pub.expiresAt.UnixNano())
	return pub
}

// leading: the issuer has a leader, whose manager runs the publisher.
func (p *publisher) leading() bool { return p.w.reg.outageUntil.IsZero() }

// ready: the publisher has something to publish now.
func (p *publisher) ready() bool {
	if !p.leading() || p.inFlight != nil {
		return false
	}
	if p.ends {
		return !p.w.now.Before(p.endsAt)
	}
	key := p.snapshot().key
	if key == p.published {
		return false
	}
	return key != p.failedKey || !p.w.now.Before(p.retryAt)
}

// run sends one publication.
func (p *publisher) run() {
	w := p.w
	pub := p.snapshot()
	if w.cfg.storeBroken.endAfterSuccessor && !p.ends && pub.key != p.published {
		pub.keepOthers = true
	}
	p.ends = false
	r := &request{kind: reqPublish, user: "system:serviceaccount:fencekeeper-system:fencekeeper-manager", pub: pub, fault: faultNone}
	switch {
	case p.lose:
		p.lose, r.dropRequest = false, true
		w.storeFaultFired(sfPublicationLost, "the publication of holder %s is lost on the way", pub.describe())
	case p.loseAnswer:
		p.loseAnswer, r.dropReply = false, true
		w.storeFaultFired(sfPublicationLost, "the answer to the publication of holder %s is lost", pub.describe())
	}
	if p.delay {
		p.delay = false
		r.notBefore = w.now.Add(time.Duration(200+w.rng.IntN(6000)) * time.Millisecond)
		w.storeFaultFired(sfPublicationDelayed, "the publication of holder %s is held in the network until +%s", pub.describe(), r.notBefore.Sub(simStart).Truncate(time.Millisecond))
	}
	w.send(r)
	p.inFlight = r
	if p.duplicate {
		// A transaction is not duplicated by a network: the publisher sends
		// the same truth again (a retry after a lost answer), before anything
		// newer. The store applies it twice in a row.
		p.duplicate, r.twice = false, true
		w.storeFaultFired(sfPublicationDuplicated, "the publication of holder %s is applied twice", pub.describe())
	}
	w.tracef("publisher: publishes generation %d, revokedBelow %d, holder %s", pub.generation, pub.revokedBelow, pub.describe())
}

// onReply: the store took the publication, or refused it
// (EPOCH_SUPERSEDED: the publisher reports StorePublishFailed and retries
// with backoff, as for any other failure).
func (p *publisher) onReply(rp *reply) {
	if rp.req != p.inFlight {
		return // a duplicate's answer, or one to a leader that is gone
	}
	p.inFlight = nil
	if rp.store.superseded {
		p.failed(rp.req, "the store refused the publication: "+rp.message)
		return
	}
	pub := rp.req.pub
	p.published, p.failures, p.failedKey = pub.key, 0, ""
	if pub.keepOthers {
		p.published, p.ends = "", true
		p.endsAt = p.w.now.Add(time.Duration(5000+p.w.rng.IntN(10000)) * time.Millisecond)
	}
}

// tick fails a publication that got no answer in time.
func (p *publisher) tick() {
	r := p.inFlight
	if r == nil || p.w.now.Before(r.sentAt.Add(storeCallTimeout)) {
		return
	}
	p.inFlight = nil
	p.failed(r, "no answer from the store")
}

// failed: the publication r failed; the same truth is tried again after
// the backoff, a new one at once.
func (p *publisher) failed(r *request, why string) {
	p.failures++
	backoff := storeRetryFirst << min(p.failures-1, 10)
	backoff = min(backoff, storeRetryLongest)
	p.retryAt, p.failedKey = p.w.now.Add(backoff), r.pub.key
	p.w.res.StorePublishFailures++
	p.w.tracef("publisher: %s; retry in %s", why, backoff)
}

func (p *publisher) nextEvent() time.Time {
	switch {
	case p.inFlight != nil:
		return p.inFlight.sentAt.Add(storeCallTimeout)
	case p.failures > 0:
		return p.retryAt
	case p.ends:
		return p.endsAt
	}
	return time.Time{}
}

// leaderLost: the leader's process is gone, or stopped. What it sent is
// still on the network (and lands if it arrives in time); the next
// leader's publisher starts with no memory. The deposed leader may also
// have stopped (paused) in the middle of a reconcile, with the registry's
// truth as its cache showed it then: it resumes after its successor took
// over, before it notices it lost its lease, and sends its transaction
// under its own epoch. publish_epoch refuses it if the successor published
// first; it does not retry (the manager exits once its lease is lost). If
// it arrives first, it publishes the truth it read, which the successor's
// publication then replaces.
func (p *publisher) leaderLost() {
	w := p.w
	if r := p.inFlight; r != nil {
		// Its transaction, not yet decided, dies with the process, unless
		// its COMMIT was already on its way: then it lands first (it holds
		// the issuer row every publication updates, so no successor's
		// transaction can commit before it).
		if i := slices.Index(w.requests, r); i >= 0 {
			w.requests = slices.Delete(w.requests, i, i+1)
			if w.rng.IntN(2) == 0 {
				w.tracef("publisher: the leader dies; its publication's COMMIT was on its way and lands")
				w.deliverRequest(r)
			} else {
				w.tracef("publisher: the leader dies; its publication rolls back with its session")
			}
		}
	}
	*p = publisher{w: w, rng: p.rng, lose: p.lose, loseAnswer: p.loseAnswer, delay: p.delay, duplicate: p.duplicate}
	pub := p.snapshot()
	r := &request{kind: reqPublish, user: "system:serviceaccount:fencekeeper-system:fencekeeper-manager (deposed)", pub: pub, fault: faultNone, deposed: true}
	w.send(r)
	r.notBefore = w.reg.outageUntil.Add(time.Duration(500+p.rng.IntN(15000)) * time.Millisecond)
	w.res.StoreDeposed++
	w.tracef("publisher: the deposed leader (epoch %d) resumes; its publication of holder %s arrives at +%s", pub.epoch, pub.describe(),
		r.notBefore.Sub(simStart).Truncate(time.Millisecond))
}

// timedOut: the publication's caller gave up before it arrived; its
// connection is closed, so it never runs.
func (r *request) publicationTimedOut(now time.Time) bool {
	return r.kind == reqPublish && !r.deposed && !now.Before(r.sentAt.Add(storeCallTimeout))
}
