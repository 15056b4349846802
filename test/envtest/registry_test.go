package envtest

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

var _ = Describe("the lock registry", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("issues fence 1 first and exactly the previous fence + 1 to each later holder", func() {
		newFencedResource(ns, "batch", 30)
		for i := int64(1); i <= 5; i++ {
			lg := request(ns, "batch", "worker-a", fmt.Sprintf("r%d", i))
			held := waitPhase(lg, locksv1.PhaseHeld)
			Expect(held.Status.Grant.FenceToken).To(Equal(i))
			fr := getFR(ns, "batch")
			Expect(fr.Status.FenceToken).To(Equal(i))
			Expect(fr.Status.Holder.GrantName).To(Equal(lg.Name))
			Expect(fr.Status.PolicyGeneration).To(Equal(fr.Generation))
			Expect(held.Status.Grant.PolicyGeneration).To(Equal(fr.Generation))
			Expect(held.Status.Grant.BackendRevision).To(Equal(fr.Status.BackendRevision))
			release(lg)
			waitPhase(lg, locksv1.PhaseReleased)
		}
		// Acquiring and releasing is routine: no Events (they are for what
		// an on-call person acts on; the first grant's would have landed by now).
		Expect(eventReasons(ns, locksv1.LockGrantName("batch", "worker-a", "r1"))).To(BeEmpty())
	})

	It("hands off FIFO to three waiters in arrival order", func() {
		newFencedResource(ns, "batch", 30)
		a := request(ns, "batch", "worker-a", "a")
		waitPhase(a, locksv1.PhaseHeld)
		var waiters []*locksv1.LockGrant
		for _, w := range []string{"worker-b", "worker-c", "worker-d"} {
			lg := request(ns, "batch", w, "req-"+w)
			// Arrival order is the order the issuer queued them.
			Eventually(func() []string {
				var names []string
				for _, q := range getFR(ns, "batch").Status.Queue {
					names = append(names, q.GrantName)
				}
				return names
			}).Should(ContainElement(lg.Name))
			waitPhase(lg, locksv1.PhasePending)
			waiters = append(waiters, lg)
		}
		Expect(getFR(ns, "batch").Status.Queue).To(HaveLen(3))
		prev := a
		for i, w := range waiters {
			release(prev)
			waitPhase(prev, locksv1.PhaseReleased)
			held := waitPhase(w, locksv1.PhaseHeld)
			Expect(held.Status.Grant.FenceToken).To(Equal(int64(i + 2)))
			for _, later := range waiters[i+1:] {
				Expect(getGrant(ns, later.Name).Status.Phase).To(Equal(locksv1.PhasePending))
			}
			prev = w
		}
	})

	It("queues requests created in the same second in the order they were created, also after a restart", func() {
		newFencedResource(ns, "batch", 30)
		a := request(ns, "batch", "worker-a", "a")
		waitPhase(a, locksv1.PhaseHeld)
		// With no issuer running, the next one first sees both waiters in
		// one pass (its cache's first list). They are created in one second,
		// the later one under the name that sorts first: creationTimestamp
		// cannot order them, and the name would serve the later first.
		primary.stop()
		var first, second *locksv1.LockGrant
		for attempt := 0; ; attempt++ {
			Expect(attempt).To(BeNumerically("<", 5), "no two creations within one second")
			b := newGrant(ns, "batch", "worker-b", fmt.Sprintf("b-%d", attempt))
			c := newGrant(ns, "batch", "worker-c", fmt.Sprintf("c-%d", attempt))
			if b.Name < c.Name {
				b, c = c, b
			}
			first, second = request(ns, "batch", b.Spec.Owner, b.Spec.RequestID), request(ns, "batch", c.Spec.Owner, c.Spec.RequestID)
			if first.CreationTimestamp.Equal(&second.CreationTimestamp) {
				break
			}
			Expect(admin.Delete(suiteCtx, first)).To(Succeed())
			Expect(admin.Delete(suiteCtx, second)).To(Succeed())
		}
		Expect(second.Name < first.Name).To(BeTrue())

		primary = startOperator("primary-same-second", issuerClock, controllers.Options{})
		Eventually(func() []string {
			var names []string
			for _, q := range getFR(ns, "batch").Status.Queue {
				names = append(names, q.GrantName)
			}
			return names
		}).Should(Equal([]string{first.Name, second.Name}))
		release(a)
		Expect(waitPhase(first, locksv1.PhaseHeld).Status.Grant.FenceToken).To(Equal(int64(2)))
	})

	It("expires a holder by the issuer's clock and hands off to the next waiter", func() {
		newFencedResource(ns, "batch", 30)
		a := request(ns, "batch", "worker-a", "a")
		heldA := waitPhase(a, locksv1.PhaseHeld)
		b := request(ns, "batch", "worker-b", "b")
		waitPhase(b, locksv1.PhasePending)
		Expect(heldA.Status.ExpiresAt.Sub(primary.clock.Now())).To(BeNumerically("~", 30*time.Second, time.Second))

		primary.step(29 * time.Second)
		stays(a, locksv1.PhaseHeld)
		primary.step(2 * time.Second)
		waitPhase(a, locksv1.PhaseExpired)
		heldB := waitPhase(b, locksv1.PhaseHeld)
		Expect(heldB.Status.Grant.FenceToken).To(Equal(heldA.Status.Grant.FenceToken + 1))
		Eventually(func() []string { return eventReasons(ns, a.Name) }).Should(ContainElement("Expired"))
	})

	It("applies renewals that arrive before expiry and ignores those after", func() {
		newFencedResource(ns, "batch", 30)
		a := request(ns, "batch", "worker-a", "a")
		first := waitPhase(a, locksv1.PhaseHeld)
		primary.step(20 * time.Second)
		renew(a)
		var renewed *locksv1.LockGrant
		Eventually(func() int64 {
			renewed = getGrant(ns, a.Name)
			return renewed.Status.ObservedRenewals
		}).Should(Equal(int64(1)))
		Expect(renewed.Status.ExpiresAt.Time).To(BeTemporally("~", primary.clock.Now().Add(30*time.Second), time.Millisecond))
		Expect(renewed.Status.Grant).To(Equal(first.Status.Grant), "renewal extends the lease, not the grant")

		primary.step(20 * time.Second) // past the original expiry, before the renewed one
		stays(a, locksv1.PhaseHeld)
		primary.step(11 * time.Second) // past the renewed expiry
		waitPhase(a, locksv1.PhaseExpired)
		renew(a) // too late: the issuer already judged it expired
		stays(a, locksv1.PhaseExpired)
		Expect(getGrant(ns, a.Name).Status.ObservedRenewals).To(Equal(int64(1)))
		Expect(getFR(ns, "batch").Status.Holder).To(BeNil())
	})

	It("releases on spec.release and on deletion, serving the next waiter each time", func() {
		newFencedResource(ns, "batch", 30)
		a := request(ns, "batch", "worker-a", "a")
		waitPhase(a, locksv1.PhaseHeld)
		b := request(ns, "batch", "worker-b", "b")
		c := request(ns, "batch", "worker-c", "c")
		waitPhase(c, locksv1.PhasePending)
		release(a)
		waitPhase(a, locksv1.PhaseReleased)
		heldB := waitPhase(b, locksv1.PhaseHeld)
		Expect(heldB.Finalizers).To(BeEmpty(), "no release finalizer: the issuer finds a vanished holder by an uncached read")

		// The holder's LockGrant is gone at once; its deletion event brings
		// the issuer, whose read around the cache finds it gone.
		Expect(workers["worker-b"].Delete(suiteCtx, b)).To(Succeed())
		Expect(apierrors.IsNotFound(admin.Get(suiteCtx, client.ObjectKeyFromObject(b), &locksv1.LockGrant{}))).To(BeTrue())
		heldC := waitPhase(c, locksv1.PhaseHeld)
		Expect(heldC.Status.Grant.FenceToken).To(Equal(heldB.Status.Grant.FenceToken + 1))
		ended := getFR(ns, "batch").Status.RecentlyEnded
		Expect(ended).To(ContainElement(And(HaveField("GrantUID", string(b.UID)), HaveField("Reason", locksv1.ReasonDeleted))))

		// A LockGrant an earlier client version created carries the release
		// finalizer: deleted while it holds, its grant ends first, then the
		// issuer removes the finalizer and it is gone.
		d := newGrant(ns, "batch", "worker-d", "d")
		d.Finalizers = []string{locksv1.GrantFinalizer}
		Expect(workers["worker-d"].Create(suiteCtx, d)).To(Succeed())
		waitPhase(d, locksv1.PhasePending)
		Expect(workers["worker-c"].Delete(suiteCtx, c)).To(Succeed())
		heldD := waitPhase(d, locksv1.PhaseHeld)
		Expect(heldD.Status.Grant.FenceToken).To(Equal(heldC.Status.Grant.FenceToken + 1))
		e := request(ns, "batch", "worker-e", "e")
		waitPhase(e, locksv1.PhasePending)
		Expect(workers["worker-d"].Delete(suiteCtx, d)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(admin.Get(suiteCtx, client.ObjectKeyFromObject(d), &locksv1.LockGrant{}))
		}).Should(BeTrue(), "the legacy finalizer is removed once the grant has ended")
		heldE := waitPhase(e, locksv1.PhaseHeld)
		Expect(heldE.Status.Grant.FenceToken).To(Equal(heldD.Status.Grant.FenceToken + 1))
	})

	It("recovers a lost create response by requestID without a second identity", func() {
		newFencedResource(ns, "batch", 30)
		// A transport that delivers the first POST to the server and then drops the response.
		var dropped atomic.Bool
		cfg := rest.CopyConfig(testEnvUserConfig("worker-a"))
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				resp, err := rt.RoundTrip(req)
				if err == nil && req.Method == http.MethodPost && dropped.CompareAndSwap(false, true) {
					resp.Body.Close()
					return nil, fmt.Errorf("injected: response lost after the request was sent")
				}
				return resp, err
			})
		}
		lossy, err := client.New(cfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())

		lg := newGrant(ns, "batch", "worker-a", "idem-1")
		Expect(lossy.Create(suiteCtx, lg)).To(MatchError(ContainSubstring("response lost")))
		// Retrying the same requestID finds the object the lost request created.
		retry := newGrant(ns, "batch", "worker-a", "idem-1")
		Expect(apierrors.IsAlreadyExists(lossy.Create(suiteCtx, retry))).To(BeTrue())
		held := waitPhase(retry, locksv1.PhaseHeld)
		// A name of the library's form is only ever its own request's.
		formed := newGrant(ns, "batch", "worker-a", "idem-1")
		formed.Name = locksv1.LockGrantName("batch", "worker-a", "idem-2")
		Expect(lossy.Create(suiteCtx, formed)).To(invalidAt("metadata.name", fmt.Sprintf("must be %q", retry.Name)))
		// Under names written by hand, twins of the request are admitted, even
		// two at once, and the issuer denies them: the held one keeps its place.
		errs := make(chan error, 3)
		var twins []*locksv1.LockGrant
		for _, name := range []string{"batch-idem-1-second", "batch-idem-1-race-a", "batch-idem-1-race-b"} {
			twin := newGrant(ns, "batch", "worker-a", "idem-1")
			twin.Name = name
			twins = append(twins, twin)
			go func() {
				defer GinkgoRecover()
				errs <- lossy.Create(suiteCtx, twin.DeepCopy())
			}()
		}
		for range twins {
			Expect(<-errs).To(Succeed())
		}
		for _, twin := range twins {
			deniedAsDuplicate(twin, retry.Name)
		}
		stays(retry, locksv1.PhaseHeld)
		var list locksv1.LockGrantList
		Expect(admin.List(suiteCtx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(4))
		Expect(getFR(ns, "batch").Status.Holder.GrantUID).To(BeEquivalentTo(held.UID))
		Expect(held.Status.Grant.FenceToken).To(Equal(int64(1)))
	})

	It("respects fenceFloor, which may only grow", func() {
		newFencedResource(ns, "batch", 30, func(fr *locksv1.FencedResource) { fr.Spec.FenceFloor = 100 })
		a := request(ns, "batch", "worker-a", "a")
		Expect(waitPhase(a, locksv1.PhaseHeld).Status.Grant.FenceToken).To(Equal(int64(101)))
		Expect(update(admin, &locksv1.FencedResource{ObjectMeta: getFR(ns, "batch").ObjectMeta}, func(fr *locksv1.FencedResource) {
			fr.Spec.FenceFloor = 500
		})).To(Succeed())
		release(a)
		b := request(ns, "batch", "worker-b", "b")
		heldB := waitPhase(b, locksv1.PhaseHeld)
		Expect(heldB.Status.Grant.FenceToken).To(Equal(int64(501)))
		Expect(heldB.Status.Grant.PolicyGeneration).To(Equal(getFR(ns, "batch").Generation))
		// Below the floor is rejected by the CRD's CEL rule.
		err := update(admin, &locksv1.FencedResource{ObjectMeta: getFR(ns, "batch").ObjectMeta}, func(fr *locksv1.FencedResource) {
			fr.Spec.FenceFloor = 10
		})
		Expect(err).To(MatchError(ContainSubstring("fenceFloor may only grow")))
		// A floor below the issued fence does not lower the next one.
		Expect(update(admin, &locksv1.FencedResource{ObjectMeta: getFR(ns, "batch").ObjectMeta}, func(fr *locksv1.FencedResource) {
			fr.Spec.FenceFloor = 501
		})).To(Succeed())
		release(b)
		c := request(ns, "batch", "worker-c", "c")
		Expect(waitPhase(c, locksv1.PhaseHeld).Status.Grant.FenceToken).To(Equal(int64(502)))
	})

	It("signs grants that verify with the trust bundle and fail after any change", func() {
		newFencedResource(ns, "batch", 30)
		lg := waitPhase(request(ns, "batch", "worker-a", "a"), locksv1.PhaseHeld)
		var cm corev1.ConfigMap
		Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: opNamespace, Name: locksv1.TrustBundleConfigMap}, &cm)).To(Succeed())
		bundle, err := grant.ParseTrustBundle(cm.Data)
		Expect(err).NotTo(HaveOccurred())
		g := lg.Status.Grant.ToGrant()
		Expect(g.Resource).To(Equal("test/" + ns + "/batch"))
		Expect(g.Owner).To(Equal("worker-a"))
		Expect(bundle.Verify(g, lg.Status.Digest, lg.Status.Proof)).To(Succeed())
		for _, tamper := range []func(*grant.Grant){
			func(g *grant.Grant) { g.FenceToken++ },
			func(g *grant.Grant) { g.Owner = "worker-b" },
			func(g *grant.Grant) { g.Resource += "x" },
			func(g *grant.Grant) { g.IssuerEpoch++ },
			func(g *grant.Grant) { g.PolicyGeneration++ },
			func(g *grant.Grant) { g.Lease += "x" },
			func(g *grant.Grant) { g.BackendRevision += "1" },
		} {
			t := g
			tamper(&t)
			Expect(bundle.Verify(t, lg.Status.Digest, lg.Status.Proof)).To(MatchError(grant.ErrForged))
		}
		// The registry's copy is the same document.
		fr := getFR(ns, "batch")
		Expect(fr.Status.Holder.Digest).To(Equal(lg.Status.Digest))
		Expect(fr.Status.Holder.Grant(fr.Spec.ResourceID)).To(Equal(g))
	})

	It("admits only valid LockGrants, with messages that say what is wrong", func() {
		newFencedResource(ns, "batch", 30, func(fr *locksv1.FencedResource) {
			fr.Spec.AllowedOwners = []string{"worker-a", "worker-b"}
			fr.Spec.OperationCategories = []string{"settlement"}
		})
		wrongOwner := newGrant(ns, "batch", "worker-b", "x")
		wrongOwner.Spec.OperationCategory = "settlement"
		Expect(workers["worker-a"].Create(suiteCtx, wrongOwner)).To(invalidAt("spec.owner", `must equal the requesting user "worker-a"`))
		notAllowed := newGrant(ns, "batch", "worker-c", "x")
		notAllowed.Spec.OperationCategory = "settlement"
		Expect(workers["worker-c"].Create(suiteCtx, notAllowed)).To(invalidAt("spec.owner", "is not in FencedResource batch spec.allowedOwners"))
		badCategory := newGrant(ns, "batch", "worker-a", "x")
		badCategory.Spec.OperationCategory = "refund"
		Expect(workers["worker-a"].Create(suiteCtx, badCategory)).To(invalidAt("spec.operationCategory", `Unsupported value: "refund": supported values: "settlement"`))
		noResource := newGrant(ns, "missing", "worker-a", "x")
		Expect(workers["worker-a"].Create(suiteCtx, noResource)).To(invalidAt("spec.resource", `FencedResource "missing" does not exist`))
		badRoot := newGrant(ns, "batch", "worker-a", "x")
		badRoot.Spec.OperationRoot = "md5:abc"
		Expect(workers["worker-a"].Create(suiteCtx, badRoot)).To(MatchError(ContainSubstring("spec.operationRoot")))

		ok := newGrant(ns, "batch", "worker-a", "x")
		ok.Spec.OperationCategory = "settlement"
		Expect(workers["worker-a"].Create(suiteCtx, ok)).To(Succeed())
		waitPhase(ok, locksv1.PhaseHeld)
		// Only the owner renews or releases.
		Expect(update(workers["worker-b"], &locksv1.LockGrant{ObjectMeta: ok.ObjectMeta}, func(g *locksv1.LockGrant) { g.Spec.Renewals++ })).To(
			MatchError(ContainSubstring(`the LockGrant belongs to "worker-a"; "worker-b" may not change it`)))
		// Immutable and monotonic fields, enforced by the CRD.
		for field, mutate := range map[string]func(*locksv1.LockGrant){
			"lease is immutable":         func(g *locksv1.LockGrant) { g.Spec.Lease = "other" },
			"owner is immutable":         func(g *locksv1.LockGrant) { g.Spec.Owner = "worker-a2" },
			"operationRoot is immutable": func(g *locksv1.LockGrant) { g.Spec.OperationRoot = root("other-root") },
			"renewals may only grow":     func(g *locksv1.LockGrant) { g.Spec.Renewals-- },
		} {
			if field == "renewals may only grow" {
				renew(ok)
			}
			Expect(update(workers["worker-a"], &locksv1.LockGrant{ObjectMeta: ok.ObjectMeta}, mutate)).To(MatchError(ContainSubstring(field)))
		}
		release(ok)
		waitPhase(ok, locksv1.PhaseReleased)
		Expect(update(workers["worker-a"], &locksv1.LockGrant{ObjectMeta: ok.ObjectMeta}, func(g *locksv1.LockGrant) { g.Spec.Release = false })).To(
			MatchError(ContainSubstring("release cannot be undone")))
		Expect(update(admin, &locksv1.FencedResource{ObjectMeta: getFR(ns, "batch").ObjectMeta}, func(fr *locksv1.FencedResource) {
			fr.Spec.ResourceID = "other"
		})).To(MatchError(ContainSubstring("resourceID is immutable")))
	})

	It("never issues to an owner a policy change removed, though the webhook may admit it from its cache", func() {
		// The LockGrant webhook reads the FencedResource from its cache (the
		// API server only on a miss): a request racing a policy change can be
		// admitted on the old policy. The issuer decides on the registry it
		// compares-and-swaps, so such a request is denied, never issued.
		newFencedResource(ns, "batch", 30, func(fr *locksv1.FencedResource) {
			fr.Spec.AllowedOwners = []string{"worker-a", "worker-b"}
		})
		a := request(ns, "batch", "worker-a", "first")
		waitPhase(a, locksv1.PhaseHeld) // the operator's cache has the FencedResource now
		Expect(update(admin, &locksv1.FencedResource{ObjectMeta: getFR(ns, "batch").ObjectMeta}, func(fr *locksv1.FencedResource) {
			fr.Spec.AllowedOwners = []string{"worker-a"}
		})).To(Succeed())
		b := newGrant(ns, "batch", "worker-b", "raced")
		if err := workers["worker-b"].Create(suiteCtx, b); err != nil {
			Expect(err).To(invalidAt("spec.owner", "is not in FencedResource batch spec.allowedOwners"))
		} else {
			release(a)
			waitPhase(b, locksv1.PhaseDenied)
		}
		Expect(getFR(ns, "batch").Status.Holder).To(Or(BeNil(), HaveField("Owner", "worker-a")))
	})

	It("lets the owner renew and release without calling the LockGrant webhook, and the CRD still holds the spec rules", func() {
		// The owner's renewals and releases are the critical path of every
		// handoff: the webhook configuration's matchCondition leaves them to
		// the API server (owner == requester needs no other authority) and the
		// CRD's CEL rules keep the spec's, so no admission round trip is paid.
		newFencedResource(ns, "batch", 30)
		lg := request(ns, "batch", "worker-a", "owner-path")
		waitPhase(lg, locksv1.PhaseHeld)
		calls := func() float64 { return webhookRequests(lockGrantWebhookPath) }

		before := calls()
		renew(lg)
		Expect(calls()).To(Equal(before), "the owner's renewal called the LockGrant webhook")

		// What the owner attaches is judged (its size, the unresolved-mutation
		// record): a change of its labels, annotations, finalizers or owner
		// references comes to the webhook, also when the map appears or goes.
		for _, patch := range []string{
			`{"metadata":{"labels":{"team":"billing"}}}`,
			`{"metadata":{"labels":null}}`,
			`{"metadata":{"annotations":{"note":"x"}}}`,
			`{"metadata":{"finalizers":["example.com/hold","locks.fencekeeper.dev/release"]}}`,
			`{"metadata":{"finalizers":["locks.fencekeeper.dev/release"]}}`,
		} {
			before = calls()
			Expect(workers["worker-a"].Patch(suiteCtx, &locksv1.LockGrant{ObjectMeta: lg.ObjectMeta},
				client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
			Expect(calls()).To(BeNumerically(">=", before+1), "the owner's %s skipped the LockGrant webhook", patch)
		}

		// Fields left out of a merge patch are defaulted, then judged by the CRD.
		for patch, msg := range map[string]string{
			`{"spec":{"renewals":null}}`:         "renewals may only grow",
			`{"spec":{"operationCategory":"x"}}`: "operationCategory is immutable",
			`{"spec":{"owner":"worker-b"}}`:      "owner is immutable",
			`{"spec":{"resource":"elsewhere"}}`:  "resource is immutable",
		} {
			Expect(workers["worker-a"].Patch(suiteCtx, &locksv1.LockGrant{ObjectMeta: lg.ObjectMeta},
				client.RawPatch(types.MergePatchType, []byte(patch)))).To(MatchError(ContainSubstring(msg)), patch)
		}

		// Anyone else still meets the webhook, and its owner rule.
		before = calls()
		Expect(update(workers["worker-b"], &locksv1.LockGrant{ObjectMeta: lg.ObjectMeta}, func(g *locksv1.LockGrant) { g.Spec.Release = true })).To(
			MatchError(ContainSubstring(`the LockGrant belongs to "worker-a"; "worker-b" may not change it`)))
		Expect(workers["worker-b"].Delete(suiteCtx, &locksv1.LockGrant{ObjectMeta: lg.ObjectMeta})).To(
			MatchError(ContainSubstring(`"worker-b" may not delete it`)))
		Expect(calls()).To(BeNumerically(">=", before+2))

		before = calls()
		release(lg)
		waitPhase(lg, locksv1.PhaseReleased)
		Expect(update(workers["worker-a"], &locksv1.LockGrant{ObjectMeta: lg.ObjectMeta}, func(g *locksv1.LockGrant) { g.Spec.Release = false })).To(
			MatchError(ContainSubstring("release cannot be undone")))
		Expect(calls()).To(Equal(before), "the owner's release called the LockGrant webhook")
	})

	It("completes an issue that crashed between the fence allocation and the LockGrant status", func() {
		// A crash-prone issuer commits the allocation, then dies before any
		// LockGrant status write lands.
		primary.stop()
		var allocated atomic.Bool
		crashy := startOperator("crashy", issuerClock, controllers.Options{WrapClient: func(c client.Client) client.Client {
			return &failGrantStatusWrites{Client: c, failed: &allocated}
		}})
		newFencedResource(ns, "batch", 30)
		a := request(ns, "batch", "worker-a", "a")
		Eventually(func() *locksv1.Holder { return getFR(ns, "batch").Status.Holder }).ShouldNot(BeNil())
		Eventually(allocated.Load).Should(BeTrue())
		crashy.stop()
		fr := getFR(ns, "batch")
		Expect(fr.Status.FenceToken).To(Equal(int64(1)))
		Expect(getGrant(ns, a.Name).Status.Phase).NotTo(Equal(locksv1.PhaseHeld))

		primary = startOperator("primary-2", issuerClock, controllers.Options{})
		held := waitPhase(a, locksv1.PhaseHeld)
		Expect(held.Status.Grant.FenceToken).To(Equal(int64(1)), "the allocated fence is completed, not re-issued")
		Expect(held.Status.Digest).To(Equal(fr.Status.Holder.Digest))
		Expect(getFR(ns, "batch").Status.FenceToken).To(Equal(int64(1)))
	})

	It("decides a release while the LockGrant statuses of the handoff before it are still being written", func() {
		// LockGrant status writes hang until the gate opens, as on an API
		// server a tenant loads. A pass that wrote them itself held the next
		// release up until they landed.
		openGate, blocked := holdGrantStatusWrites("held-up-statuses", ns)
		holder := func() string {
			if h := getFR(ns, "batch").Status.Holder; h != nil {
				return h.Owner
			}
			return ""
		}
		newFencedResource(ns, "batch", 30)
		a := request(ns, "batch", "worker-a", "a")
		Eventually(holder).Should(Equal("worker-a"))
		// b is queued before c is created, so that b comes first whatever
		// the issuer's passes: this spec is about status writes, not FIFO.
		b := request(ns, "batch", "worker-b", "b")
		Eventually(func() int { return len(getFR(ns, "batch").Status.Queue) }).Should(Equal(1))
		c := request(ns, "batch", "worker-c", "c")
		Eventually(func() int { return len(getFR(ns, "batch").Status.Queue) }).Should(Equal(2))

		release(a)
		Eventually(holder).Should(Equal("worker-b"))
		Eventually(blocked.Load).Should(BeNumerically(">=", 1), "a's Released status is on its way")
		release(b)
		// The whole entry on failure: its queue, recentlyEnded and
		// conditions tell a decision not taken from one taken and lost.
		Eventually(func() *locksv1.FencedResource { return getFR(ns, "batch") }, 10*time.Second).Should(
			HaveField("Status.Holder", HaveField("Owner", "worker-c")), "b's release waited for a's status write")
		Expect(getGrant(ns, a.Name).Status.Phase).NotTo(Equal(locksv1.PhaseReleased), "a's status has not landed")

		openGate()
		waitPhase(a, locksv1.PhaseReleased)
		waitPhase(b, locksv1.PhaseReleased)
		waitPhase(c, locksv1.PhaseHeld)
		Expect(getGrant(ns, c.Name).Status.Grant.FenceToken).To(Equal(int64(3)))
		Expect(heldGrants(ns)).To(ConsistOf(c.Name))
	})
})

// holdGrantStatusWrites replaces the primary issuer with one whose
// LockGrant status writes hang until openGate is called (at the latest when
// the spec ends); blocked counts the writes that reached the gate.
func holdGrantStatusWrites(name, namespace string) (openGate func(), blocked *atomic.Int32) {
	primary.stop()
	gate := make(chan struct{})
	blocked = &atomic.Int32{}
	slow := startOperator(name, issuerClock, controllers.Options{WrapClient: func(c client.Client) client.Client {
		return &gatedGrantStatusWrites{Client: c, namespace: namespace, gate: gate, blocked: blocked}
	}})
	var once sync.Once
	openGate = func() { once.Do(func() { close(gate) }) }
	DeferCleanup(slow.stop)
	DeferCleanup(openGate) // runs first: the writes held at the gate end before the operator stops
	return openGate, blocked
}

// gatedGrantStatusWrites holds every status write of a LockGrant in
// namespace until gate closes. Only the spec's own: the operator also
// settles what earlier specs left in other namespaces, and holding those
// writes too would keep its workers from the spec's resource.
type gatedGrantStatusWrites struct {
	client.Client
	namespace string
	gate      chan struct{}
	blocked   *atomic.Int32
}

func (g *gatedGrantStatusWrites) Status() client.SubResourceWriter {
	return &gatedStatus{SubResourceWriter: g.Client.Status(), namespace: g.namespace, gate: g.gate, blocked: g.blocked}
}

type gatedStatus struct {
	client.SubResourceWriter
	namespace string
	gate      chan struct{}
	blocked   *atomic.Int32
}

func (g *gatedStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if isLockGrant(obj) && obj.GetNamespace() == g.namespace {
		g.blocked.Add(1)
		select {
		case <-g.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// failGrantStatusWrites fails every LockGrant status write, as a process that
// crashed right after its FencedResource compare-and-swap would.
type failGrantStatusWrites struct {
	client.Client
	failed *atomic.Bool
}

func (f *failGrantStatusWrites) Status() client.SubResourceWriter {
	return &failingStatus{SubResourceWriter: f.Client.Status(), failed: f.failed}
}

type failingStatus struct {
	client.SubResourceWriter
	failed *atomic.Bool
}

func (f *failingStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if isLockGrant(obj) {
		f.failed.Store(true)
		return fmt.Errorf("injected crash before the LockGrant status write")
	}
	return f.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// isLockGrant reports whether a status write is a LockGrant's: the issuer
// writes them naming the LockGrant as metadata only
// (controllers.WriteGrantStatus), so that the answer is metadata too.
func isLockGrant(obj client.Object) bool {
	switch o := obj.(type) {
	case *locksv1.LockGrant:
		return true
	case *metav1.PartialObjectMetadata:
		return o.GroupVersionKind() == locksv1.GroupVersion.WithKind("LockGrant")
	}
	return false
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

var userConfigs sync.Map

func testEnvUserConfig(name string) *rest.Config {
	if c, ok := userConfigs.Load(name); ok {
		return c.(*rest.Config)
	}
	u, err := testEnv.AddUser(envtest.User{Name: name, Groups: []string{workersGroup}}, adminCfg)
	Expect(err).NotTo(HaveOccurred())
	userConfigs.Store(name, u.Config())
	return u.Config()
}

// noSeries is what gaugeValue returns when the gauge has no series for the
// resource (per-resource gauges drop theirs at zero).
const noSeries = -1.0

// gaugeValue reads one labeled gauge from the controller-runtime registry.
func gaugeValue(name, namespace, resource string) float64 {
	families, err := metrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.Metric {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == namespace && labels["fencedresource"] == resource {
				return m.GetGauge().GetValue()
			}
		}
	}
	return noSeries
}

// lockGrantWebhookPath is where the LockGrant webhook is served.
const lockGrantWebhookPath = "/validate-locks-fencekeeper-dev-v1alpha1-lockgrant"

// webhookRequests counts the requests controller-runtime's webhook server
// answered on path (every answer code).
func webhookRequests(path string) float64 {
	families, err := metrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	total := 0.0
	for _, f := range families {
		if f.GetName() != "controller_runtime_webhook_requests_total" {
			continue
		}
		for _, m := range f.Metric {
			for _, l := range m.GetLabel() {
				if l.GetName() == "webhook" && l.GetValue() == path {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// metricValue reads a counter from the controller-runtime registry.
func metricValue(name string) float64 {
	families, err := metrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() == name {
			total := 0.0
			for _, m := range f.Metric {
				total += m.GetCounter().GetValue()
			}
			return total
		}
	}
	return 0
}
