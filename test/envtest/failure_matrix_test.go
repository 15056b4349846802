package envtest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// The failure matrix on the real control plane: faults only a real system
// has, and randomized schedules through the real API server, issuer and
// webhook. test/sim runs the same matrix at 100,000 schedules in memory.
var _ = Describe("the failure matrix on the real control plane", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("loses no holder and issues no fence twice when the operator restarts in the middle of a handoff", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		a := held(ns, "batch", "worker-a", "a")
		Expect(t.write(a, 1, "a1")).To(Succeed())
		b := request(ns, "batch", "worker-b", "b")
		waitPhase(b, locksv1.PhasePending)

		// The leader dies; its successor commits the handoff (fence 2 to b) and
		// crashes before any LockGrant status write lands.
		primary.stop()
		var crashed atomic.Bool
		crashy := startOperator("crashy-handoff", issuerClock, controllers.Options{WrapClient: func(c client.Client) client.Client {
			return &failGrantStatusWrites{Client: c, failed: &crashed}
		}})
		DeferCleanup(crashy.stop)     // also when the spec fails before stopping it
		crashy.step(21 * time.Second) // past a's lease, extended by one lease at the takeover
		Eventually(func() string {
			if h := getFR(ns, "batch").Status.Holder; h != nil {
				return h.Owner
			}
			return ""
		}, 30*time.Second).Should(Equal("worker-b"))
		Eventually(crashed.Load).Should(BeTrue())
		crashy.stop()
		committed := getFR(ns, "batch")
		Expect(committed.Status.FenceToken).To(Equal(int64(2)))
		Expect(getGrant(ns, b.Name).Status.Phase).To(Equal(locksv1.PhasePending), "the crash hit before b's status")

		primary = startOperator("after-handoff-crash", issuerClock, controllers.Options{})
		heldB := waitPhase(b, locksv1.PhaseHeld)
		waitPhase(a, locksv1.PhaseExpired)
		Expect(heldB.Status.Grant.FenceToken).To(Equal(int64(2)), "the committed handoff is completed, not re-issued")
		Expect(heldB.Status.Digest).To(Equal(committed.Status.Holder.Digest))
		Expect(getFR(ns, "batch").Status.FenceToken).To(Equal(int64(2)))
		Expect(heldGrants(ns)).To(ConsistOf(b.Name))
		Expect(t.write(heldB, 1, "b1")).To(Succeed())
		t.deniedWith(fence.StaleOwner, func() error { return t.write(a, 2, "a2") })
		Expect(t.content()).To(Equal("b1"))
	})

	It("denies every protected write while the acceptance webhook is unavailable, and corrupts nothing", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		a := held(ns, "batch", "worker-a", "a")
		Expect(t.write(a, 1, "a1")).To(Succeed())
		frBefore := getFR(ns, "batch")

		// The generated webhook registration, pointed at a server that is down
		// (only this namespace, so the rest of the suite is unaffected).
		down := unavailableProtectedWebhook(ns)
		Expect(admin.Create(suiteCtx, down)).To(Succeed())
		DeferCleanup(func() { _ = admin.Delete(suiteCtx, down) })
		Eventually(func() error { return t.write(a, 2, "a2") }, 10*time.Second, 100*time.Millisecond).Should(
			MatchError(ContainSubstring("failed calling webhook")))
		before := t.get()
		// The holder's valid segment: the live webhook would accept it, so only
		// the unavailable one can refuse it.
		Expect(t.write(a, 2, "a2")).To(MatchError(ContainSubstring("failed calling webhook")))
		// The API server calls validating webhooks in parallel and returns the
		// first error, so a write the live webhook also denies may come back
		// with its verdict instead; either way it must not land.
		refused := Or(ContainSubstring("failed calling webhook"),
			ContainSubstring(`admission webhook "`+localcp.ProtectedWebhook+`" denied`),
			ContainSubstring(`admission webhook "`+localcp.EnrolledWebhook+`" denied`))
		for _, write := range []func() error{
			func() error { return t.write(a, 1, "a1") }, // a duplicate
			func() error { // an unfenced change
				u := t.get()
				u.SetAnnotations(map[string]string{fence.AnnotationResource: "batch"})
				return workers["worker-a"].Update(suiteCtx, u)
			},
			func() error { return workers["worker-a"].Delete(suiteCtx, t.get()) },
		} {
			Expect(write()).To(MatchError(refused))
		}
		Expect(t.get().GetResourceVersion()).To(Equal(before.GetResourceVersion()))
		Expect(getFR(ns, "batch").Status.FenceToken).To(Equal(frBefore.Status.FenceToken))

		// Back up: the holder continues exactly where it stopped.
		Expect(admin.Delete(suiteCtx, down)).To(Succeed())
		Eventually(func() error { return t.write(a, 2, "a2") }, 10*time.Second, 100*time.Millisecond).Should(Succeed())
		Expect(t.content()).To(Equal("a2"))
	})

	It("keeps one holder and monotonic fences across issuer clock jumps", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		a := held(ns, "batch", "worker-a", "a")
		b := request(ns, "batch", "worker-b", "b")
		waitPhase(b, locksv1.PhasePending)

		// Backwards: the holder only keeps its lease longer; nobody else gets it.
		issuerClock.SetTime(issuerClock.Now().Add(-time.Hour))
		primary.issuer.ResyncAll()
		stays(b, locksv1.PhasePending)
		renew(a)
		Eventually(func() int64 { return getGrant(ns, a.Name).Status.ObservedRenewals }).Should(Equal(int64(1)))
		Expect(t.write(a, 1, "a1")).To(Succeed())
		Expect(heldGrants(ns)).To(ConsistOf(a.Name))

		// Forwards by a day: one expiry, one handoff, fence + 1 (not one per lease period skipped).
		primary.step(24 * time.Hour)
		heldB := waitPhase(b, locksv1.PhaseHeld)
		Expect(heldB.Status.Grant.FenceToken).To(Equal(int64(2)))
		Expect(getGrant(ns, a.Name).Status.Phase).To(Equal(locksv1.PhaseExpired))
		Expect(getFR(ns, "batch").Status.FenceToken).To(Equal(int64(2)))
		t.deniedWith(fence.NotHeld, func() error { return t.write(a, 2, "a2") })
		Expect(t.write(heldB, 1, "b1")).To(Succeed())
		t.deniedWith(fence.StaleOwner, func() error { return t.write(a, 2, "a2") })
	})

	It("holds every invariant over randomized schedules through the API server and the webhook", func() {
		seed := uint64(time.Now().UnixNano())
		if s := os.Getenv("FENCEKEEPER_ENVTEST_SEED"); s != "" {
			var err error
			seed, err = strconv.ParseUint(s, 10, 64)
			Expect(err).NotTo(HaveOccurred())
		}
		schedules := 200
		if s := os.Getenv("FENCEKEEPER_ENVTEST_SCHEDULES"); s != "" {
			n, err := strconv.Atoi(s)
			Expect(err).NotTo(HaveOccurred())
			schedules = n
		}
		By(fmt.Sprintf("seed %d, %d schedules (reproduce with FENCEKEEPER_ENVTEST_SEED=%d)", seed, schedules, seed))
		var totals scheduleCounts
		for i := 0; i < schedules; i++ {
			s := &schedule{ns: ns, name: fmt.Sprintf("s%d", i), rng: rand.New(rand.NewPCG(seed, uint64(i)))}
			s.run(8)
			totals.add(s.counts)
		}
		AddReportEntry("randomized schedules", fmt.Sprintf("seed %d: %d schedules, %+v", seed, schedules, totals))
		GinkgoWriter.Printf("seed %d: %d schedules, %+v\n", seed, schedules, totals)
		Expect(totals.accepted).To(BeNumerically(">", schedules), "the schedules must exercise accepted writes")
		Expect(totals.denied).To(BeNumerically(">", schedules), "and denials")
		// A coverage floor, not a rate: seeds land anywhere around schedules/3
		// (seed 1796087824169921375 gave exactly schedules/4).
		Expect(totals.handoffs).To(BeNumerically(">=", schedules/8), "and handoffs")
	})
})

// heldGrants lists the LockGrants of ns in phase Held.
func heldGrants(ns string) []string {
	var list locksv1.LockGrantList
	Expect(admin.List(suiteCtx, &list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, lg := range list.Items {
		if lg.Status.Phase == locksv1.PhaseHeld {
			out = append(out, lg.Name)
		}
	}
	return out
}

// unavailableProtectedWebhook is the generated protected-object webhook
// registration (failurePolicy and all), limited to ns and pointed at a port
// where nothing listens.
func unavailableProtectedWebhook(ns string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	cfgs, err := cp.WebhookConfigurations()
	Expect(err).NotTo(HaveOccurred())
	for _, cfg := range cfgs {
		for _, w := range cfg.Webhooks {
			if w.Name != localcp.ProtectedWebhook {
				continue
			}
			Expect(*w.FailurePolicy).To(Equal(admissionregistrationv1.Fail), "the generated registration must fail closed")
			url := "https://127.0.0.1:1/validate-fencekeeper-protected"
			w.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url}
			w.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}
			w.Name = "down.vprotected.fencekeeper.dev"
			return &admissionregistrationv1.ValidatingWebhookConfiguration{
				ObjectMeta: metav1.ObjectMeta{Name: "fencekeeper-unavailable-" + ns},
				Webhooks:   []admissionregistrationv1.ValidatingWebhook{w},
			}
		}
	}
	Fail("no " + localcp.ProtectedWebhook + " in the generated webhook manifests")
	return nil
}

// schedule is one randomized run against its own FencedResource and target:
// workers request, write (current, stale, replayed, conflicting, forged),
// release, and the issuer clock jumps past leases. After every step it checks
// the invariants against the API server's answers.
type schedule struct {
	ns, name string
	rng      *rand.Rand
	t        target
	grants   []*locksv1.LockGrant
	segments map[string]int64 // next segment per grant name
	accepted []*unstructured.Unstructured
	fence    int64 // highest fence the object accepted
	counts   scheduleCounts
}

type scheduleCounts struct{ accepted, denied, handoffs, expiries int }

func (c *scheduleCounts) add(o scheduleCounts) {
	c.accepted += o.accepted
	c.denied += o.denied
	c.handoffs += o.handoffs
	c.expiries += o.expiries
}

var scheduleWorkers = []string{"worker-a", "worker-b", "worker-c"}

func (s *schedule) run(steps int) {
	GinkgoHelper()
	s.t = newTarget(protectedKinds[0], s.ns, s.name, locksv1.EnforcementEnforce)
	s.segments = map[string]int64{}
	s.requestAndMaybeHold()
	for i := 0; i < steps; i++ {
		switch s.rng.IntN(8) {
		case 0:
			s.requestAndMaybeHold()
		case 1, 2:
			s.writeAsHolder()
		case 3:
			s.writeAsStaleOwner()
		case 4:
			s.replayOldWrite()
		case 5:
			s.tamperedWrite()
		case 6:
			s.endHolder(true)
		case 7:
			s.endHolder(false)
		}
		s.checkRegistry()
	}
}

// holder is the registry's current holder grant, read linearizably.
func (s *schedule) holder() *locksv1.LockGrant {
	h := getFR(s.ns, s.name).Status.Holder
	if h == nil {
		return nil
	}
	lg := getGrant(s.ns, h.GrantName)
	if lg.Status.Phase != locksv1.PhaseHeld {
		return nil // the issuer has not caught up yet: nobody may write
	}
	return lg
}

func (s *schedule) requestAndMaybeHold() {
	owner := scheduleWorkers[s.rng.IntN(len(scheduleWorkers))]
	free := s.holder() == nil // read before the request: the issuer serves it at once
	lg := request(s.ns, s.name, owner, fmt.Sprintf("%s-r%d", s.name, len(s.grants)))
	s.grants = append(s.grants, lg)
	if free {
		waitPhase(lg, locksv1.PhaseHeld)
		return
	}
	waitPhase(lg, locksv1.PhasePending)
}

func (s *schedule) writeAsHolder() {
	lg := s.holder()
	if lg == nil {
		return
	}
	seg := s.segments[lg.Name] + 1
	Expect(s.t.write(lg, seg, fmt.Sprintf("%s/%d", lg.Name, seg))).To(Succeed(), "the current holder's next segment")
	s.segments[lg.Name] = seg
	s.counts.accepted++
	s.checkObject(lg.Status.Grant.FenceToken, seg)
}

func (s *schedule) writeAsStaleOwner() {
	h := s.holder()
	for _, i := range s.rng.Perm(len(s.grants)) {
		lg := getGrant(s.ns, s.grants[i].Name)
		if lg.Status.Grant == nil || (h != nil && lg.Name == h.Name) {
			continue
		}
		s.mustBeDenied(func() error { return s.t.write(lg, s.segments[lg.Name]+1, "stale") })
		return
	}
}

// replayOldWrite resends an earlier accepted object (a delayed duplicate).
func (s *schedule) replayOldWrite() {
	if len(s.accepted) == 0 {
		return
	}
	old := s.accepted[s.rng.IntN(len(s.accepted))].DeepCopy()
	cur := s.t.get()
	owner := ownerOf(old)
	if old.GetResourceVersion() == cur.GetResourceVersion() {
		// The replay is exactly the stored object: a no-op update, allowed
		// and changing nothing.
		Expect(workers[owner].Update(suiteCtx, old)).To(Succeed())
		Expect(s.t.get().GetResourceVersion()).To(Equal(cur.GetResourceVersion()))
		return
	}
	old.SetResourceVersion(cur.GetResourceVersion())
	s.mustBeDenied(func() error { return workers[owner].Update(suiteCtx, old) })
}

func (s *schedule) tamperedWrite() {
	lg := s.holder()
	if lg == nil {
		return
	}
	tamper := []func(*fence.Envelope){
		func(e *fence.Envelope) { e.Grant.FenceToken++ },                            // FORGED_GRANT
		func(e *fence.Envelope) { e.Grant.Resource = "someone/else" },               // FORGED_GRANT (signed fields)
		func(e *fence.Envelope) { e.Payload = "sha256:" + fmt.Sprintf("%064d", 7) }, // PAYLOAD_MISMATCH
		func(e *fence.Envelope) { e.Segment += 2 },                                  // SEGMENT_OUT_OF_ORDER
	}[s.rng.IntN(4)]
	s.mustBeDenied(func() error {
		return s.t.write(lg, s.segments[lg.Name]+1, "tampered", writeOpts{envelope: tamper})
	})
}

// endHolder releases the holder, or jumps the issuer clock past its lease.
func (s *schedule) endHolder(byRelease bool) {
	lg := s.holder()
	if lg == nil {
		return
	}
	queue := getFR(s.ns, s.name).Status.Queue
	if byRelease {
		release(lg)
		waitPhase(lg, locksv1.PhaseReleased)
	} else {
		primary.step(11 * time.Second)
		waitPhase(lg, locksv1.PhaseExpired)
		s.counts.expiries++
	}
	// The head of the queue holds fence + 1.
	if len(queue) > 0 {
		next := waitPhase(&locksv1.LockGrant{ObjectMeta: objectMeta(s.ns, queue[0].GrantName)}, locksv1.PhaseHeld)
		Expect(next.Status.Grant.FenceToken).To(Equal(lg.Status.Grant.FenceToken+1), "handoff to the next waiter")
		s.counts.handoffs++
	}
}

// mustBeDenied runs a write that the webhook must refuse, and checks the
// object did not change.
func (s *schedule) mustBeDenied(write func() error) {
	GinkgoHelper()
	before := s.t.get()
	err := write()
	Expect(err).To(MatchError(ContainSubstring("denied the request: ")), "a write that is not the holder's next segment was accepted")
	after := s.t.get()
	if before == nil {
		Expect(after).To(BeNil())
	} else {
		Expect(after.GetResourceVersion()).To(Equal(before.GetResourceVersion()), "a denial changed the object")
	}
	s.counts.denied++
}

// checkObject checks the stored fence state after an accepted write.
func (s *schedule) checkObject(fenceToken, seg int64) {
	GinkgoHelper()
	u := s.t.get()
	ann := u.GetAnnotations()
	st, err := fence.StateOf(ann[fence.AnnotationFence], ann[fence.AnnotationReceipts])
	Expect(err).NotTo(HaveOccurred())
	Expect(st.HighestFence).To(Equal(fenceToken))
	Expect(st.HighestFence).To(BeNumerically(">=", s.fence), "the object's fence regressed")
	Expect(st.LastSegment).To(Equal(seg))
	s.fence = st.HighestFence
	for i := 1; i < len(st.Receipts); i++ {
		prev, cur := st.Receipts[i-1], st.Receipts[i]
		Expect(cur.Fence).To(BeNumerically(">=", prev.Fence), "receipt log fences out of order")
		if cur.Fence == prev.Fence {
			Expect(cur.Segment).To(Equal(prev.Segment+1), "a skipped or repeated segment")
		} else {
			Expect(cur.Segment).To(Equal(int64(1)), "a new fence starts at segment 1")
		}
	}
	s.accepted = append(s.accepted, u)
}

// checkRegistry checks there is at most one Held grant and it is the registry's holder.
func (s *schedule) checkRegistry() {
	GinkgoHelper()
	var list locksv1.LockGrantList
	Expect(admin.List(suiteCtx, &list, client.InNamespace(s.ns), client.MatchingFields{locksv1.LockGrantResourceField: s.name})).To(Succeed())
	fr := getFR(s.ns, s.name)
	heldCount := 0
	for _, lg := range list.Items {
		if lg.Status.Phase == locksv1.PhaseHeld {
			heldCount++
			Expect(fr.Status.Holder).NotTo(BeNil())
			Expect(lg.Name).To(Equal(fr.Status.Holder.GrantName), "a Held grant that is not the registry's holder")
		}
	}
	Expect(heldCount).To(BeNumerically("<=", 1), "two Held grants")
	Expect(fr.Status.FenceToken).To(BeNumerically(">=", s.fence), "the registry is behind the object")
}

func ownerOf(u *unstructured.Unstructured) string {
	env, err := fence.ParseEnvelope(u.GetAnnotations()[fence.AnnotationFence])
	Expect(err).NotTo(HaveOccurred())
	return env.Grant.Owner
}
