package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"
)

type handoffResult struct {
	Fencekeeper dist `json:"fencekeeper"`
	Raw         dist `json:"raw_lease_cas_watch"`
	// Floor: the handoff floor (floorhandoff.go), the same two
	// custom-resource writes and two watch hops without the operator
	// (reported beside the targets, not judged).
	Floor dist `json:"custom_resource_floor"`
	// OneWrite: the one-write handoff floor (flooronewrite.go): the
	// holder's release promotes a pre-signed queue head in one registry
	// CAS. Reported, not judged: the contract does not allow it yet.
	OneWrite dist `json:"one_write_floor"`
	// samples: every sample, for the plots.
	samples *handoffSampleSet
	// FloorReleaseAnswered: when the floor's release PATCH was answered.
	FloorReleaseAnswered dist   `json:"custom_resource_floor_release_answered"`
	LeaderElection       dist   `json:"leaderelection_release_on_cancel"`
	LERetryPeriod        string `json:"leaderelection_retry_period"`
	// FirstTenthP99 and LastTenthP99: p99 of the first and last tenth of the
	// fencekeeper samples (history of released LockGrants grows in between).
	FirstTenthP99 float64 `json:"fencekeeper_first_tenth_p99_ms"`
	LastTenthP99  float64 `json:"fencekeeper_last_tenth_p99_ms"`
	P99Ratio      float64 `json:"p99_ratio_fencekeeper_over_raw"`
	// P50OverFloor and P99OverFloor: fencekeeper's p50 and p99 over the
	// floor's, block by block (the tail rule's repetitions).
	P50OverFloor []float64 `json:"p50_over_floor_by_block"`
	P99OverFloor []float64 `json:"p99_over_floor_by_block"`
	// Stages: p50 and p99 (ms after the Release call) of each step of the
	// fencekeeper handoff, as the bench's own watches saw it.
	Stages []stage `json:"fencekeeper_stages"`
}

type handoffSampleSet struct {
	fencekeeper, floor, oneWrite, raw []time.Duration
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
	mk("issuer decided the expiry and the next grant (the new grant's issuedAt, its clock)", s.IssuerDecided)
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
	// Interleave the mechanisms in blocks, rotating their order from block
	// to block, so that machine load drifts and a block's position affect
	// them alike. Each block is one repetition of the tail rule. The floor
	// copies the status of fencekeeper's first resource (handoff-0), which
	// the first block's order fills before the floor runs.
	var fk, raw, floor, oneWrite, floorReleased []time.Duration
	stages := &handoffStages{}
	for b := 0; b < repetitionCount; b++ {
		n := cfg.handoffs / repetitionCount
		if b == repetitionCount-1 {
			n = cfg.handoffs - n*(repetitionCount-1)
		}
		warm := 0
		if b == 0 {
			warm = cfg.warmup
		}
		var bfk, braw, bfloor, bone []time.Duration
		runs := []func() error{
			func() (err error) {
				braw, err = e.rawHandoffs(ctx, ns, fmt.Sprintf("raw-%d", b), warm, n)
				return wrapErr("raw handoffs", err)
			},
			func() (err error) {
				bfk, err = e.releaseHandoffs(ctx, ns, fmt.Sprintf("handoff-%d", b), nil, warm, n, stages)
				return wrapErr("fencekeeper handoffs", err)
			},
			func() (err error) {
				bfloor, err = e.floorHandoffs(ctx, ns, fmt.Sprintf("floor-%d", b), "handoff-0", warm, n, &floorReleased)
				return wrapErr("handoff floor", err)
			},
			func() (err error) {
				bone, err = e.oneWriteHandoffs(ctx, ns, fmt.Sprintf("one-write-%d", b), "handoff-0", warm, n)
				return wrapErr("one-write handoff floor", err)
			},
		}
		for i := range runs {
			if err := runs[(i+b)%len(runs)](); err != nil {
				return err
			}
		}
		fk, raw, floor, oneWrite = append(fk, bfk...), append(raw, braw...), append(floor, bfloor...), append(oneWrite, bone...)
		sk, sf, sr := summarize(bfk), summarize(bfloor), summarize(braw)
		h.P50OverFloor = append(h.P50OverFloor, ratio(sk.P50, sf.P50))
		h.P99OverFloor = append(h.P99OverFloor, ratio(sk.P99, sf.P99))
		fmt.Fprintf(log, "   block %d/%d: p50/p99 fencekeeper %.2f/%.2f ms, custom-resource floor %.2f/%.2f ms, raw %.2f/%.2f ms\n", b+1, repetitionCount,
			sk.P50, sk.P99, sf.P50, sf.P99, sr.P50, sr.P99)
	}
	h.Fencekeeper, h.Raw, h.Floor, h.FloorReleaseAnswered = summarize(fk), summarize(raw), summarize(floor), summarize(floorReleased)
	h.OneWrite = summarize(oneWrite)
	h.samples = &handoffSampleSet{fencekeeper: fk, floor: floor, oneWrite: oneWrite, raw: raw}
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
	pooled := fmt.Sprintf("all blocks: fencekeeper p50/p99 %s/%s ms, floor %s/%s ms, raw Lease %s/%s ms over %d handoffs each",
		fmtF(h.Fencekeeper.P50), fmtF(h.Fencekeeper.P99), fmtF(h.Floor.P50), fmtF(h.Floor.P99), fmtF(h.Raw.P50), fmtF(h.Raw.P99), h.Fencekeeper.N)
	e.mu.Lock()
	stalls := slices.Clone(e.stalls)
	e.mu.Unlock()
	r.judge("release handoff waiters queued", "every waiter queued within a minute (stalls, all handoffs of the phase)", float64(len(stalls)), atMost(0), "",
		strings.Join(stalls, "; "))
	r.judgeTail("release handoff p50 against the floor", "fencekeeper p50 ≤ 1.2× the handoff floor's, per block", h.P50OverFloor, atMost(1.2), "×", pooled)
	r.judgeTail("release handoff p99 against the floor", "fencekeeper p99 ≤ 1.3× the handoff floor's, per block", h.P99OverFloor, atMost(1.3), "×", "")
	r.report("release handoff against raw Lease", "fencekeeper p50 / raw CAS+watch p50 (p99 in the detail)", ratio(h.Fencekeeper.P50, h.Raw.P50),
		fmt.Sprintf("p99 %s×; the floor alone is %s× / %s× raw", fmtF(h.P99Ratio), fmtF(ratio(h.Floor.P50, h.Raw.P50)), fmtF(ratio(h.Floor.P99, h.Raw.P99))))
	r.report("one-write handoff floor", "its p50 / the contract's floor's p50 (p99 in the detail)", ratio(h.OneWrite.P50, h.Floor.P50),
		fmt.Sprintf("p99 %s×; against raw Lease %s× / %s× (docs/one-write-handoff.md)", fmtF(ratio(h.OneWrite.P99, h.Floor.P99)),
			fmtF(ratio(h.OneWrite.P50, h.Raw.P50)), fmtF(ratio(h.OneWrite.P99, h.Raw.P99))))
	return nil
}

// wrapErr prefixes err with what failed; nil stays nil.
func wrapErr(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

type expiryResult struct {
	Fencekeeper dist `json:"fencekeeper"`
	// Stages: p50/p99 (ms after expiresAt) of each step, as the bench's own
	// watches saw it.
	Stages []stage `json:"fencekeeper_stages"`
	// P99Reps: the p99 of each of the five consecutive parts of the samples.
	P99Reps []float64 `json:"p99_repetitions"`
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
	// Repetitions: the samples in the order they were taken, in five
	// consecutive parts; each part spans every chain.
	for _, part := range parts(s, repetitionCount) {
		r.Expiry.P99Reps = append(r.Expiry.P99Reps, summarize(part).P99)
	}
	r.judgeTail("expiry handoff p99", "p99 from expiresAt to waiter HELD ≤ 30 ms", r.Expiry.P99Reps, atMost(30), "ms",
		fmt.Sprintf("%d expiries of 1 s leases; all pooled p99 %s ms", r.Expiry.Fencekeeper.N, fmtF(r.Expiry.Fencekeeper.P99)))
	return nil
}

// parts cuts s into k consecutive parts of nearly equal length (fewer when
// s is shorter than k).
func parts[T any](s []T, k int) [][]T {
	var out [][]T
	for i := 0; i < k; i++ {
		lo, hi := i*len(s)/k, (i+1)*len(s)/k
		if hi > lo {
			out = append(out, s[lo:hi])
		}
	}
	return out
}

func sortStrings(s []string) { sort.Strings(s) }
