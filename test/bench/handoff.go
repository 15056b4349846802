package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// watchSignal wraps a worker's transport and reports when its watch of the
// registry is established (the API server answered the watch request), so a
// measurement starts only once the waiter is really following its request:
// a waiter learns it holds from the registry's holder record. (It opens a
// watch of its LockGrant only after waiting a second, lockclient's
// grantWatchAfter; waiting for that watch too made every sample wait a
// second and release just as that watch opened.)
type watchSignal struct {
	mu sync.Mutex
	ch chan struct{}
	// registry counts the registry watches open: answered, and their
	// response bodies not closed yet. The client keeps one per resource
	// across requests it makes again soon, and reopens it after an error.
	registry int
	// put is when the last PUT or PATCH of a LockGrant (renewal or release) was answered.
	put time.Time
}

// closeHook calls closed once, when the body is closed.
type closeHook struct {
	io.ReadCloser
	once   sync.Once
	closed func()
}

func (c *closeHook) Close() error {
	err := c.ReadCloser.Close()
	c.once.Do(c.closed)
	return err
}

func (s *watchSignal) lastPut() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.put
}

func (s *watchSignal) arm() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	if s.registry > 0 {
		close(ch) // the client follows the registry already
		return ch
	}
	s.ch = ch
	return ch
}

func (s *watchSignal) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil && (req.Method == http.MethodPut || req.Method == http.MethodPatch) && strings.Contains(req.URL.Path, "/lockgrants/") {
			s.mu.Lock()
			s.put = time.Now()
			s.mu.Unlock()
		}
		if err == nil && req.URL.Query().Get("watch") == "true" && strings.HasSuffix(req.URL.Path, "/fencedresources") {
			s.mu.Lock()
			s.registry++
			if s.ch != nil {
				close(s.ch)
				s.ch = nil
			}
			s.mu.Unlock()
			resp.Body = &closeHook{ReadCloser: resp.Body, closed: func() {
				s.mu.Lock()
				s.registry--
				s.mu.Unlock()
			}}
		}
		return resp, err
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// signalledWorker is a lockclient worker whose watches are signalled.
type signalledWorker struct {
	c   *lockclient.Client
	sig *watchSignal
}

func (e *env) signalledWorker(ctx context.Context, ns string) (*signalledWorker, error) {
	cfg, _, err := e.user("worker", localcp.WorkersGroup)
	if err != nil {
		return nil, err
	}
	sig := &watchSignal{}
	cfg.Wrap(sig.wrap)
	c, err := lockclient.NewForConfig(ctx, cfg, ns)
	if err != nil {
		return nil, err
	}
	return &signalledWorker{c: c, sig: sig}, nil
}

type acquired struct {
	lock *lockclient.Lock
	at   time.Time
	err  error
}

// handoffLoop is one resource handed back and forth between two workers,
// one handoff per step. Steps of two loops can alternate, so that what the
// machine does meanwhile falls on both sample by sample.
type handoffLoop interface {
	// step makes one handoff; sampled is false when it could not be timed
	// (a liveness failure the loop recorded and recovered from).
	step(ctx context.Context, record bool) (d time.Duration, sampled bool, err error)
	// close releases the last holder and stops the loop's watches.
	close(ctx context.Context) error
}

// runHandoffs steps l warmup+n times and returns the n timed handoffs.
func runHandoffs(ctx context.Context, l handoffLoop, warmup, n int) ([]time.Duration, error) {
	var out []time.Duration
	for i := 0; i < warmup+n; i++ {
		if err := stepInto(ctx, l, i >= warmup, &out); err != nil {
			closeAfterFailure(ctx, l)
			return nil, err
		}
	}
	return out, l.close(ctx)
}

// stepInto steps l once and, when record is set and the step was timed,
// appends its duration to out.
func stepInto(ctx context.Context, l handoffLoop, record bool, out *[]time.Duration) error {
	d, sampled, err := l.step(ctx, record)
	if err != nil {
		return err
	}
	if sampled && record {
		*out = append(*out, d)
	}
	return nil
}

// closeAfterFailure closes l after a failed step, for a bounded time: the
// operator that failed may never confirm the release Lock.Release waits for.
func closeAfterFailure(ctx context.Context, l handoffLoop) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = l.close(ctx)
}

// releaseHandoffs measures fencekeeper's release handoff on one resource
// (see releaseLoop).
func (e *env) releaseHandoffs(ctx context.Context, ns, resource string, ph *phases, warmup, n int, stages *handoffStages) ([]time.Duration, error) {
	l, err := e.newReleaseLoop(ctx, ns, resource, ph, stages)
	if err != nil {
		return nil, err
	}
	return runHandoffs(ctx, l, warmup, n)
}

// releaseLoop: holder A releases (lockclient Lock.Release) while waiter B
// is queued (Pending) and following the registry; the sample ends when B's
// Acquire returns HELD with fence+1. Holder and waiter alternate between
// two workers. ph follows the namespace's LockGrants and FencedResources;
// nil starts followers of its own (each begins with a LIST of the
// namespace). stages, when not nil, gets each recorded handoff's steps.
type releaseLoop struct {
	e            *env
	ns, resource string
	ph           *phases
	stages       *handoffStages
	workers      [2]*signalledWorker
	holder       *lockclient.Lock
	handoffs     int
	stop         context.CancelFunc
}

func (e *env) newReleaseLoop(ctx context.Context, ns, resource string, ph *phases, stages *handoffStages) (*releaseLoop, error) {
	if err := e.fencedResource(ctx, ns, resource, 60, ""); err != nil {
		return nil, err
	}
	// The workers' and followers' watches live until close.
	ctx, cancel := context.WithCancel(ctx)
	l := &releaseLoop{e: e, ns: ns, resource: resource, ph: ph, stages: stages, stop: cancel}
	err := l.start(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	return l, nil
}

func (l *releaseLoop) start(ctx context.Context) error {
	var err error
	if l.ph == nil {
		if l.ph, err = l.e.followPhases(ctx, l.ns); err != nil {
			return err
		}
		if err = l.e.followFences(ctx, l.ns, l.ph); err != nil {
			return err
		}
	}
	for i := range l.workers {
		if l.workers[i], err = l.e.signalledWorker(ctx, l.ns); err != nil {
			return err
		}
	}
	l.holder, err = l.workers[0].c.Acquire(ctx, l.resource, lockclient.AcquireOptions{})
	return err
}

func (l *releaseLoop) close(ctx context.Context) error {
	defer l.stop()
	return l.holder.Release(ctx)
}

func (l *releaseLoop) step(ctx context.Context, record bool) (time.Duration, bool, error) {
	prev, next := l.workers[l.handoffs%2], l.workers[(l.handoffs+1)%2]
	l.handoffs++
	reqID := lockclient.NewRequestID()
	watching := next.sig.arm()
	ch := make(chan acquired, 1)
	go func() {
		lock, err := next.c.Acquire(ctx, l.resource, lockclient.AcquireOptions{RequestID: reqID})
		ch <- acquired{lock, time.Now(), err}
	}()
	if err := l.e.waitQueued(ctx, l.ph, l.ns, l.resource, next.c.LockGrantName(l.resource, reqID)); err != nil {
		if ctx.Err() != nil {
			return 0, false, err
		}
		return 0, false, l.afterStall(ctx, err, ch)
	}
	select {
	case <-watching:
	case <-ctx.Done():
		return 0, false, ctx.Err()
	}
	t0 := time.Now()
	if err := l.holder.Release(ctx); err != nil {
		return 0, false, fmt.Errorf("release: %w", err)
	}
	r := <-ch
	if r.err != nil {
		return 0, false, fmt.Errorf("waiter acquire: %w", r.err)
	}
	if r.lock.Fence() != l.holder.Fence()+1 {
		return 0, false, fmt.Errorf("handoff %d: waiter got fence %d after fence %d", l.handoffs, r.lock.Fence(), l.holder.Fence())
	}
	if record && l.stages != nil {
		// The waiter returns on the registry's record; its LockGrant
		// mirror follows: wait for it, to report when it became visible.
		if _, err := l.ph.wait(ctx, r.lock.Name(), locksv1.PhaseHeld, locksv1.PhaseReleased); err != nil {
			return 0, false, err
		}
		l.stages.add(t0, prev.sig.lastPut(), l.ph.fenceSeen(l.resource, r.lock.Fence()),
			l.ph.seen(l.holder.Name(), locksv1.PhaseReleased), l.ph.seen(r.lock.Name(), locksv1.PhaseHeld), r.at)
	}
	l.holder = r.lock
	return r.at.Sub(t0), true, nil
}

// afterStall: the waiter was not seen queued, a liveness failure, counted
// and judged; the handoff goes on unsampled.
func (l *releaseLoop) afterStall(ctx context.Context, stall error, ch <-chan acquired) error {
	l.e.mu.Lock()
	l.e.stalls = append(l.e.stalls, stall.Error())
	l.e.mu.Unlock()
	fmt.Fprintf(l.e.log, "   STALL: %v\n", stall)
	if err := l.holder.Release(ctx); err != nil {
		return fmt.Errorf("release after a stall: %w", err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return fmt.Errorf("waiter acquire after a stall: %w", r.err)
		}
		l.holder = r.lock
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("the waiter did not hold within a minute of the release after a stall: %w", stall)
	}
}

// waitQueued waits until the LockGrant name is queued behind the holder
// (Pending, or in the registry's queue). A waiter never queued is a
// liveness failure of the operator: after a minute the error says what the
// registry and the LockGrant show, instead of the bench waiting forever.
func (e *env) waitQueued(ctx context.Context, ph *phases, ns, resource, name string) error {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err := ph.wait(wctx, name, locksv1.PhasePending)
	if err == nil || ctx.Err() != nil {
		return err
	}
	var fr locksv1.FencedResource
	var lg locksv1.LockGrant
	frErr := e.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: resource}, &fr)
	lgErr := e.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &lg)
	holder := "none"
	if h := fr.Status.Holder; h != nil {
		holder = fmt.Sprintf("%s (fence %d)", h.GrantName, h.FenceToken)
	}
	return fmt.Errorf("%w; registry %s at %s (%v): holder %s, queue %v; LockGrant (%v): phase %q, conditions %v",
		err, resource, fr.ResourceVersion, frErr, holder, fr.Status.Queue, lgErr, lg.Status.Phase, lg.Status.Conditions)
}

// handoffStages: where the time of a fencekeeper handoff goes, each stage
// measured from the holder's Release call (the bench's own watches see the
// registry and LockGrant changes, as the waiter's watch does).
type handoffStages struct {
	IssuerDecided                                                            []time.Duration
	ReleaseAnswered, RegistryCAS, HolderReleased, WaiterHeld, WaiterReturned []time.Duration
}

// issuedAt is when the issuer decided the grant l holds, on its clock: the
// signed grant's issuedAt. For an expiry handoff it is the decision that
// ended the old holder and issued the next grant in one compare-and-swap.
// (The old holder's Expired condition is no such record: a later decision's
// plan can replace the first one's unwritten status write, with its own time.)
func issuedAt(l *lockclient.Lock) time.Time {
	g, _ := l.Grant()
	t, err := time.Parse(time.RFC3339Nano, g.IssuedAt)
	if err != nil {
		return time.Time{}
	}
	return t
}

func (s *handoffStages) add(t0, put, cas, released, held, returned time.Time) {
	d := func(t time.Time) time.Duration {
		if t.IsZero() || t.Before(t0) {
			return -1
		}
		return t.Sub(t0)
	}
	s.ReleaseAnswered = append(s.ReleaseAnswered, d(put))
	s.RegistryCAS = append(s.RegistryCAS, d(cas))
	s.HolderReleased = append(s.HolderReleased, d(released))
	s.WaiterHeld = append(s.WaiterHeld, d(held))
	s.WaiterReturned = append(s.WaiterReturned, d(returned))
}

// --- the raw baseline: resourceVersion CAS on a Lease plus a watch -----------

// rawLease is the do-it-yourself lock: holderIdentity on a coordination.k8s.io
// Lease, taken and given back by compare-and-swap on its resourceVersion;
// leaseTransitions is the fence. A waiter watches the Lease until it is free.
type rawLease struct {
	cs       kubernetes.Interface
	ns, name string
	id       string
	// attempts counts CAS writes (successful or conflicting).
	attempts, conflicts int
}

func createRawLease(ctx context.Context, cs kubernetes.Interface, ns, name string) error {
	_, err := cs.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, metav1.CreateOptions{})
	return err
}

func leaseHolder(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// acquire takes the Lease; watching (if not nil) is closed once the waiter's
// watch is established.
func (r *rawLease) acquire(ctx context.Context, watching chan<- struct{}) (*coordinationv1.Lease, error) {
	leases := r.cs.CoordinationV1().Leases(r.ns)
	cur, err := leases.Get(ctx, r.name, metav1.GetOptions{})
	for {
		if err != nil {
			return nil, err
		}
		if leaseHolder(cur) == "" {
			next := cur.DeepCopy()
			id := r.id
			next.Spec.HolderIdentity = &id
			n := int32(0)
			if cur.Spec.LeaseTransitions != nil {
				n = *cur.Spec.LeaseTransitions
			}
			n++
			next.Spec.LeaseTransitions = &n
			now := metav1.NowMicro()
			next.Spec.AcquireTime = &now
			r.attempts++
			// uerr, not err: the Get below must set the loop's err.
			got, uerr := leases.Update(ctx, next, metav1.UpdateOptions{})
			if uerr == nil {
				if watching != nil {
					close(watching)
				}
				return got, nil
			}
			if !apierrors.IsConflict(uerr) {
				return nil, uerr
			}
			r.conflicts++
			cur, err = leases.Get(ctx, r.name, metav1.GetOptions{})
			continue
		}
		w, werr := leases.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", r.name).String(),
			ResourceVersion: cur.ResourceVersion})
		if werr != nil {
			return nil, werr
		}
		if watching != nil {
			close(watching)
			watching = nil
		}
		freed := false
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				break
			}
			cur = l
			if leaseHolder(l) == "" {
				freed = true
				break
			}
		}
		w.Stop()
		if !freed {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			cur, err = leases.Get(ctx, r.name, metav1.GetOptions{})
		}
	}
}

// release gives the Lease back by CAS on the revision the holder got.
func (r *rawLease) release(ctx context.Context, held *coordinationv1.Lease) error {
	next := held.DeepCopy()
	next.Spec.HolderIdentity = nil
	r.attempts++
	_, err := r.cs.CoordinationV1().Leases(r.ns).Update(ctx, next, metav1.UpdateOptions{})
	return err
}

func fenceOf(l *coordinationv1.Lease) int32 {
	if l.Spec.LeaseTransitions == nil {
		return 0
	}
	return *l.Spec.LeaseTransitions
}

// rawHandoffs measures the raw handoff on one Lease (see rawLoop).
func (e *env) rawHandoffs(ctx context.Context, ns, name string, warmup, n int) ([]time.Duration, error) {
	l, err := e.newRawLoop(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	return runHandoffs(ctx, l, warmup, n)
}

// rawLoop: the holder's release CAS starts the sample; it ends when the
// waiter, woken by its watch, wins its CAS.
type rawLoop struct {
	locks  [2]*rawLease
	holder *rawLease
	held   *coordinationv1.Lease
	// handoffs made so far: the holder is locks[handoffs%2].
	handoffs int
}

func (e *env) newRawLoop(ctx context.Context, ns, name string) (*rawLoop, error) {
	l := &rawLoop{}
	for i := range l.locks {
		cs, id, err := e.rawWorker()
		if err != nil {
			return nil, err
		}
		l.locks[i] = &rawLease{cs: cs, ns: ns, name: name, id: id}
	}
	if err := createRawLease(ctx, l.locks[0].cs, ns, name); err != nil {
		return nil, err
	}
	var err error
	l.holder = l.locks[0]
	l.held, err = l.holder.acquire(ctx, nil)
	return l, err
}

func (l *rawLoop) close(ctx context.Context) error { return l.holder.release(ctx, l.held) }

func (l *rawLoop) step(ctx context.Context, _ bool) (time.Duration, bool, error) {
	type res struct {
		l   *coordinationv1.Lease
		at  time.Time
		err error
	}
	next := l.locks[(l.handoffs+1)%2]
	l.handoffs++
	watching := make(chan struct{})
	ch := make(chan res, 1)
	go func() {
		got, err := next.acquire(ctx, watching)
		ch <- res{got, time.Now(), err}
	}()
	select {
	case <-watching:
	case r := <-ch:
		return 0, false, fmt.Errorf("raw waiter returned before the holder released: %v", r.err)
	}
	t0 := time.Now()
	if err := l.holder.release(ctx, l.held); err != nil {
		return 0, false, err
	}
	r := <-ch
	if r.err != nil {
		return 0, false, r.err
	}
	if fenceOf(r.l) != fenceOf(l.held)+1 {
		return 0, false, fmt.Errorf("raw handoff %d: fence %d after %d", l.handoffs, fenceOf(r.l), fenceOf(l.held))
	}
	l.held, l.holder = r.l, next
	return r.at.Sub(t0), true, nil
}

// --- client-go leaderelection with ReleaseOnCancel ---------------------------

// firstGet signals the elector's first read of the Lease: from then on it is
// in its retry loop.
type firstGet struct {
	resourcelock.Interface
	once sync.Once
	ch   chan struct{}
}

func (f *firstGet) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r, raw, err := f.Interface.Get(ctx)
	f.once.Do(func() { close(f.ch) })
	return r, raw, err
}

// leaderElectionHandoffs: the leader's context is cancelled (ReleaseOnCancel
// gives the Lease up at once); the sample ends when the waiting elector's
// OnStartedLeading runs. The waiter polls every RetryPeriod (with client-go's
// jitter), so the release lands at a random point of its period.
func (e *env) leaderElectionHandoffs(ctx context.Context, ns string, warmup, n int, retry time.Duration) ([]time.Duration, error) {
	var clients [2]kubernetes.Interface
	for i := range clients {
		cs, _, err := e.rawWorker()
		if err != nil {
			return nil, err
		}
		clients[i] = cs
	}
	type elector struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	start := func(i int, started chan<- time.Time) (*elector, *firstGet, error) {
		lock := &firstGet{Interface: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: ns, Name: "leader-election"},
			Client:     clients[i%2].CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: fmt.Sprintf("elector-%d", i)},
		}, ch: make(chan struct{})}
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: retry,
			ReleaseOnCancel: true, Name: "bench",
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { started <- time.Now() },
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			return nil, nil, err
		}
		lctx, cancel := context.WithCancel(ctx)
		el := &elector{cancel: cancel, done: make(chan struct{})}
		go func() { defer close(el.done); le.Run(lctx) }()
		return el, lock, nil
	}
	started := make(chan time.Time, 1)
	leader, _, err := start(0, started)
	if err != nil {
		return nil, err
	}
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		return nil, errors.New("the first elector did not lead within 30s")
	}
	var out []time.Duration
	for i := 1; i <= warmup+n; i++ {
		next := make(chan time.Time, 1)
		waiter, lock, err := start(i, next)
		if err != nil {
			return nil, err
		}
		<-lock.ch
		// Release at a uniformly random point of the waiter's retry period.
		time.Sleep(time.Duration(rand.Int64N(int64(retry))))
		t0 := time.Now()
		leader.cancel()
		var t1 time.Time
		select {
		case t1 = <-next:
		case <-time.After(30 * time.Second):
			return nil, errors.New("the waiting elector did not lead within 30s of the release")
		}
		<-leader.done
		if i > warmup {
			out = append(out, t1.Sub(t0))
		}
		leader = waiter
	}
	leader.cancel()
	<-leader.done
	return out, nil
}

// --- expiry handoff ----------------------------------------------------------

// expiryHandoffs: a holder with a 1 s lease stops renewing (Lock.Close); the
// sample is the time from the grant's expiresAt, as the issuer wrote it (its
// clock), to the queued waiter's Acquire returning HELD. parallel chains on
// distinct resources run staggered so their expiries do not coincide.
func (e *env) expiryHandoffs(ctx context.Context, ns string, parallel, n int, stages *handoffStages) ([]time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ph, err := e.followPhases(ctx, ns)
	if err != nil {
		return nil, err
	}
	if err := e.followFences(ctx, ns, ph); err != nil {
		return nil, err
	}
	var (
		mu      sync.Mutex
		out     []time.Duration
		firstEr error
	)
	per := (n + parallel - 1) / parallel
	var wg sync.WaitGroup
	for p := 0; p < parallel; p++ {
		resource := fmt.Sprintf("expiry-%d", p)
		if err := e.fencedResource(ctx, ns, resource, 1, ""); err != nil {
			return nil, err
		}
		var ws [2]*lockclient.Client
		for i := range ws {
			if ws[i], _, err = e.worker(ctx, ns); err != nil {
				return nil, err
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(p) * time.Second / time.Duration(parallel))
			err := expiryChain(ctx, ph, e.admin, ns, ws, resource, per+1, func(d time.Duration, old *locksv1.LockGrant, next *lockclient.Lock, returned time.Time) {
				mu.Lock()
				defer mu.Unlock()
				if len(out) >= n {
					return
				}
				out = append(out, d)
				expired := old.Status.ExpiresAt.Time
				if decided := issuedAt(next); !decided.IsZero() {
					stages.IssuerDecided = append(stages.IssuerDecided, decided.Sub(expired))
				}
				stages.add(expired, time.Time{}, ph.fenceSeen(resource, next.Fence()), ph.seen(old.Name, locksv1.PhaseExpired),
					ph.seen(next.Name(), locksv1.PhaseHeld), returned)
			})
			if err != nil {
				mu.Lock()
				firstEr = errors.Join(firstEr, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out, firstEr
}

func expiryChain(ctx context.Context, ph *phases, kube client.Client, ns string, ws [2]*lockclient.Client, resource string, rounds int,
	sample func(d time.Duration, old *locksv1.LockGrant, next *lockclient.Lock, returned time.Time)) error {
	holder, err := ws[0].Acquire(ctx, resource, lockclient.AcquireOptions{})
	if err != nil {
		return err
	}
	holder.Orphan() // no renewals: the lease runs out on the issuer's clock
	for i := 0; i < rounds; i++ {
		next := ws[(i+1)%2]
		reqID := lockclient.NewRequestID()
		ch := make(chan acquired, 1)
		go func() {
			l, err := next.Acquire(ctx, resource, lockclient.AcquireOptions{RequestID: reqID})
			ch <- acquired{l, time.Now(), err}
		}()
		first, err := ph.wait(ctx, next.LockGrantName(resource, reqID), locksv1.PhasePending, locksv1.PhaseHeld)
		if err != nil {
			return err
		}
		queuedAt := time.Now()
		r := <-ch
		if r.err != nil {
			return r.err
		}
		r.lock.Orphan()
		// The waiter learns it holds from the registry, before the issuer
		// mirrors the end of the previous grant into its LockGrant.
		if _, err := ph.wait(ctx, holder.Name(), locksv1.PhaseExpired, locksv1.PhaseReleased, locksv1.PhaseRevoked); err != nil {
			return err
		}
		var old locksv1.LockGrant
		if err := kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: holder.Name()}, &old); err != nil {
			return err
		}
		if old.Status.Phase != locksv1.PhaseExpired || old.Status.ExpiresAt == nil {
			return fmt.Errorf("%s: previous holder is %s, not Expired", resource, old.Status.Phase)
		}
		if r.lock.Fence() != holder.Fence()+1 {
			return fmt.Errorf("%s: fence %d after %d", resource, r.lock.Fence(), holder.Fence())
		}
		// The first measurement pass is warm-up; a waiter that was not queued before the
		// expiry instant measures its own arrival, not a handoff.
		if i > 0 && first == locksv1.PhasePending && queuedAt.Before(old.Status.ExpiresAt.Time) {
			sample(r.at.Sub(old.Status.ExpiresAt.Time), &old, r.lock, r.at)
		}
		holder = r.lock
	}
	return nil
}
