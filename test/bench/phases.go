package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"
)

type handoffResult struct {
	Fencekeeper dist `json:"fencekeeper"`
	Raw         dist `json:"raw_lease_cas_watch"`
	// Floor: the handoff floor (floorhandoff.go), the same two
	// custom-resource writes and two watch hops without the operator
	// (reported beside the targets, not judged).
	Floor dist `json:"custom_resource_floor"`
	// FloorReleaseAnswered: when the floor's release PATCH was answered.
	FloorReleaseAnswered dist   `json:"custom_resource_floor_release_answered"`
	LeaderElection       dist   `json:"leaderelection_release_on_cancel"`
	LERetryPeriod        string `json:"leaderelection_retry_period"`
	// FirstTenthP99 and LastTenthP99: p99 of the first and last tenth of the
	// fencekeeper samples (history of released LockGrants grows in between).
	FirstTenthP99 float64 `json:"fencekeeper_first_tenth_p99_ms"`
	LastTenthP99  float64 `json:"fencekeeper_last_tenth_p99_ms"`
	P99Ratio      float64 `json:"p99_ratio_fencekeeper_over_raw"`
	// Stages: p50 and p99 (ms after the Release call) of each step of the
	// fencekeeper handoff, as the bench's own watches saw it.
	Stages []stage `json:"fencekeeper_stages"`
}

type stage struct {
	Name string  `json:"name"`
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
}

func stagesOf(s *handoffStages, ended string) []stage {
	var out []stage
	mk := func(name string, ds []time.Duration) {
		var ok []time.Duration
		for _, d := range ds {
			if d >= 0 {
				ok = append(ok, d)
			}
		}
		if len(ok) > 0 {
			x := summarize(ok)
			out = append(out, stage{name, x.P50, x.P99})
		}
	}
	mk("issuer's reconcile judged the lease expired (its clock, from the Expired condition)", s.IssuerNoticed)
	mk("release request answered (merge PATCH of spec.release; the owner skips the webhook)", s.ReleaseAnswered)
	mk("registry CAS visible (FencedResource fence+1)", s.RegistryCAS)
	mk("old holder's LockGrant "+ended+" visible", s.HolderReleased)
	mk("waiter's LockGrant Held visible", s.WaiterHeld)
	mk("waiter's Acquire returned", s.WaiterReturned)
	return out
}

func (r *report) handoff(ctx context.Context, e *env, cfg *config, log io.Writer) error {
	const ns = "bench-handoff"
	if err := e.namespace(ctx, ns); err != nil {
		return err
	}
	h := &handoffResult{LERetryPeriod: cfg.leRetry.String()}
	r.Handoff = h
	// Interleave the two mechanisms in blocks so that machine load drifts
	// affect both alike.
	const blocks = 4
	var fk, raw, floor, floorReleased []time.Duration
	stages := &handoffStages{}
	for b := 0; b < blocks; b++ {
		n := cfg.handoffs / blocks
		if b == blocks-1 {
			n = cfg.handoffs - n*(blocks-1)
		}
		warm := 0
		if b == 0 {
			warm = cfg.warmup
		}
		s, err := e.rawHandoffs(ctx, ns, fmt.Sprintf("raw-%d", b), warm, n)
		if err != nil {
			return fmt.Errorf("raw handoffs: %w", err)
		}
		raw = append(raw, s...)
		s, err = e.releaseHandoffs(ctx, ns, fmt.Sprintf("handoff-%d", b), nil, warm, n, stages)
		if err != nil {
			return fmt.Errorf("fencekeeper handoffs: %w", err)
		}
		fk = append(fk, s...)
		s, err = e.floorHandoffs(ctx, ns, fmt.Sprintf("floor-%d", b), fmt.Sprintf("handoff-%d", b), warm, n, &floorReleased)
		if err != nil {
			return fmt.Errorf("handoff floor: %w", err)
		}
		floor = append(floor, s...)
		fmt.Fprintf(log, "   block %d/%d: p50/p99 fencekeeper %.2f/%.2f ms, custom-resource floor %.2f/%.2f ms, raw %.2f/%.2f ms\n", b+1, blocks,
			summarize(fk).P50, summarize(fk).P99, summarize(floor).P50, summarize(floor).P99, summarize(raw).P50, summarize(raw).P99)
	}
	h.Fencekeeper, h.Raw, h.Floor, h.FloorReleaseAnswered = summarize(fk), summarize(raw), summarize(floor), summarize(floorReleased)
	tenth := max(1, len(fk)/10)
	h.FirstTenthP99 = summarize(fk[:tenth]).P99
	h.LastTenthP99 = summarize(fk[len(fk)-tenth:]).P99
	h.P99Ratio = ratio(h.Fencekeeper.P99, h.Raw.P99)
	h.Stages = stagesOf(stages, "Released")
	le, err := e.leaderElectionHandoffs(ctx, ns, min(5, cfg.warmup), cfg.leHandoffs, cfg.leRetry)
	if err != nil {
		return fmt.Errorf("leaderelection handoffs: %w", err)
	}
	h.LeaderElection = summarize(le)
	r.judge("release handoff p50", "fencekeeper p50 ≤ 3× raw CAS+watch p50", ratio(h.Fencekeeper.P50, h.Raw.P50), 3, "×",
		fmt.Sprintf("fencekeeper p50 %s ms vs raw %s ms over %d handoffs each", fmtF(h.Fencekeeper.P50), fmtF(h.Raw.P50), h.Fencekeeper.N))
	r.judge("release handoff p99", "fencekeeper p99 ≤ 3× raw CAS+watch p99", h.P99Ratio, 3, "×",
		fmt.Sprintf("fencekeeper p99 %s ms vs raw %s ms over %d handoffs each", fmtF(h.Fencekeeper.P99), fmtF(h.Raw.P99), h.Fencekeeper.N))
	return nil
}

type expiryResult struct {
	Fencekeeper dist `json:"fencekeeper"`
	// Stages: p50/p99 (ms after expiresAt) of each step, as the bench's own
	// watches saw it.
	Stages []stage `json:"fencekeeper_stages"`
}

func (r *report) expiry(ctx context.Context, e *env, cfg *config) error {
	const ns = "bench-expiry"
	if err := e.namespace(ctx, ns); err != nil {
		return err
	}
	stages := &handoffStages{}
	s, err := e.expiryHandoffs(ctx, ns, cfg.expiryPar, cfg.expiries, stages)
	if err != nil {
		return err
	}
	r.Expiry = &expiryResult{Fencekeeper: summarize(s), Stages: stagesOf(stages, "Expired")}
	r.judge("expiry handoff p99", "p99 from expiresAt to waiter HELD ≤ 30 ms", r.Expiry.Fencekeeper.P99, 30, "ms",
		fmt.Sprintf("%d expiries of 1 s leases", r.Expiry.Fencekeeper.N))
	return nil
}

func sortStrings(s []string) { sort.Strings(s) }
