package envtest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// faults is a programmable fault-injecting transport.
type faults struct {
	mu    sync.Mutex
	rules []*fault
}

type fault struct {
	method, path string
	// dropResponse: the request reaches the server, its response is lost.
	dropResponse bool
	times        int // how many requests it hits; <0 = until healed
	skip         int // matching requests let through before it hits
	delay        time.Duration
	// abandon: the request is sent and stays at the server, past the
	// client's giving up (as when the connection to the client is cut): once
	// abandon is closed (or after 10 s), the client gets no answer.
	abandon <-chan struct{}
	hits    int // requests it hit so far
}

func (f *faults) add(r *fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, r)
}

// hitsOn is how many requests the rules for method and path hit so far.
func (f *faults) hitsOn(method, path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.rules {
		if r.method == method && r.path == path {
			n += r.hits
		}
	}
	return n
}

// stop ends r alone.
func (f *faults) stop(r *fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r.times = 0
}

func (f *faults) heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = nil
}

func (f *faults) match(req *http.Request) *fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rules {
		if r.times != 0 && req.Method == r.method && strings.Contains(req.URL.Path, r.path) && !strings.Contains(req.URL.RawQuery, "watch=true") {
			if r.skip > 0 {
				r.skip--
				return nil
			}
			if r.times > 0 {
				r.times--
			}
			r.hits++
			return r
		}
	}
	return nil
}

func (f *faults) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		r := f.match(req)
		if r == nil {
			return rt.RoundTrip(req)
		}
		if r.delay > 0 {
			time.Sleep(r.delay)
		}
		if r.abandon != nil {
			go func() {
				resp, err := rt.RoundTrip(req.Clone(context.WithoutCancel(req.Context())))
				if err == nil {
					resp.Body.Close()
				}
			}()
			select {
			case <-r.abandon:
			case <-time.After(10 * time.Second):
			}
			return nil, fmt.Errorf("injected: no answer to %s %s, which is still at the server", req.Method, req.URL.Path)
		}
		if !r.dropResponse {
			return nil, fmt.Errorf("injected: connection refused before %s %s was sent", req.Method, req.URL.Path)
		}
		resp, err := rt.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		return nil, fmt.Errorf("injected: response to %s %s lost after the request was sent", req.Method, req.URL.Path)
	})
}

// faultyWorker is a lockclient.Client for user whose transport injects faults.
func faultyWorker(ns, user string) (*lockclient.Client, *faults) {
	f := &faults{}
	cfg := rest.CopyConfig(testEnvUserConfig(user))
	cfg.WrapTransport = f.wrap
	c, err := lockclient.NewForConfig(suiteCtx, cfg, ns)
	Expect(err).NotTo(HaveOccurred())
	Expect(c.Identity()).To(Equal(user))
	return c, f
}

// countingWorker is a lockclient.Client for user, and a function that
// returns the requests it sent since it was made (identity review and
// discovery left out), by verb ("WATCH" for a watch) and resource.
func countingWorker(ns, user string) (*lockclient.Client, func() map[string]int) {
	GinkgoHelper()
	var mu sync.Mutex
	requests := map[string]int{}
	cfg := rest.CopyConfig(testEnvUserConfig(user))
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			kind := req.Method
			if req.URL.Query().Get("watch") == "true" {
				kind = "WATCH"
			}
			resource := "other"
			for _, r := range []string{"fencedresources", "lockgrants"} {
				if strings.Contains(req.URL.Path, "/"+r) {
					resource = r
				}
			}
			mu.Lock()
			requests[kind+" "+resource]++
			mu.Unlock()
			return rt.RoundTrip(req)
		})
	}
	c, err := lockclient.NewForConfig(suiteCtx, cfg, ns)
	Expect(err).NotTo(HaveOccurred())
	mu.Lock()
	clear(requests) // discovery and the identity review belong to the client, not its locks
	mu.Unlock()
	return c, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(requests)
	}
}

// mustAcquire takes resource as c's user with requestID, within 20 s, and
// orphans the lock when the spec ends.
func mustAcquire(c *lockclient.Client, resource, requestID string) *lockclient.Lock {
	GinkgoHelper()
	ctx, cancel := context.WithTimeout(suiteCtx, 20*time.Second)
	defer cancel()
	l, err := c.Acquire(ctx, resource, lockclient.AcquireOptions{RequestID: requestID})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(l.Orphan)
	return l
}

// stateLog records a lock's state changes.
type stateLog struct {
	mu     sync.Mutex
	states []lockclient.State
}

func (s *stateLog) record(st lockclient.State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.states = append(s.states, st)
}

func (s *stateLog) all() []lockclient.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]lockclient.State(nil), s.states...)
}

func configMapNamed(ns, name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
}

func setData(cm *corev1.ConfigMap, v string) func() error {
	return func() error { cm.Data = map[string]string{"result": v}; return nil }
}

var _ = Describe("the worker client", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	acquire := func(c *lockclient.Client, resource, requestID string, log *stateLog) *lockclient.Lock {
		GinkgoHelper()
		ctx, cancel := context.WithTimeout(suiteCtx, 20*time.Second)
		defer cancel()
		l, err := c.Acquire(ctx, resource, lockclient.AcquireOptions{RequestID: requestID, RenewInterval: 150 * time.Millisecond,
			RequestTimeout: 100 * time.Millisecond, OnStateChange: log.record})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(l.Orphan)
		return l
	}

	// undeterminableSecondSegment holds "batch" as worker-a, commits segment
	// 1, and arms the faults that make segment 2 undeterminable: it lands but
	// its answer is lost, and the object cannot be read back (after the
	// commit's own read).
	undeterminableSecondSegment := func() (*faults, *lockclient.Lock, *lockclient.Operation, *corev1.ConfigMap) {
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		c, f := faultyWorker(ns, "worker-a")
		l := acquire(c, "batch", "job-1", &stateLog{})
		op := l.Operation("settle-2026-07-19")
		cm := configMapNamed(ns, "batch")
		_, err := op.Commit(suiteCtx, cm, setData(cm, "part 1"))
		Expect(err).NotTo(HaveOccurred())
		f.add(&fault{method: http.MethodPut, path: "/configmaps/", dropResponse: true, times: 1})
		f.add(&fault{method: http.MethodGet, path: "/configmaps/", skip: 1, times: -1})
		return f, l, op, cm
	}

	It("recovers a lost acquire response by requestID, with one identity", func() {
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		c, f := faultyWorker(ns, "worker-a")
		f.add(&fault{method: http.MethodPost, path: "/lockgrants", dropResponse: true, times: 1})
		log := &stateLog{}
		l := acquire(c, "batch", "job-1", log)
		Expect(l.State()).To(Equal(lockclient.StateHeld))
		Expect(l.Fence()).To(Equal(int64(1)))
		var list locksv1.LockGrantList
		Expect(admin.List(suiteCtx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(1))
		Expect(list.Items[0].Name).To(Equal(locksv1.LockGrantName("batch", "worker-a", "job-1")))
		Expect(log.all()[:2]).To(Equal([]lockclient.State{lockclient.StateRequested, lockclient.StateHeld}))
	})

	It("goes OWNERSHIP_UNKNOWN on a lost renewal, blocks new effects, and returns to HELD when the server confirms", func() {
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		c, f := faultyWorker(ns, "worker-a")
		log := &stateLog{}
		l := acquire(c, "batch", "job-1", log)
		// Renewal responses are lost and queries fail: nothing certain is known.
		f.add(&fault{method: http.MethodPut, path: "/lockgrants/", dropResponse: true, times: -1})
		f.add(&fault{method: http.MethodGet, path: "/lockgrants/", times: -1})
		Eventually(l.State, 5*time.Second, 10*time.Millisecond).Should(Equal(lockclient.StateOwnershipUnknown))
		Expect(l.Guard()).To(MatchError(lockclient.ErrOwnershipUnknown))
		_, err := l.Operation("op").Commit(suiteCtx, configMapNamed(ns, "batch"), func() error { return nil })
		Expect(err).To(MatchError(lockclient.ErrOwnershipUnknown), "no new effects while ownership is unknown")
		f.heal()
		Eventually(l.State, 5*time.Second, 10*time.Millisecond).Should(Or(Equal(lockclient.StateHeld), Equal(lockclient.StateRenewing)))
		Expect(l.Guard()).To(Succeed())
		// Renewals go on: HELD -> RENEWING -> HELD, confirmed by the issuer.
		Eventually(func() int64 { return getGrant(ns, l.Name()).Status.ObservedRenewals }, 5*time.Second).Should(BeNumerically(">", 0))
		Expect(log.all()).To(ContainElement(lockclient.StateRenewing))
	})

	It("goes EXPIRED only when the server confirms the expiry", func() {
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		c, f := faultyWorker(ns, "worker-a")
		l := acquire(c, "batch", "job-1", &stateLog{})
		f.add(&fault{method: http.MethodPut, path: "/lockgrants/", times: -1})
		f.add(&fault{method: http.MethodGet, path: "/lockgrants/", times: -1})
		Eventually(l.State, 5*time.Second, 10*time.Millisecond).Should(Equal(lockclient.StateOwnershipUnknown))
		// Cut off for several renewal intervals: unknown, never expired by the client's own reckoning.
		Consistently(l.State, 600*time.Millisecond, 10*time.Millisecond).Should(Equal(lockclient.StateOwnershipUnknown))
		primary.step(11 * time.Second) // the issuer expires it
		waitPhase(getGrant(ns, l.Name()), locksv1.PhaseExpired)
		f.heal()
		Eventually(l.Done(), 5*time.Second).Should(BeClosed())
		Expect(l.State()).To(Equal(lockclient.StateExpired))
		Expect(l.Guard()).To(MatchError(lockclient.ErrExpired))
	})

	It("releases, confirmed by the issuer", func() {
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		c, _ := faultyWorker(ns, "worker-a")
		l := acquire(c, "batch", "job-1", &stateLog{})
		Expect(l.Release(suiteCtx)).To(Succeed())
		Expect(l.State()).To(Equal(lockclient.StateReleased))
		Expect(l.Done()).To(BeClosed())
	})

	It("releases on the registry's record of the end, before the LockGrant's final status lands", func() {
		// LockGrant status writes hang until the gate opens: the issuer
		// writes them after the compare-and-swap that ends the grant, and
		// on a loaded API server they come late.
		openGate, _ := holdGrantStatusWrites("held-up-final-status", ns)
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		c, _ := faultyWorker(ns, "worker-a")
		l := mustAcquire(c, "batch", "job-1")
		ctx, cancel := context.WithTimeout(suiteCtx, 10*time.Second)
		defer cancel()
		Expect(l.Release(ctx)).To(Succeed())
		Expect(l.State()).To(Equal(lockclient.StateReleased))
		Expect(getGrant(ns, l.Name()).Status.Phase).NotTo(Equal(locksv1.PhaseReleased), "the final status has not landed")
		openGate()
		waitPhase(getGrant(ns, l.Name()), locksv1.PhaseReleased)
	})

	It("acquires and releases without a read or a LockGrant watch: two writes a cycle, one registry watch for both", func() {
		// The API server's CPU bounds acquire/release cycles per second;
		// a cycle's requests are what the client costs it. The registry
		// watch outlives a cycle, so the next acquire of the resource opens
		// none; a lock released before its first renewal needs no watch of
		// its LockGrant (the registry records its grant and its end).
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		c, requests := countingWorker(ns, "worker-a")
		for _, id := range []string{"counted-1", "counted-2"} {
			l, err := c.Acquire(suiteCtx, "batch", lockclient.AcquireOptions{RequestID: id})
			Expect(err).NotTo(HaveOccurred())
			Expect(l.Release(suiteCtx)).To(Succeed())
		}
		Expect(requests()).To(Equal(map[string]int{"POST lockgrants": 2, "WATCH fencedresources": 1, "PATCH lockgrants": 2}))
	})

	It("watches its LockGrant from the first renewal, and renewals are confirmed", func() {
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		c, requests := countingWorker(ns, "worker-a")
		log := &stateLog{}
		l := acquire(c, "batch", "job-1", log)
		Eventually(func() int { return requests()["WATCH lockgrants"] }, 5*time.Second).Should(Equal(1))
		// Every confirmation comes on that watch: RENEWING → HELD, again and again.
		Eventually(func() int {
			n, states := 0, log.all()
			for i := 1; i < len(states); i++ {
				if states[i-1] == lockclient.StateRenewing && states[i] == lockclient.StateHeld {
					n++
				}
			}
			return n
		}, 5*time.Second).Should(BeNumerically(">=", 3))
		Expect(l.State()).To(BeElementOf(lockclient.StateHeld, lockclient.StateRenewing))
		Expect(requests()["WATCH lockgrants"]).To(Equal(1), "one watch for the lock's life")
	})

	It("reports a request the issuer denies, which the registry never names", func() {
		// A LockGrant written by hand holds the requestID: the issuer denies
		// the client's request in its LockGrant's status alone, which
		// Acquire reads and watches once it has waited a while.
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		waitPhase(handWritten(ns, "nightly-import", "worker-a", "nightly"), locksv1.PhaseHeld)
		c, _ := faultyWorker(ns, "worker-a")
		ctx, cancel := context.WithTimeout(suiteCtx, 20*time.Second)
		defer cancel()
		_, err := c.Acquire(ctx, "batch", lockclient.AcquireOptions{RequestID: "nightly"})
		Expect(err).To(MatchError(lockclient.ErrDenied))
		Expect(err.Error()).To(ContainSubstring("LockGrant nightly-import "))
	})

	It("resolves a lost write ACK from the receipts: applied, and proven absent", func() {
		// A 60 s lease: renewals every 20 s stay clear of the commits, so a
		// slow confirmation on a busy machine cannot make ownership unknown
		// in the middle of the spec (that state is right, but not under test).
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce, func(fr *locksv1.FencedResource) { fr.Spec.LeaseDurationSeconds = 60 })
		c, f := faultyWorker(ns, "worker-a")
		l := acquire(c, "batch", "job-1", &stateLog{})
		op := l.Operation("settle-2026-07-19")
		cm := configMapNamed(ns, "batch")
		// Applied: the create lands, its answer is lost.
		f.add(&fault{method: http.MethodPost, path: "/configmaps", dropResponse: true, times: 1})
		r1, err := op.Commit(suiteCtx, cm, setData(cm, "part 1"))
		Expect(err).NotTo(HaveOccurred())
		Expect(r1.Segment).To(Equal(int64(1)))
		// Not applied: the update never left; the log proves it absent and the write is retried once.
		f.add(&fault{method: http.MethodPut, path: "/configmaps/", times: 1})
		r2, err := op.Commit(suiteCtx, cm, setData(cm, "part 2"))
		Expect(err).NotTo(HaveOccurred())
		Expect(r2.Segment).To(Equal(int64(2)))
		applied, err := op.Applied(suiteCtx, configMapNamed(ns, "batch"))
		Expect(err).NotTo(HaveOccurred())
		Expect(applied).To(HaveLen(2))
		Expect(applied[0].Receipt).To(Equal(r1.Receipt))
		Expect(applied[1].Receipt).To(Equal(r2.Receipt))
		Expect(t.content()).To(Equal("part 2"))
	})

	It("keeps trying to record an undeterminable outcome while the LockGrant cannot be reached", func() {
		// Found by make chaos: a partition that hides the object hides the
		// LockGrant too; the record was tried once, failed, and the error
		// still said "recorded". Now it is retried until the LockGrant answers.
		f, l, op, cm := undeterminableSecondSegment()
		grants := &fault{method: http.MethodGet, path: "/lockgrants/", times: -1}
		f.add(grants)
		go func() {
			defer GinkgoRecover()
			// Resolution gives up 1 s after its fifth refused read of the
			// object; the LockGrant stays unreachable 1.5 s past that, so the
			// first try of the record fails for certain.
			Eventually(func() int { return f.hitsOn(http.MethodGet, "/configmaps/") }).WithTimeout(20 * time.Second).Should(BeNumerically(">=", 5))
			time.Sleep(2500 * time.Millisecond)
			f.stop(grants)
		}()
		_, err := op.Commit(suiteCtx, cm, setData(cm, "part 2"))
		Expect(err).To(MatchError(lockclient.ErrMutationUnknown))
		Expect(err.Error()).To(ContainSubstring("recorded on LockGrant"))
		Expect(err.Error()).NotTo(ContainSubstring("not recorded"))
		f.heal()
		Expect(getGrant(ns, l.Name()).Annotations).To(HaveKey(locksv1.AnnotationUnresolvedMutation))
	})

	It("reports and records an unknown outcome when the caller's time runs out while resolving it", func() {
		// Found by make chaos: the context ending during resolution returned
		// a bare context error, the outcome neither resolved nor recorded.
		f, l, op, cm := undeterminableSecondSegment()
		ctx, cancel := context.WithTimeout(suiteCtx, time.Second)
		defer cancel()
		_, err := op.Commit(ctx, cm, setData(cm, "part 2"))
		Expect(err).To(MatchError(lockclient.ErrMutationUnknown))
		f.heal()
		Expect(getGrant(ns, l.Name()).Annotations).To(HaveKey(locksv1.AnnotationUnresolvedMutation))
	})

	It("records a write whose outcome cannot be determined, and the operator surfaces it after 15 minutes", func() {
		// The record is stamped with the worker's clock; other specs jump the
		// issuer's clock, so line it up with real time first.
		issuerClock.SetTime(time.Now())
		f, l, op, cm := undeterminableSecondSegment()
		_, err := op.Commit(suiteCtx, cm, setData(cm, "part 2"))
		Expect(err).To(MatchError(lockclient.ErrMutationUnknown))
		f.heal()
		var rec locksv1.UnresolvedMutation
		Expect(json.Unmarshal([]byte(getGrant(ns, l.Name()).Annotations[locksv1.AnnotationUnresolvedMutation]), &rec)).To(Succeed())
		Expect(rec).To(MatchFields(IgnoreExtras, Fields{"Object": Equal("ConfigMap/batch"), "Operation": Equal("settle-2026-07-19"),
			"Fence": BeEquivalentTo(1), "Segment": BeEquivalentTo(2)}))

		reconciliation := func() *metav1.Condition {
			return findCondition(getFR(ns, "batch"), locksv1.ConditionReconciliationRequired)
		}
		primary.step(time.Minute)
		Consistently(reconciliation, 500*time.Millisecond, 50*time.Millisecond).Should(BeNil(), "not overdue yet")

		primary.step(15 * time.Minute)
		Eventually(reconciliation, 10*time.Second, 50*time.Millisecond).Should(PointTo(MatchFields(IgnoreExtras, Fields{
			"Status": Equal(metav1.ConditionTrue), "Reason": Equal(locksv1.ReasonUnresolvedMutation),
			"Message": ContainSubstring("ConfigMap/batch operation settle-2026-07-19 segment 2 under fence 1")})))
		Eventually(func() []string { return eventReasons(ns, "batch") }).Should(ContainElement(locksv1.ConditionReconciliationRequired))
		Expect(gaugeValue("fencekeeper_unresolved_mutations_overdue", ns, "batch")).To(Equal(1.0))

		// Someone checked the object and removed the record.
		Expect(update(workers["worker-a"], &locksv1.LockGrant{ObjectMeta: objectMeta(ns, l.Name())}, func(lg *locksv1.LockGrant) {
			delete(lg.Annotations, locksv1.AnnotationUnresolvedMutation)
		})).To(Succeed())
		Eventually(reconciliation, 10*time.Second, 50*time.Millisecond).Should(PointTo(MatchFields(IgnoreExtras, Fields{
			"Status": Equal(metav1.ConditionFalse), "Reason": Equal(locksv1.ReasonNoUnresolvedMutation)})))
		Eventually(func() []string { return eventReasons(ns, "batch") }).Should(ContainElement(locksv1.ReasonNoUnresolvedMutation))
		Expect(gaugeValue("fencekeeper_unresolved_mutations_overdue", ns, "batch")).To(Equal(noSeries), "dropped at zero")
	})

	It("resumes a segmented operation after a crash, and maps delayed duplicates and conflicting payloads", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		c, _ := faultyWorker(ns, "worker-a")
		l := acquire(c, "batch", "job-1", &stateLog{})
		cm := configMapNamed(ns, "batch")
		for i := 1; i <= 2; i++ {
			_, err := l.Operation("op").Commit(suiteCtx, cm, setData(cm, fmt.Sprintf("part %d", i)))
			Expect(err).NotTo(HaveOccurred())
		}
		l.Orphan() // the worker crashes; its grant is still held on the server
		c2, _ := faultyWorker(ns, "worker-a")
		l2 := acquire(c2, "batch", "job-1", &stateLog{})
		Expect(l2.Fence()).To(Equal(l.Fence()), "the same request finds the same grant")
		cm = configMapNamed(ns, "batch")
		r, err := l2.Operation("op").Commit(suiteCtx, cm, setData(cm, "part 3"))
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Segment).To(Equal(int64(3)), "resumed from the receipt log")

		lg := getGrant(ns, l2.Name())
		err = t.write(lg, 1, "part 1") // a delayed duplicate of segment 1
		d, ok := lockclient.AsDenial(err)
		Expect(ok).To(BeTrue(), "%v", err)
		Expect(d.Verdict).To(Equal(fence.AlreadyApplied))
		err = t.write(lg, 3, "not part 3")
		d, ok = lockclient.AsDenial(err)
		Expect(ok).To(BeTrue())
		Expect(d).To(MatchError(lockclient.ErrQuarantined))
		Expect(t.content()).To(Equal("part 3"))
	})

	It("refuses the stale owner's commit with ErrStaleOwner", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		ca, fa := faultyWorker(ns, "worker-a")
		cb, _ := faultyWorker(ns, "worker-b")
		a := acquire(ca, "batch", "a", &stateLog{})
		cm := configMapNamed(ns, "batch")
		_, err := a.Operation("a-op").Commit(suiteCtx, cm, setData(cm, "A 1"))
		Expect(err).NotTo(HaveOccurred())
		// A is cut off (a long pause), B queues, the lease runs out on the issuer's clock.
		fa.add(&fault{method: http.MethodPut, path: "/lockgrants/", times: -1})
		fa.add(&fault{method: http.MethodGet, path: "/lockgrants/", times: -1})
		var b *lockclient.Lock
		got := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			b = acquire(cb, "batch", "b", &stateLog{})
			close(got)
		}()
		Eventually(func() int { return len(getFR(ns, "batch").Status.Queue) }).Should(Equal(1))
		primary.step(11 * time.Second)
		Eventually(got, 10*time.Second).Should(BeClosed())
		cmB := configMapNamed(ns, "batch")
		_, err = b.Operation("b-op").Commit(suiteCtx, cmB, setData(cmB, "B"))
		Expect(err).NotTo(HaveOccurred())
		// A's write path still works, but the webhook refuses it.
		err = t.write(getGrant(ns, a.Name()), 2, "A 2")
		Expect(err).To(HaveOccurred())
		d, ok := lockclient.AsDenial(err)
		Expect(ok).To(BeTrue())
		Expect(d).To(MatchError(lockclient.ErrStaleOwner))
		Expect(t.content()).To(Equal("B"))
	})
})
