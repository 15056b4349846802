package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// failoverResult is what a leader's death costs at the largest scale size:
// a standby replica (cmd/manager, its caches synced) takes over after the
// leader is killed with SIGKILL, while requests wait.
type failoverResult struct {
	Resources int `json:"fencedresources"`
	// Behind: waiters queued behind a holder that releases right after the
	// kill; Fresh: requests made right after the kill on idle resources.
	Behind int `json:"waiters_behind_a_release"`
	Fresh  int `json:"fresh_requests"`
	// KillToTakeoverMs: from SIGKILL to the standby holding the leader
	// Lease (its acquireTime): the leader-election lease, not fencekeeper.
	KillToTakeoverMs float64 `json:"kill_to_takeover_ms"`
	// FirstServedMs and AllServedMs: from the takeover to the first and the
	// last request seen Held; Served: each request's, ms after the takeover.
	FirstServedMs float64 `json:"takeover_to_first_grant_ms"`
	AllServedMs   float64 `json:"takeover_to_all_served_ms"`
	Served        dist    `json:"served_after_takeover"`
	Unserved      int     `json:"unserved"`
	// TakeoverWrites: the new leader's registry compare-and-swaps from the
	// takeover until they stopped (5 s without one), SettledMs when.
	TakeoverWrites float64 `json:"takeover_registry_writes"`
	SettledMs      float64 `json:"takeover_writes_settled_ms"`
	// StandbyRSSMiB: the standby before the kill, its caches synced;
	// LeaderPeakMiB and LeaderRSSMiB: the new leader during and after the takeover.
	StandbyRSSMiB float64 `json:"standby_rss_mib"`
	LeaderPeakMiB float64 `json:"new_leader_peak_rss_mib"`
	LeaderRSSMiB  float64 `json:"new_leader_settled_rss_mib"`
}

// failoverProbes is how many requests of each kind wait through the takeover.
const failoverProbes = 50

// failover kills the leader at the loaded size and times the standby's
// takeover; the standby then is the operator of the rest of the run.
func (e *env) failover(ctx context.Context, ns string, ph *phases, cfg *config, log io.Writer) (*failoverResult, error) {
	leader, ok := e.op.(*subprocess)
	if !ok {
		return nil, errors.New("needs the operator as a child process (not -in-process)")
	}
	var frs locksv1.FencedResourceList
	if err := e.admin.List(ctx, &frs, client.InNamespace(ns), client.Limit(1)); err != nil {
		return nil, err
	}
	res := &failoverResult{Resources: len(frs.Items) + int(ptrOr(frs.RemainingItemCount, 0)), Behind: failoverProbes, Fresh: failoverProbes}
	lc, _, err := e.worker(ctx, ns)
	if err != nil {
		return nil, err
	}
	waiterCfg, waiter, err := e.user("failover-waiter", localcp.WorkersGroup)
	if err != nil {
		return nil, err
	}
	kube, err := client.New(waiterCfg, client.Options{Scheme: locksv1.Scheme})
	if err != nil {
		return nil, err
	}
	// Holders with a waiter queued behind each, and idle resources for
	// the fresh requests.
	holders := make([]*lockclient.Lock, failoverProbes)
	var names []string
	for i := range failoverProbes {
		held, free := fmt.Sprintf("failover-held-%d", i), fmt.Sprintf("failover-free-%d", i)
		for _, n := range []string{held, free} {
			if err := e.fencedResource(ctx, ns, n, 3600, ""); err != nil {
				return res, err
			}
		}
		if holders[i], err = lc.Acquire(ctx, held, lockclient.AcquireOptions{}); err != nil {
			return res, err
		}
		lg := failoverRequest(ns, held, waiter, "behind")
		if err := kube.Create(ctx, lg); err != nil {
			return res, err
		}
		names = append(names, lg.Name)
	}
	for _, n := range names {
		if err := ph.waitWithin(ctx, n, time.Minute, locksv1.PhasePending); err != nil {
			return res, fmt.Errorf("waiter %s: %w", n, err)
		}
	}
	// The standby: webhooks move to it (every replica serves them), the
	// leader keeps issuing until it dies.
	fmt.Fprintf(log, "   failover: starting a standby replica\n")
	standby, err := launchOperator(ctx, e.cp, cfg, e.svc, filepath.Join(cfg.workDir(e.cp.Root()), "manager"), "manager-standby.log")
	if err != nil {
		return res, fmt.Errorf("standby: %w", err)
	}
	// The standby is the operator from here on, the leader's stop only
	// collects it; until then, an error stops the standby.
	defer func() {
		if e.op != operatorProcess(standby) {
			_ = standby.Stop()
		}
	}()
	rss := settledRSS(ctx, standby, 2*time.Minute)
	res.StandbyRSSMiB = mib(rss)
	holder, err := e.leaderHolder(ctx)
	if err != nil {
		return res, err
	}
	writes0 := registryWrites(ctx, standby)

	var peak atomic.Uint64
	pctx, stopPeak := context.WithCancel(ctx)
	defer stopPeak()
	go trackPeakRSS(pctx, standby, &peak)

	fmt.Fprintf(log, "   failover: killing the leader (standby RSS %.0f MiB)\n", res.StandbyRSSMiB)
	killed := time.Now()
	if err := leader.cmd.Process.Kill(); err != nil {
		return res, err
	}
	// Right after the kill: the holders release, fresh requests arrive.
	var wg sync.WaitGroup
	for _, l := range holders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			defer cancel()
			_ = l.Release(rctx) // its confirmation waits for the new leader
		}()
	}
	for i := range failoverProbes {
		lg := failoverRequest(ns, fmt.Sprintf("failover-free-%d", i), waiter, "fresh")
		if err := retry(ctx, func() error { return client.IgnoreAlreadyExists(kube.Create(ctx, lg.DeepCopy())) }); err != nil {
			return res, err
		}
		names = append(names, lg.Name)
	}
	takeover, err := e.waitNewLeader(ctx, holder, 2*time.Minute)
	if err != nil {
		return res, err
	}
	res.KillToTakeoverMs = ms(takeover.Sub(killed))
	fmt.Fprintf(log, "   failover: takeover %.1f s after the kill\n", takeover.Sub(killed).Seconds())

	var served []time.Duration
	deadline := time.Now().Add(2 * time.Minute)
	for _, n := range names {
		_ = ph.waitWithin(ctx, n, time.Until(deadline), locksv1.PhaseHeld)
		at := ph.seen(n, locksv1.PhaseHeld)
		if at.IsZero() {
			res.Unserved++
			continue
		}
		served = append(served, at.Sub(takeover))
	}
	if len(served) > 0 {
		res.FirstServedMs, res.AllServedMs = ms(slices.Min(served)), ms(slices.Max(served))
		res.Served = summarize(served)
	}
	wg.Wait()
	// The takeover's own writes: until none for 5 s.
	last, lastAt := registryWrites(ctx, standby), time.Now()
	for time.Since(lastAt) < 5*time.Second && time.Since(takeover) < 20*time.Minute && ctx.Err() == nil {
		time.Sleep(time.Second)
		if w := registryWrites(ctx, standby); w != last {
			last, lastAt = w, time.Now()
		}
	}
	res.TakeoverWrites, res.SettledMs = last-writes0, ms(lastAt.Sub(takeover))
	stopPeak()
	if m, err := standby.Resident(); err == nil {
		res.LeaderRSSMiB = mib(m.RSS)
		raiseTo(&peak, m.RSS)
	}
	res.LeaderPeakMiB = mib(peak.Load())
	_ = leader.Stop()
	e.op = standby
	fmt.Fprintf(log, "   failover: first grant %.2f s, all %d served %.2f s after the takeover (%d unserved); %.0f registry writes until %.1f s after it\n",
		res.FirstServedMs/1000, len(served), res.AllServedMs/1000, res.Unserved, res.TakeoverWrites, res.SettledMs/1000)
	return res, nil
}

// failoverRequest is a LockGrant as lockclient creates it, for owner on resource.
func failoverRequest(ns, resource, owner, kind string) *locksv1.LockGrant {
	req := "failover-" + kind
	return &locksv1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: locksv1.LockGrantName(resource, owner, req)},
		Spec: locksv1.LockGrantSpec{Resource: resource, Owner: owner, RequestID: req, Lease: "lease-" + resource,
			OperationRoot: lockclient.OperationRoot(resource + "/" + req)},
	}
}

// leaderHolder reads the leader-election Lease's holder.
func (e *env) leaderHolder(ctx context.Context) (string, error) {
	l, err := e.adminC.CoordinationV1().Leases(locksv1.DefaultNamespace).Get(ctx, locksv1.LeaderElectionID, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if l.Spec.HolderIdentity == nil {
		return "", errors.New("the leader Lease has no holder")
	}
	return *l.Spec.HolderIdentity, nil
}

// waitNewLeader returns when another holder than old acquired the leader
// Lease: its acquireTime (the same machine's clock).
func (e *env) waitNewLeader(ctx context.Context, old string, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		l, err := e.adminC.CoordinationV1().Leases(locksv1.DefaultNamespace).Get(ctx, locksv1.LeaderElectionID, metav1.GetOptions{})
		if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != old && l.Spec.AcquireTime != nil {
			return l.Spec.AcquireTime.Time, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Time{}, fmt.Errorf("no new leader within %s of the kill", timeout)
}

// settledRSS waits until s's RSS grew by under 1 % over 5 s (its caches
// synced), at most timeout, and returns it.
func settledRSS(ctx context.Context, s *subprocess, timeout time.Duration) uint64 {
	var prev uint64
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(5 * time.Second)
		m, err := s.Resident()
		if err != nil {
			return prev
		}
		if prev > 0 && m.RSS < prev+prev/100 {
			return m.RSS
		}
		prev = m.RSS
	}
	return prev
}

// registryWrites reads the operator's fencekeeper_registry_writes_total.
func registryWrites(ctx context.Context, s *subprocess) float64 {
	text, err := s.Metrics(ctx)
	if err != nil {
		return 0
	}
	return parseMetrics(text)["fencekeeper_registry_writes_total"]
}

// waitWithin is wait with a timeout.
func (p *phases) waitWithin(ctx context.Context, name string, timeout time.Duration, want ...locksv1.LockGrantPhase) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := p.wait(ctx, name, want...)
	return err
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// judgeFailover judges the takeover: the first grant within 5 s and every
// waiting request within 30 s of it, and both replicas' memory.
func (r *report) judgeFailover(f *failoverResult, rssLimit float64) {
	if f == nil {
		return
	}
	r.judge(fmt.Sprintf("failover first grant at %d", f.Resources), "≤ 5 s after the takeover", f.FirstServedMs/1000, atMost(5), "s",
		fmt.Sprintf("the standby took the leader Lease %.1f s after the leader was killed (the leader-election lease, reported); %d waiters behind a release and %d fresh requests",
			f.KillToTakeoverMs/1000, f.Behind, f.Fresh))
	all := f.AllServedMs / 1000
	if f.Unserved > 0 {
		all = math.NaN() // some never served: not measured, FAIL
	}
	r.judge(fmt.Sprintf("failover every waiting request served at %d", f.Resources), "≤ 30 s after the takeover", all, atMost(30), "s",
		fmt.Sprintf("p50 %.2f s, p99 %.2f s after the takeover; %d unserved; the new leader made %.0f registry writes until %.1f s after it",
			f.Served.P50/1000, f.Served.P99/1000, f.Unserved, f.TakeoverWrites, f.SettledMs/1000))
	r.judge(fmt.Sprintf("standby and new leader RSS at %d", f.Resources), fmt.Sprintf("peak RSS ≤ %s MiB", fmtF(rssLimit)), max(f.StandbyRSSMiB, f.LeaderPeakMiB), atMost(rssLimit), "MiB",
		fmt.Sprintf("standby %s MiB with its caches synced; new leader peak %s MiB, %s MiB settled", fmtF(f.StandbyRSSMiB), fmtF(f.LeaderPeakMiB), fmtF(f.LeaderRSSMiB)))
}

// webhookService stands in for the operator's Service in front of its
// replicas: a loopback TCP forwarder (TLS passes through) to the newest
// replica that accepts a connection. Each replica's admission guard keeps
// the webhook configuration's clientConfig as it first found it, so the
// URL must outlive the leader the bench kills, as a Service's does.
type webhookService struct {
	ln       net.Listener
	mu       sync.Mutex
	backends []string // newest first
}

func newWebhookService(ctx context.Context) (*webhookService, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &webhookService{ln: ln}
	go func() {
		<-ctx.Done()
		_ = ln.Close()
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.forward(c)
		}
	}()
	return s, nil
}

func (s *webhookService) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// add makes addr the replica new connections try first.
func (s *webhookService) add(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.backends = append([]string{addr}, s.backends...)
}

func (s *webhookService) forward(c net.Conn) {
	defer c.Close()
	s.mu.Lock()
	backends := slices.Clone(s.backends)
	s.mu.Unlock()
	for _, b := range backends {
		up, err := net.DialTimeout("tcp", b, time.Second)
		if err != nil {
			continue
		}
		defer up.Close()
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
		go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
		<-done
		return
	}
}
