package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
)

// The soak's control: the contract's floor handoff (floorhandoff.go: a
// release PATCH, a minimal issuer's CAS of the registry, two watch hops, on
// copies of the CRDs; no operator, queue or webhook) sampled in every window
// beside the honest workers, on a registry of its own. What the tenant's
// load does to it is what it does to the API server any implementation of
// the contract must use, so the honest lines are judged against it too: a
// limit the floor alone misses in the same run is out of reach on this
// machine, whatever the operator does.
const (
	soakFloorResource = "soak-floor"
	// soakFloorEvery paces the samples: about 4 a second, a tenth of the
	// honest workers' requests, enough for a p99 of the baseline windows.
	soakFloorEvery = 200 * time.Millisecond
)

// startFloor samples the floor handoff until ctx ends; the channel closes
// once it stopped. It starts once the honest lock was granted (the floor's
// objects copy a real grant's size).
func (s *soakRun) startFloor(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.sampleFloor(ctx); err != nil && ctx.Err() == nil {
			s.rec.mu.Lock()
			s.rec.floorErr = err.Error()
			s.rec.mu.Unlock()
			fmt.Fprintf(s.log, "   floor handoff stopped: %v\n", err)
		}
	}()
	return done
}

func (s *soakRun) sampleFloor(ctx context.Context) error {
	// Until a worker holds the honest lock, no LockGrant carries a grant to copy.
	for {
		if _, err := grantedStatusOf(ctx, s.e.admin, soakHonestNS, soakLock, "", locksv1.PhaseHeld); err == nil {
			break
		}
		if ctxtime.Sleep(ctx, 100*time.Millisecond) != nil {
			return nil
		}
	}
	h, err := s.e.newFloorHandoff(ctx, soakHonestNS, soakFloorResource, soakLock)
	if err != nil {
		return err
	}
	if err := h.grant(ctx, 0); err != nil {
		return err
	}
	for i := 1; ; i++ {
		next := time.Now().Add(soakFloorEvery)
		start := time.Now()
		took, _, err := h.sample(ctx, i)
		if err != nil {
			return err
		}
		s.rec.floorHandoff(start, took)
		if ctxtime.Sleep(ctx, time.Until(next)) != nil {
			return nil
		}
	}
}

// floorSlowdown is how much the hostile windows slowed the floor handoff:
// the pooled p99 ratio, and in how many hostile windows (with enough
// samples) the floor alone exceeded tailLimit × its baseline p99.
type floorSlowdown struct {
	quiet, hostile dist
	ratio          float64
	over, windows  int
	perWindow      []float64 // each hostile window's p99 over the baseline p99 (0: too few samples)
}

func slowdownOf(quiet []time.Duration, hostile [][]time.Duration) floorSlowdown {
	f := floorSlowdown{quiet: summarize(quiet), hostile: summarize(flat(hostile)), windows: len(hostile)}
	f.ratio = ratio(f.hostile.P99, f.quiet.P99)
	for _, w := range hostile {
		d := summarize(w)
		x := 0.0
		if d.N >= minWindowSamples && f.quiet.P99 > 0 {
			x = d.P99 / f.quiet.P99
		}
		f.perWindow = append(f.perWindow, x)
		if x > tailLimit {
			f.over++
		}
	}
	return f
}

// judged: the floor has enough samples on both sides to judge by.
func (f floorSlowdown) judged() bool {
	return f.quiet.N >= minTailSamples && f.hostile.N >= minTailSamples && f.quiet.P99 > 0
}

// outOfReach: the floor alone missed tailLimit, pooled and in most hostile
// windows: no implementation of the contract meets it on this machine.
func (f floorSlowdown) outOfReach() bool {
	return f.judged() && f.ratio > tailLimit && f.over >= f.windows/2+1
}

// againstFloor marks a check of the slowdown rule that failed (or could not
// be judged) while the floor alone missed the same limit: OUT OF REACH, with
// the floor's figures. The check against the floor then judges the line.
func (f floorSlowdown) againstFloor(c soakCheck) soakCheck {
	if !f.judged() {
		c.Detail += "; the floor handoff has too few samples to compare with"
		return c
	}
	c.Detail += fmt.Sprintf("; the floor handoff alone %s× (%s / %s ms), over %g× in %d of %d hostile windows",
		fmtF(f.ratio), fmtF(f.hostile.P99), fmtF(f.quiet.P99), tailLimit, f.over, f.windows)
	if c.Result != verdictPass && f.outOfReach() {
		c.Result = verdictOutOfReach
		c.Detail += ": out of reach on this machine for any implementation of the contract; judged against the floor instead"
	}
	return c
}

// checkAgainstFloor judges an honest slowdown (the hostile windows' p99
// over the baseline's) against the floor's in the same windows: at most
// floorLimit times it. FAIL when over, with enough samples, and over in most
// hostile windows on their own; otherwise INCONCLUSIVE.
func checkAgainstFloor(name string, quiet []time.Duration, hostile [][]time.Duration, f floorSlowdown) soakCheck {
	c := soakCheck{Name: name, Rule: fmt.Sprintf("hostile/quiet p99 ≤ %g× the floor handoff's", floorLimit)}
	q, h := summarize(quiet), summarize(flat(hostile))
	if q.N == 0 || h.N == 0 || !f.judged() || f.ratio == 0 {
		c.Result, c.Measured = verdictInconclusive, "n/a"
		c.Detail = fmt.Sprintf("samples: honest quiet %d, hostile %d; floor quiet %d, hostile %d", q.N, h.N, f.quiet.N, f.hostile.N)
		return c
	}
	honest := ratio(h.P99, q.P99)
	x := honest / f.ratio
	c.Measured = fmt.Sprintf("%s× (honest %s× / floor %s×)", fmtF(round2(x)), fmtF(honest), fmtF(f.ratio))
	over, counted := 0, 0
	var per []string
	for i, w := range hostile {
		d := summarize(w)
		if d.N < minWindowSamples || i >= len(f.perWindow) || f.perWindow[i] == 0 {
			per = append(per, "–")
			continue
		}
		wx := d.P99 / q.P99 / f.perWindow[i]
		per = append(per, fmtF(round2(wx)))
		counted++
		if wx > floorLimit {
			over++
		}
	}
	c.Detail = fmt.Sprintf("per hostile window %s; over in %d of %d", strings.Join(per, ", "), over, counted)
	switch {
	case x <= floorLimit:
		c.Result = verdictPass
	case q.N >= minTailSamples && h.N >= minTailSamples && over >= len(hostile)/2+1:
		c.Result = verdictFail
	default:
		c.Result = verdictInconclusive
	}
	return c
}
