package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

type scaleResult struct {
	Sizes        []scaleSize `json:"sizes"`
	MemorySource string      `json:"memory_source"`
	// Failover: the leader killed at the largest size (-failover).
	Failover *failoverResult `json:"failover,omitempty"`
}

type scaleSize struct {
	Resources   int     `json:"fencedresources"`
	Held        int     `json:"fencedresources_with_active_grants"`
	LoadSeconds float64 `json:"load_seconds"`
	// SettleSeconds: after the load, until the operator's issuer queue was empty.
	SettleSeconds float64 `json:"settle_seconds"`
	// OperatorRSSMiB is sampled after the load settled; OperatorPeakMiB is the
	// highest RSS sampled (every 250 ms) while loading and measuring.
	OperatorRSSMiB  float64 `json:"operator_rss_mib"`
	OperatorPeakMiB float64 `json:"operator_peak_rss_mib"`
	OperatorHeapMiB float64 `json:"operator_go_heap_inuse_mib"`
	APIServerRSSMiB float64 `json:"kube_apiserver_rss_mib"`
	EtcdRSSMiB      float64 `json:"etcd_rss_mib"`
	Handoff         dist    `json:"release_handoff"`
	// RawHandoff: the raw Lease CAS + watch handoff at the same size, the
	// control for what the platform itself does as it fills up.
	RawHandoff dist `json:"raw_lease_handoff"`
	// HandoffStages: where the release handoff's time goes at this size
	// (ms after Release was called), so that growth shows its step.
	HandoffStages []stage `json:"release_handoff_stages"`
	// HandoffWrites: the API server's own time for the handoff's two
	// writes while the handoffs ran (apiserver_request_duration_seconds).
	HandoffWrites handoffWrites `json:"release_handoff_writes"`
	Protected     dist          `json:"protected_update"`
	Unprotected   dist          `json:"unprotected_update"`
	// Webhook: during the protected and unprotected updates, the operator's
	// handler (fencekeeper_admission_duration_seconds) and the API server's
	// call to it (apiserver_admission_webhook_admission_duration_seconds),
	// UPDATEs only: whose time grows with the registry.
	Webhook webhookTimes `json:"webhook_updates"`
	// Acquire: uncontended Acquire (LockGrant create → HELD) on a fresh resource.
	Acquire dist `json:"uncontended_acquire"`
	// CreateWithTarget: creating a FencedResource with a target in the loaded
	// namespace (its webhook claims the target with a Lease create);
	// CreateFailures counts attempts the API server refused, with the first error.
	CreateWithTarget dist   `json:"create_fencedresource_with_target"`
	CreateFailures   int    `json:"create_fencedresource_with_target_failures"`
	CreateError      string `json:"create_fencedresource_with_target_error,omitempty"`
}

func mib(b uint64) float64 { return round2(float64(b) / (1 << 20)) }

func (r *report) scale(ctx context.Context, e *env, cfg *config, log io.Writer) error {
	const ns = "bench-scale"
	if err := e.namespace(ctx, ns); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// One follower of the namespace's LockGrants and FencedResources for the
	// whole section, started while it is empty: a follower started at 10,000
	// begins with LISTs of 10,000 objects, whose garbage the API server is
	// still collecting during the handoffs that follow.
	ph, err := e.followPhases(ctx, ns)
	if err != nil {
		return err
	}
	if err := e.followFences(ctx, ns, ph); err != nil {
		return err
	}
	s := &scaleResult{}
	r.Scale = s
	// Peak RSS: sampled throughout, reset per size.
	var peak atomic.Uint64
	go trackPeakRSS(ctx, e.op, &peak)
	// The protected objects exist before the registry grows around them
	// (creating a FencedResource with a target gets slower as the namespace
	// fills up; that is measured separately below).
	lc, kube, err := e.worker(ctx, ns)
	if err != nil {
		return err
	}
	pairs, release, err := newFencedPairs(ctx, e, ns, 4, lc, kube)
	if err != nil {
		return err
	}
	defer release()
	base := ph.held.Load()
	loaded := 0
	for _, size := range cfg.scaleSizes {
		peak.Store(0)
		t := time.Now()
		if err := e.load(ctx, ns, ph, base, loaded, size, cfg.heldAt(size), cfg.loaders, log); err != nil {
			return err
		}
		loaded = size
		x := scaleSize{Resources: size, Held: cfg.heldAt(size), LoadSeconds: round2(time.Since(t).Seconds())}
		// Let the operator finish its follow-up reconciles (a new entry's
		// first decision, queued behind requests, may still be queued) and
		// the runtime return what it does not use.
		x.SettleSeconds = round2(e.issuerDrained(ctx, log).Seconds())
		time.Sleep(5 * time.Second)
		m, err := e.op.Memory()
		if err != nil {
			return err
		}
		s.MemorySource = m.Source
		x.OperatorRSSMiB, x.OperatorHeapMiB = mib(m.RSS), mib(m.Heap)
		children := childRSS()
		x.APIServerRSSMiB, x.EtcdRSSMiB = mib(children["kube-apiserver"]), mib(children["etcd"])
		fmt.Fprintf(log, "   %d resources loaded in %.0fs, the issuer's queue empty %.0fs later: operator RSS %.0f MiB (heap %.0f MiB)\n",
			size, x.LoadSeconds, x.SettleSeconds, x.OperatorRSSMiB, x.OperatorHeapMiB)

		var stopProfiles func()
		if cfg.profilePhase == "scale" {
			e.heapProfiles(ctx, cfg, fmt.Sprintf("scale-%d", size), log)
			stopProfiles = e.startProfiles(ctx, cfg, fmt.Sprintf("scale-%d", size), log)
		}
		apiBefore, _ := e.apiserverMetrics(ctx)
		if x.Handoff, x.RawHandoff, x.HandoffStages, err = e.scaleHandoffs(ctx, ns, ph, size, cfg); err != nil {
			return err
		}
		x.HandoffWrites = e.handoffWriteLatency(ctx, apiBefore)

		if x.Acquire, err = e.uncontendedAcquires(ctx, ns, lc, size); err != nil {
			return err
		}

		if _, _, err := interleaved(ctx, pairs, 50, 10); err != nil {
			return err
		}
		opBefore, _ := e.op.Metrics(ctx)
		apiBefore, _ = e.apiserverMetrics(ctx)
		prot, unprot, err := interleaved(ctx, pairs, 50, cfg.scaleWebhook)
		if err != nil {
			return err
		}
		// Both webhooks: the unprotected twins go through vprotected-enrolled.
		x.Webhook = e.webhookTimesSince(ctx, opBefore, apiBefore, `type="validating"`)
		x.Protected, x.Unprotected = summarize(prot), summarize(unprot)
		if stopProfiles != nil {
			stopProfiles()
		}

		e.createsWithTarget(ctx, ns, size, &x)
		m, err = e.op.Memory()
		if err == nil && m.RSS > peak.Load() {
			peak.Store(m.RSS)
		}
		x.OperatorPeakMiB = mib(peak.Load())
		fmt.Fprintf(log, "   at %d: handoff p99 %.2f ms, protected p99 %.2f ms, peak RSS %.0f MiB, FencedResource-with-target creates refused: %d\n",
			size, x.Handoff.P99, x.Protected.P99, x.OperatorPeakMiB, x.CreateFailures)
		s.Sizes = append(s.Sizes, x)
	}
	r.judgeScale(s, cfg.scaleRSS)
	if cfg.failover {
		fo, err := e.failover(ctx, ns, ph, cfg, log)
		s.Failover = fo
		r.judgeFailover(fo, cfg.scaleRSS)
		if err != nil {
			fmt.Fprintf(log, "   failover failed: %v\n", err)
			return fmt.Errorf("failover: %w", err)
		}
	}
	return nil
}

// judgeScale judges the growth from the smallest size to the largest
// (handoff, webhook, FencedResource creation) and the operator's memory at
// the largest; it needs two sizes.
func (r *report) judgeScale(s *scaleResult, rssLimit float64) {
	if len(s.Sizes) < 2 {
		return
	}
	small, big := s.Sizes[0], s.Sizes[len(s.Sizes)-1]
	r.judge(fmt.Sprintf("scale handoff p99 %d vs %d", big.Resources, small.Resources), "growth ≤ 1.1× the raw Lease handoff's growth",
		ratio(ratio(big.Handoff.P99, small.Handoff.P99), ratio(big.RawHandoff.P99, small.RawHandoff.P99)), atMost(1.1), "×",
		fmt.Sprintf("handoff p99 %s ms at %d, %s ms at %d (control: raw Lease handoff p99 %s → %s ms, %s×); p50 growth %s× against the control's %s×",
			fmtF(big.Handoff.P99), big.Resources, fmtF(small.Handoff.P99), small.Resources, fmtF(small.RawHandoff.P99), fmtF(big.RawHandoff.P99),
			fmtF(ratio(big.RawHandoff.P99, small.RawHandoff.P99)), fmtF(ratio(big.Handoff.P50, small.Handoff.P50)), fmtF(ratio(big.RawHandoff.P50, small.RawHandoff.P50))))
	r.judge(fmt.Sprintf("scale webhook p99 %d vs %d", big.Resources, small.Resources), "growth ≤ 1.1× the unprotected update's growth",
		ratio(ratio(big.Protected.P99, small.Protected.P99), ratio(big.Unprotected.P99, small.Unprotected.P99)), atMost(1.1), "×",
		fmt.Sprintf("protected update p99 %s ms at %d, %s ms at %d (control: unprotected update p99 %s → %s ms, %s×); p50 growth %s× against the control's %s×",
			fmtF(big.Protected.P99), big.Resources, fmtF(small.Protected.P99), small.Resources, fmtF(small.Unprotected.P99), fmtF(big.Unprotected.P99),
			fmtF(ratio(big.Unprotected.P99, small.Unprotected.P99)), fmtF(ratio(big.Protected.P50, small.Protected.P50)), fmtF(ratio(big.Unprotected.P50, small.Unprotected.P50))))
	r.judge(fmt.Sprintf("FencedResource create p99 at %d", big.Resources), "≤ 50 ms", big.CreateWithTarget.P99, atMost(50), "ms",
		fmt.Sprintf("FencedResource-with-target creates: p99 %s ms at %d, %s ms at %d", fmtF(big.CreateWithTarget.P99), big.Resources,
			fmtF(small.CreateWithTarget.P99), small.Resources))
	r.judge(fmt.Sprintf("scale handoff p99 growth %d vs %d", big.Resources, small.Resources), "≤ 1.2×",
		ratio(big.Handoff.P99, small.Handoff.P99), atMost(1.2), "×",
		fmt.Sprintf("release handoff p99 %s ms at %d over %s ms at %d, measured in the same run", fmtF(big.Handoff.P99), big.Resources, fmtF(small.Handoff.P99), small.Resources))
	r.judge(fmt.Sprintf("scale protected-write p99 growth %d vs %d", big.Resources, small.Resources), "≤ 1.2×",
		ratio(big.Protected.P99, small.Protected.P99), atMost(1.2), "×",
		fmt.Sprintf("protected update p99 %s ms at %d over %s ms at %d, measured in the same run", fmtF(big.Protected.P99), big.Resources, fmtF(small.Protected.P99), small.Resources))
	r.judge(fmt.Sprintf("operator RSS at %d", big.Resources), fmt.Sprintf("peak RSS ≤ %s MiB", fmtF(rssLimit)), big.OperatorPeakMiB, atMost(rssLimit), "MiB",
		fmt.Sprintf("after load %s MiB, peak %s MiB, Go heap %s MiB (%s)", fmtF(big.OperatorRSSMiB), fmtF(big.OperatorPeakMiB), fmtF(big.OperatorHeapMiB), s.MemorySource))
}

// handoffWrites is the API server's time for a release handoff's writes:
// the holder's release (a LockGrant merge PATCH) and the issuer's registry
// compare-and-swaps (FencedResource status PUTs: the handoff, and the
// waiter's entry in the queue), p50 and p99 in ms
// interpolated within its histogram's buckets.
type handoffWrites struct {
	ReleaseP50  float64 `json:"release_patch_p50_ms"`
	ReleaseP99  float64 `json:"release_patch_p99_ms"`
	RegistryP50 float64 `json:"registry_put_p50_ms"`
	RegistryP99 float64 `json:"registry_put_p99_ms"`
}

// handoffWriteLatency reads the API server's request histogram again and
// keeps what the writes since before added (zero where a scrape failed).
// The handoffs are the only writers of both kinds meanwhile.
func (e *env) handoffWriteLatency(ctx context.Context, before string) handoffWrites {
	var w handoffWrites
	after, err := e.apiserverMetrics(ctx)
	if err != nil || before == "" {
		return w
	}
	const name = "apiserver_request_duration_seconds"
	h := histogramDelta(after, before, name, `resource="lockgrants"`, `subresource=""`, `verb="PATCH"`)
	w.ReleaseP50, w.ReleaseP99 = h.quantile(0.5)*1e3, h.quantile(0.99)*1e3
	h = histogramDelta(after, before, name, `resource="fencedresources"`, `subresource="status"`, `verb="PUT"`)
	w.RegistryP50, w.RegistryP99 = h.quantile(0.5)*1e3, h.quantile(0.99)*1e3
	return w
}

// trackPeakRSS keeps peak at the highest RSS of op, sampled every 250 ms
// until ctx ends.
func trackPeakRSS(ctx context.Context, op operatorProcess, peak *atomic.Uint64) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// /proc only: scraping the operator's metrics four times a
			// second made it allocate ~30 MB/s at 10,000 entries, and
			// its garbage collections showed up in the handoff tail.
			if m, err := op.Resident(); err == nil {
				raiseTo(peak, m.RSS)
			}
		}
	}
}

// raiseTo raises peak to v unless it is already as high.
func raiseTo(peak *atomic.Uint64, v uint64) {
	for {
		old := peak.Load()
		if v <= old || peak.CompareAndSwap(old, v) {
			return
		}
	}
}

// uncontendedAcquires measures uncontended acquire → release on a fresh
// resource: 30 cycles, the first 5 a warm-up.
func (e *env) uncontendedAcquires(ctx context.Context, ns string, lc *lockclient.Client, size int) (dist, error) {
	var acq []time.Duration
	acqRes := fmt.Sprintf("acquire-%d", size)
	if err := e.fencedResource(ctx, ns, acqRes, 60, ""); err != nil {
		return dist{}, err
	}
	for i := 0; i < 30; i++ {
		t := time.Now()
		l, err := lc.Acquire(ctx, acqRes, lockclient.AcquireOptions{})
		if err != nil {
			return dist{}, fmt.Errorf("acquire at %d: %w", size, err)
		}
		if i >= 5 {
			acq = append(acq, time.Since(t))
		}
		if err := l.Release(ctx); err != nil {
			return dist{}, err
		}
	}
	return summarize(acq), nil
}

// createsWithTarget measures FencedResource creation with a target: its
// webhook looks the target up in its cache and claims it. A refusal
// (webhook timeout) is a result: x counts it and keeps the first error.
func (e *env) createsWithTarget(ctx context.Context, ns string, size int, x *scaleSize) {
	var creates []time.Duration
	for i := 0; i < 5; i++ {
		name := fmt.Sprintf("target-probe-%d-%d", size, i)
		t := time.Now()
		if err := e.fencedResource(ctx, ns, name, 60, name); err != nil {
			x.CreateFailures++
			if x.CreateError == "" {
				x.CreateError = fmt.Sprintf("after %s: %v", time.Since(t).Round(time.Millisecond), err)
			}
			continue
		}
		creates = append(creates, time.Since(t))
	}
	x.CreateWithTarget = summarize(creates)
}

// scaleHandoffs measures release handoffs and the raw Lease handoff (the
// control) at one size, alternating sample by sample, the first of each
// pair alternating too, so that what the machine does meanwhile falls on
// both alike: a garbage collection in the API server, an etcd compaction,
// and the API server's cache consistency check, which decodes every entry
// every 5 to 7.5 minutes for seconds at a time (docs/performance.md, "Where
// the scale handoff's p99 grows"). Each of the blocks starts on fresh
// resources and fresh watches. stages says where fencekeeper's time went,
// step by step.
func (e *env) scaleHandoffs(ctx context.Context, ns string, ph *phases, size int, cfg *config) (fk, raw dist, stages []stage, err error) {
	const blocks = 6
	var hs, rs []time.Duration
	steps := &handoffStages{}
	for b := range blocks {
		n := cfg.scaleHandoffs / blocks
		if b == blocks-1 {
			n = cfg.scaleHandoffs - n*(blocks-1)
		}
		warm := min(5, cfg.warmup)
		if b == 0 {
			warm = min(20, cfg.warmup)
		}
		bh, br, err := e.alternateHandoffs(ctx, ns, fmt.Sprintf("%d-%d", size, b), ph, warm, n, steps)
		if err != nil {
			return fk, raw, nil, fmt.Errorf("handoffs at %d: %w", size, err)
		}
		hs, rs = append(hs, bh...), append(rs, br...)
	}
	return summarize(hs), summarize(rs), stagesOf(steps, "Released"), nil
}

// alternateHandoffs runs a fencekeeper loop (probe-<suffix>) and a raw
// Lease loop (raw-probe-<suffix>) side by side: warmup+n pairs, one
// handoff of each, the pair's order alternating; the first warmup pairs
// are not timed.
func (e *env) alternateHandoffs(ctx context.Context, ns, suffix string, ph *phases, warmup, n int, steps *handoffStages) (fk, raw []time.Duration, err error) {
	rl, err := e.newRawLoop(ctx, ns, "raw-probe-"+suffix)
	if err != nil {
		return nil, nil, fmt.Errorf("raw: %w", err)
	}
	fl, err := e.newReleaseLoop(ctx, ns, "probe-"+suffix, ph, steps)
	if err != nil {
		closeAfterFailure(ctx, rl)
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			closeAfterFailure(ctx, rl)
			closeAfterFailure(ctx, fl)
			return
		}
		err = errors.Join(wrapErr("raw", rl.close(ctx)), wrapErr("fencekeeper", fl.close(ctx)))
	}()
	return alternateSteps(ctx, fl, rl, warmup, n)
}

// alternateSteps steps fl and rl warmup+n times each, one step of each in
// turn, fl first on even pairs and rl first on odd ones; it returns the
// timed steps after the warmup pairs.
func alternateSteps(ctx context.Context, fl, rl handoffLoop, warmup, n int) (fk, raw []time.Duration, err error) {
	type loop struct {
		name string
		l    handoffLoop
		out  *[]time.Duration
	}
	fkLoop, rawLoop := loop{"fencekeeper", fl, &fk}, loop{"raw", rl, &raw}
	for i := range warmup + n {
		pair := [2]loop{fkLoop, rawLoop}
		if i%2 == 1 {
			pair = [2]loop{rawLoop, fkLoop}
		}
		for _, x := range pair {
			if err := stepInto(ctx, x.l, i >= warmup, x.out); err != nil {
				return nil, nil, wrapErr(x.name, err)
			}
		}
	}
	return fk, raw, nil
}

// load brings the namespace from `from` to `to` FencedResources, the first
// `held` of them with a held grant: loaders create the entries and
// LockGrants directly (as lockclient would, without a watch per grant) and
// wait until every grant is Held. Leases are an hour, so nothing renews
// during the run.
func (e *env) load(ctx context.Context, ns string, ph *phases, base int64, from, to, held, loaders int, log io.Writer) error {
	next := atomic.Int64{}
	next.Store(int64(from))
	var wg sync.WaitGroup
	errs := make(chan error, loaders)
	for l := 0; l < loaders; l++ {
		cfg, identity, err := e.user("loader", "fencekeeper:workers")
		if err != nil {
			return err
		}
		kube, err := client.New(cfg, client.Options{Scheme: locksv1.Scheme})
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(to) || ctx.Err() != nil {
					return
				}
				name := fmt.Sprintf("s-%06d", i)
				if err := retry(ctx, func() error { return client.IgnoreAlreadyExists(e.fencedResource(ctx, ns, name, 3600, "")) }); err != nil {
					errs <- err
					return
				}
				if i >= int64(held) {
					continue
				}
				req := fmt.Sprintf("load-%06d", i)
				lg := &locksv1.LockGrant{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: locksv1.LockGrantName(name, identity, req)},
					Spec: locksv1.LockGrantSpec{Resource: name, Owner: identity, RequestID: req, Lease: "lease-" + req,
						OperationRoot: lockclient.OperationRoot(name + "/" + req)},
				}
				if err := retry(ctx, func() error { return client.IgnoreAlreadyExists(kube.Create(ctx, lg.DeepCopy())) }); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	// Progress while the grants are issued.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	want := base + int64(min(to, held))
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	created := false
	deadline := time.Now().Add(30 * time.Minute)
	for {
		if created && ph.held.Load() >= want {
			return nil
		}
		select {
		case err := <-errs:
			return err
		case <-done:
			created = true
			done = nil
		case <-tick.C:
			fmt.Fprintf(log, "   … %d of %d grants held\n", ph.held.Load(), want)
			if time.Now().After(deadline) {
				return fmt.Errorf("only %d of %d grants held after 30 minutes", ph.held.Load(), want)
			}
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// issuerDrained waits until the operator's grant-issuer work queue is
// empty (its workqueue_depth, every priority), at most 30 minutes, and
// returns how long that took.
func (e *env) issuerDrained(ctx context.Context, log io.Writer) time.Duration {
	start, last := time.Now(), time.Now()
	for time.Since(start) < 30*time.Minute && ctx.Err() == nil {
		text, err := e.op.Metrics(ctx)
		if err != nil {
			break
		}
		depth := 0.0
		for k, v := range parseMetrics(text) {
			if strings.HasPrefix(k, `workqueue_depth{controller="grant-issuer"`) {
				depth += v
			}
		}
		if depth == 0 {
			break
		}
		if time.Since(last) > 10*time.Second {
			fmt.Fprintf(log, "   … the issuer has %.0f entries queued\n", depth)
			last = time.Now()
		}
		time.Sleep(time.Second)
	}
	return time.Since(start)
}

// retry retries transient failures (webhook timeouts under load, 429s).
func retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if err = f(); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
	return err
}
