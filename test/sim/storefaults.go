package sim

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// storeFault is one row of the store path's failure matrix. A store
// schedule draws them from a plan of its own (the matrix's faults, pauses,
// lost answers, restores, revocations, failovers and policy changes, reach
// the store path too, through its workers and the registry).
type storeFault int

const (
	sfUnreachable           storeFault = iota // the operator and the workers cannot reach the store for a while
	sfRestart                                 // the database restarts: sessions end, what committed stays
	sfPublicationLost                         // a publication, or its answer, is lost
	sfPublicationDelayed                      // a publication is held in the network
	sfPublicationDuplicated                   // a publication is delivered twice
	sfLostCommitAnswer                        // a worker's COMMIT, or its answer, is lost or late
	sfPauseInTransaction                      // a worker stops with its transaction open, past its lease
	sfStaleOwner                              // a paused, expired owner's next segment arrives after its successor's
	sfReplay                                  // an envelope sent earlier arrives again
	sfForged                                  // a grant with a higher fence, signed by an untrusted key
	sfTampered                                // a genuine grant with one field changed
	sfCrossResource                           // a grant the issuer signed for another resource
	sfBadEnvelope                             // an envelope that is not one (segment 0, no payload, unknown intent)
	sfDifferentPayload                        // the last accepted segment again with another payload
	numStoreFaults
)

var storeFaultNames = [numStoreFaults]string{
	"store unreachable", "store restart", "publication (or its answer) lost", "publication delayed", "publication duplicated",
	"COMMIT or its answer lost", "worker paused with its transaction open", "paused expired owner writes after its successor",
	"replayed envelope", "forged grant", "tampered grant", "cross-resource grant", "malformed envelope", "different-payload segment",
}

func (f storeFault) String() string {
	if f < 0 || f >= numStoreFaults {
		return "none"
	}
	return storeFaultNames[f]
}

// storeFaultPlan: a random half of the store faults, 2–7 injections.
type storeFaultPlan struct {
	enabled []storeFault
	budget  int
}

func newStoreFaultPlan(w *world) storeFaultPlan {
	var p storeFaultPlan
	for f := range numStoreFaults {
		if w.cfg.storeFaults != nil && !slices.Contains(w.cfg.storeFaults, f) {
			continue
		}
		if w.rng.IntN(2) == 0 {
			p.enabled = append(p.enabled, f)
		}
	}
	if len(p.enabled) == 0 && w.cfg.storeFaults != nil {
		p.enabled = append(p.enabled, w.cfg.storeFaults[w.rng.IntN(len(w.cfg.storeFaults))])
	}
	if len(p.enabled) == 0 {
		p.enabled = append(p.enabled, storeFault(w.rng.IntN(int(numStoreFaults))))
	}
	p.budget = 2 + w.rng.IntN(6)
	return p
}

func (p *storeFaultPlan) due(w *world) bool {
	return p.budget > 0 && w.rng.IntN(25) == 0
}

// storeFaultFired counts a store fault and traces it.
func (w *world) storeFaultFired(f storeFault, format string, args ...any) {
	w.res.StoreFaults[f]++
	w.tracef("STORE FAULT %s: %s", f, fmt.Sprintf(format, args...))
}

// injectStore tries one store fault of the plan.
func (a *adversary) injectStore() {
	p := &a.w.storePlan
	f := p.enabled[a.w.rng.IntN(len(p.enabled))]
	if a.applyStore(f) {
		p.budget--
	}
}

func (a *adversary) applyStore(f storeFault) bool {
	w := a.w
	switch f {
	case sfUnreachable:
		d := time.Duration(2000+w.rng.IntN(38000)) * time.Millisecond
		w.store.goDown(d)
		w.storeFaultFired(f, "the store is unreachable for %s", d)
		return true
	case sfRestart:
		d := time.Duration(500+w.rng.IntN(2500)) * time.Millisecond
		w.storeFaultFired(f, "the database restarts (down %s): its sessions end", d)
		w.store.restart(d)
		return true
	case sfPublicationLost:
		if w.rng.IntN(2) == 0 {
			w.pub.lose = true
		} else {
			w.pub.loseAnswer = true
		}
		return true
	case sfPublicationDelayed:
		w.pub.delay = true
		return true
	case sfPublicationDuplicated:
		w.pub.duplicate = true
		return true
	case sfLostCommitAnswer:
		return a.arm(storeHeld, func(k *worker) *bool { return &k.armed.lostCommit })
	case sfPauseInTransaction:
		return a.arm(storeHeld, func(k *worker) *bool { return &k.armed.pauseInTx })
	}
	raw, user, how := a.storeEnvelope(f)
	if raw == "" {
		return false
	}
	r := &request{kind: reqStoreBegin, user: user, storeRaw: raw, fault: faultNone}
	w.send(r)
	w.store.txs[r.id] = &storeTx{id: r.id, raw: raw, oneShot: true, fault: faultNone, sf: f}
	w.storeFaultFired(f, "%s", how)
	return true
}

// storeHeld: a worker holding a lock it commits to the store under.
func storeHeld(k *worker) bool { return held(k) && k.lock.store }

// storeEnvelope builds the adversary's envelope for fault f ("" when it cannot).
func (a *adversary) storeEnvelope(f storeFault) (raw, user, how string) {
	w := a.w
	content := func() string {
		p, _ := fence.PayloadDigest(map[string]any{"data": a.content()})
		return p
	}
	st := w.store.st
	next := func(g grant.Grant) int64 { return fence.NextSegment(st, g) }
	switch f {
	case sfStaleOwner:
		var older []issuedCopy
		h, held := a.holderGrant()
		for _, ic := range a.issued {
			if !held || ic.g.FenceToken < h.g.FenceToken {
				older = append(older, ic)
			}
		}
		if len(older) == 0 {
			return "", "", ""
		}
		src := older[len(older)-1] // most often the holder's predecessor
		if w.rng.IntN(3) == 0 {
			src = older[w.rng.IntN(len(older))]
		}
		e := fence.Envelope{Grant: src.g, Proof: src.proof, Operation: "late-" + src.g.RequestID, Segment: next(src.g), Payload: content()}
		return e.Encode(), src.g.Owner, fmt.Sprintf("the paused owner of fence %d (expired or ended) commits its next segment", src.g.FenceToken)
	case sfReplay:
		if len(w.storeOracle.sentRaw) == 0 {
			return "", "", ""
		}
		raw := w.storeOracle.sentRaw[w.rng.IntN(len(w.storeOracle.sentRaw))]
		e, _ := fence.ParseEnvelope(raw)
		return raw, e.Grant.Owner, "an envelope sent earlier arrives again: " + describeEnvelope(raw)
	case sfForged:
		src, ok := a.genuine()
		if !ok {
			return "", "", ""
		}
		g := src.g
		g.FenceToken = max(g.FenceToken, st.HighestFence) + 1 + int64(w.rng.IntN(3))
		_, proof, _ := forgerKey().Sign(g)
		e := fence.Envelope{Grant: g, Proof: proof, Operation: "adversary", Segment: 1, Payload: content()}
		return e.Encode(), g.Owner, fmt.Sprintf("a grant with fence %d signed by an untrusted key", g.FenceToken)
	case sfTampered:
		src, ok := a.genuine()
		if !ok {
			return "", "", ""
		}
		g := src.g
		var field string
		switch w.rng.IntN(5) {
		case 0:
			g.FenceToken++
			field = "fenceToken"
		case 1:
			g.TTLSeconds = 3600
			field = "ttlSeconds"
		case 2:
			g.PolicyGeneration++
			field = "policyGeneration"
		case 3:
			g.IssuerEpoch++
			field = "issuerEpoch"
		default:
			g.Owner = a.otherUser(g.Owner)
			field = "owner"
		}
		e := fence.Envelope{Grant: g, Proof: src.proof, Operation: "adversary", Segment: next(g), Payload: content()}
		return e.Encode(), g.Owner, fmt.Sprintf("a genuine grant (fence %d) with its %s changed", src.g.FenceToken, field)
	case sfCrossResource:
		src, ok := a.genuine()
		if !ok {
			return "", "", ""
		}
		g := src.g
		g.Resource = neighbourResourceID
		g.FenceToken = max(g.FenceToken, st.HighestFence) + 1
		_, proof, _ := issuerKey().Sign(g)
		e := fence.Envelope{Grant: g, Proof: proof, Operation: "adversary", Segment: 1, Payload: content()}
		return e.Encode(), g.Owner, fmt.Sprintf("a grant the issuer signed for %s (fence %d)", neighbourResourceID, g.FenceToken)
	case sfBadEnvelope:
		src, ok := a.genuine()
		if !ok {
			return "", "", ""
		}
		e := fence.Envelope{Grant: src.g, Proof: src.proof, Operation: "adversary", Segment: next(src.g), Payload: content()}
		raw := e.Encode()
		switch w.rng.IntN(4) {
		case 0:
			return strings.Replace(raw, fmt.Sprintf(`"segment":%d`, e.Segment), `"segment":0`, 1), src.g.Owner, "segment 0"
		case 1:
			return strings.Replace(raw, `"payload"`, `"paylod"`, 1), src.g.Owner, "no payload"
		case 2:
			return strings.TrimSuffix(raw, "}") + `,"intent":"drop"}`, src.g.Owner, `intent "drop"`
		}
		e.Operation = strings.Repeat("x", fence.MaxFenceAnnotationBytes)
		return e.Encode(), src.g.Owner, "an envelope over 8 KiB"
	case sfDifferentPayload:
		if w.store.lastRaw == "" {
			return "", "", ""
		}
		e, err := fence.ParseEnvelope(w.store.lastRaw)
		if err != nil {
			return "", "", ""
		}
		e.Payload = content()
		return e.Encode(), e.Grant.Owner, fmt.Sprintf("fence %d segment %d again with another payload", e.Grant.FenceToken, e.Segment)
	}
	return "", "", ""
}
