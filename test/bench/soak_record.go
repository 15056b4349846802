package main

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// soakRecorder collects the raw observations of a soak; soakResult.analyze
// turns them into figures once it ended.
type soakRecorder struct {
	mu sync.Mutex
	// fenceAt is when the soak's watch first saw each fence of the honest lock.
	fenceAt map[int64]time.Time
	// spans are the honest lock's holders, each from when the watch saw it
	// to when it saw the next (or none).
	spans         []holderSpan
	open          *holderSpan
	releases      []releaseEvent
	waits         []waitSample
	refusals      []refusal
	writeFailures map[string]int
	rssPoints     []rssPoint
	claimPoints   []claimPoint
	// floor: the control's handoffs (soak_floor.go), at when each sample
	// began; floorErr why it stopped early.
	floor    []timedSample
	floorErr string
	// reconciliationRequired: the honest entry's ReconciliationRequired
	// condition was seen True.
	reconciliationRequired bool
}

type holderSpan struct {
	tenant     bool
	fence      int64
	start, end time.Time
}

// releaseEvent: the holder of fence asked to release at at.
type releaseEvent struct {
	fence  int64
	at     time.Time
	tenant bool
}

// waitSample: an honest Acquire from start to HELD at end.
type waitSample struct{ start, end time.Time }

type refusal struct {
	at     time.Time
	reason string
}

type rssPoint struct {
	at        time.Time
	rss, anon uint64
}

type claimPoint struct {
	at    time.Time
	count int
}

func newSoakRecorder() *soakRecorder {
	return &soakRecorder{fenceAt: map[int64]time.Time{}, writeFailures: map[string]int{}}
}

// floorHandoff records one sample of the floor handoff begun at start.
func (r *soakRecorder) floorHandoff(start time.Time, took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.floor = append(r.floor, timedSample{at: start, end: start.Add(took), d: took})
}

// observe records a state of the honest lock seen at now.
func (r *soakRecorder) observe(fr *locksv1.FencedResource, tenant string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f := fr.Status.FenceToken; f > 0 {
		if _, ok := r.fenceAt[f]; !ok {
			r.fenceAt[f] = now
		}
	}
	if meta.IsStatusConditionTrue(fr.Status.Conditions, locksv1.ConditionReconciliationRequired) {
		r.reconciliationRequired = true
	}
	h := fr.Status.Holder
	if r.open != nil && (h == nil || h.FenceToken != r.open.fence) {
		r.open.end = now
		r.spans = append(r.spans, *r.open)
		r.open = nil
	}
	if h != nil && r.open == nil {
		r.open = &holderSpan{tenant: h.Owner == tenant, fence: h.FenceToken, start: now}
	}
}

func (r *soakRecorder) released(fence int64, at time.Time, tenant bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.releases = append(r.releases, releaseEvent{fence, at, tenant})
}

func (r *soakRecorder) waited(start, end time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waits = append(r.waits, waitSample{start, end})
}

func (r *soakRecorder) refused(at time.Time, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refusals = append(r.refusals, refusal{at, reason})
}

func (r *soakRecorder) writeFailed(what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writeFailures[what]++
}

func (r *soakRecorder) rss(at time.Time, m memSample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rssPoints = append(r.rssPoints, rssPoint{at, m.RSS, m.Anon})
}

func (r *soakRecorder) claims(at time.Time, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.claimPoints = append(r.claimPoints, claimPoint{at, n})
}

// timedSample is a latency and when its measurement started and ended.
type timedSample struct {
	at, end time.Time
	d       time.Duration
}

// handoffSamples pairs each release of fence F with the moment the next
// fence was first seen: the release→next-holder handoff. A release after
// which no later fence was seen (the end of the run) gives no sample.
func handoffSamples(releases []releaseEvent, fenceAt map[int64]time.Time, tenant bool) []timedSample {
	var out []timedSample
	for _, rel := range releases {
		if rel.tenant != tenant {
			continue
		}
		next, ok := fenceAt[rel.fence+1]
		if !ok || next.Before(rel.at) {
			continue
		}
		out = append(out, timedSample{rel.at, next, next.Sub(rel.at)})
	}
	return out
}

// withoutTenantHolds is an honest wait less the time the tenant held the
// lock meanwhile: the tenant was being served then, which is no starvation.
func withoutTenantHolds(w waitSample, spans []holderSpan) time.Duration {
	d := w.end.Sub(w.start)
	for _, s := range spans {
		if !s.tenant {
			continue
		}
		from, to := maxTime(s.start, w.start), minTime(s.end, w.end)
		if to.After(from) {
			d -= to.Sub(from)
		}
	}
	return d
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
