package envtest

import (
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

var _ = Describe("two issuing controllers with independent caches racing on the same resources", func() {
	It("never issue the same fence twice, over many repetitions", func() {
		// The racer shares the primary's issuer (key and epoch) but has its own
		// manager, cache and workqueue, so both decide every resource at once.
		racer := startOperator("racer", primary.clock, controllers.Options{MaxConcurrentReconciles: 4, Identity: primary.issuer})
		DeferCleanup(racer.stop)
		writes0, conflicts0 := metricValue("fencekeeper_registry_writes_total"), metricValue("fencekeeper_fence_cas_conflicts_total")

		const rounds, resources, grantsPer = 10, 8, 5
		owners := []string{"worker-a", "worker-b", "worker-c", "worker-d", "worker-e"}
		allocations := 0
		for round := 0; round < rounds; round++ {
			ns := newNamespace()
			var wg sync.WaitGroup
			for r := 0; r < resources; r++ {
				name := fmt.Sprintf("res-%d", r)
				newFencedResource(ns, name, 600)
				wg.Add(1)
				go func() {
					defer GinkgoRecover()
					defer wg.Done()
					var lgs []*locksv1.LockGrant
					var mu sync.Mutex
					var cwg sync.WaitGroup
					for i := 0; i < grantsPer; i++ { // concurrent requests
						cwg.Add(1)
						go func() {
							defer GinkgoRecover()
							defer cwg.Done()
							lg := request(ns, name, owners[i], "q"+strconv.Itoa(i))
							mu.Lock()
							lgs = append(lgs, lg)
							mu.Unlock()
						}()
					}
					cwg.Wait()
					// Release whoever holds until everyone has held once.
					for done := 0; done < grantsPer; {
						var list locksv1.LockGrantList
						Expect(admin.List(suiteCtx, &list, client.InNamespace(ns), client.MatchingFields{locksv1.LockGrantResourceField: name})).To(Succeed())
						held := 0
						for i := range list.Items {
							lg := &list.Items[i]
							if lg.Status.Phase == locksv1.PhaseHeld {
								held++
								if !lg.Spec.Release {
									release(lg)
								}
							}
						}
						Expect(held).To(BeNumerically("<=", 1), "two LockGrants of %s Held at once", name)
						done = 0
						for _, lg := range list.Items {
							if lg.Status.Phase == locksv1.PhaseReleased {
								done++
							}
						}
						time.Sleep(10 * time.Millisecond)
					}
					var list locksv1.LockGrantList
					Expect(admin.List(suiteCtx, &list, client.InNamespace(ns), client.MatchingFields{locksv1.LockGrantResourceField: name})).To(Succeed())
					var fences []int
					for _, lg := range list.Items {
						Expect(lg.Status.Grant).NotTo(BeNil(), "%s was never issued", lg.Name)
						fences = append(fences, int(lg.Status.Grant.FenceToken))
					}
					sort.Ints(fences)
					Expect(fences).To(Equal([]int{1, 2, 3, 4, 5}), "fences of %s", name)
					Expect(getFR(ns, name).Status.FenceToken).To(Equal(int64(grantsPer)))
				}()
			}
			wg.Wait()
			allocations += resources * grantsPer
		}
		writes := metricValue("fencekeeper_registry_writes_total") - writes0
		conflicts := metricValue("fencekeeper_fence_cas_conflicts_total") - conflicts0
		rate := conflicts / writes
		AddReportEntry("fence allocation race", fmt.Sprintf("%d allocations, %.0f registry CAS writes, %.0f conflicts (%.1f%%)",
			allocations, writes, conflicts, 100*rate))
		fmt.Fprintf(GinkgoWriter, "race: %d allocations, %.0f CAS writes, %.0f conflicts (%.1f%%)\n", allocations, writes, conflicts, 100*rate)
		Expect(conflicts).To(BeNumerically(">", 0), "the race test must actually race: two issuers, no conflicts seen")
	})
})

var _ = Describe("issuer epochs", Ordered, func() {
	It("extends held leases by one lease duration from a takeover and revokes older epochs on demand", func() {
		ns := newNamespace()
		newFencedResource(ns, "batch", 30)
		a := request(ns, "batch", "worker-a", "a")
		heldA := waitPhase(a, locksv1.PhaseHeld)
		oldEpoch := primary.issuer.Epoch()
		Expect(heldA.Status.Grant.IssuerEpoch).To(Equal(oldEpoch))

		// The leader dies; 25 s later (issuer clock) a new leader takes over.
		primary.stop()
		primary.clock.Step(25 * time.Second)
		primary = startOperator("takeover", primary.clock, controllers.Options{})
		takeover := primary.clock.Now()
		newEpoch := primary.issuer.Epoch()
		Expect(newEpoch).To(BeNumerically(">", oldEpoch))
		// A takeover writes every FencedResource someone holds or waits on once
		// (an idle one adopts the epoch with its next write); earlier specs
		// leave hundreds behind, so give it time.
		Eventually(func() time.Time {
			return getGrant(ns, a.Name).Status.ExpiresAt.Time
		}, 20*time.Second, 20*time.Millisecond).Should(BeTemporally("~", takeover.Add(30*time.Second), time.Millisecond))
		Expect(getFR(ns, "batch").Status.IssuerEpoch).To(Equal(newEpoch))
		Expect(eventReasons(ns, a.Name)).To(ContainElement("LeaseExtended"))
		primary.step(10 * time.Second) // past the original expiry
		stays(a, locksv1.PhaseHeld)
		Expect(getGrant(ns, a.Name).Status.Grant).To(Equal(heldA.Status.Grant), "the signed grant is unchanged by the takeover")

		b := request(ns, "batch", "worker-b", "b")
		waitPhase(b, locksv1.PhasePending)
		setRevokedBelow(newEpoch)
		DeferCleanup(setRevokedBelow, int64(0))
		waitPhase(a, locksv1.PhaseRevoked)
		heldB := waitPhase(b, locksv1.PhaseHeld)
		Expect(heldB.Status.Grant.IssuerEpoch).To(Equal(newEpoch))
		Expect(heldB.Status.Grant.FenceToken).To(Equal(heldA.Status.Grant.FenceToken + 1))
		Eventually(func() []string { return eventReasons(ns, a.Name) }).Should(ContainElement(locksv1.ReasonRevoked))

		// Revoking the running issuer's own epoch stops issuing, visibly.
		setRevokedBelow(newEpoch + 1)
		waitPhase(b, locksv1.PhaseRevoked)
		c := request(ns, "batch", "worker-c", "c")
		waitPhase(c, locksv1.PhasePending)
		stays(c, locksv1.PhasePending)
		Eventually(func() string {
			for _, cond := range getFR(ns, "batch").Status.Conditions {
				if cond.Type == locksv1.ConditionReady {
					return cond.Reason
				}
			}
			return ""
		}).Should(Equal(locksv1.ReasonEpochRevoked))
	})

	It("leaves an idle FencedResource unwritten at a takeover until its next grant adopts the new epoch", func() {
		ns := newNamespace()
		newFencedResource(ns, "held", 30)
		newFencedResource(ns, "idle", 30)
		oldEpoch := primary.issuer.Epoch()
		a := request(ns, "held", "worker-a", "a")
		waitPhase(a, locksv1.PhaseHeld)
		b := request(ns, "idle", "worker-b", "b") // used once, then idle
		waitPhase(b, locksv1.PhaseHeld)
		release(b)
		waitPhase(b, locksv1.PhaseReleased)
		Eventually(func() *locksv1.Holder { return getFR(ns, "idle").Status.Holder }).Should(BeNil())

		primary.stop()
		idle := getFR(ns, "idle")
		Expect(idle.Status.IssuerEpoch).To(Equal(oldEpoch))
		primary.clock.Step(25 * time.Second)
		primary = startOperator("takeover-idle", primary.clock, controllers.Options{})
		takeover := primary.clock.Now()
		newEpoch := primary.issuer.Epoch()
		Expect(newEpoch).To(BeNumerically(">", oldEpoch))
		// The held lease is extended and written at once (the webhook judges
		// expiry from the registry's holder record) ...
		Eventually(func() time.Time {
			return getFR(ns, "held").Status.Holder.ExpiresAt.Time
		}, 20*time.Second, 20*time.Millisecond).Should(BeTemporally("~", takeover.Add(30*time.Second), time.Millisecond))
		Expect(getFR(ns, "held").Status.IssuerEpoch).To(Equal(newEpoch))
		// ... while the idle one, decided again, is not written at all.
		primary.issuer.ResyncAll()
		Consistently(func() string {
			return getFR(ns, "idle").ResourceVersion
		}, 3*time.Second, 50*time.Millisecond).Should(Equal(idle.ResourceVersion), "the takeover wrote an idle FencedResource")
		Expect(getFR(ns, "idle").Status.IssuerEpoch).To(Equal(oldEpoch))

		// Its next grant is issued under the new epoch, and that write adopts it.
		c := request(ns, "idle", "worker-c", "c")
		heldC := waitPhase(c, locksv1.PhaseHeld)
		Expect(heldC.Status.Grant.IssuerEpoch).To(Equal(newEpoch))
		Expect(heldC.Status.Grant.FenceToken).To(Equal(int64(2)))
		Expect(getFR(ns, "idle").Status.IssuerEpoch).To(Equal(newEpoch))
	})
})

func setRevokedBelow(epoch int64) {
	GinkgoHelper()
	Expect(update(admin, &corev1.ConfigMap{ObjectMeta: objectMeta(opNamespace, locksv1.TrustBundleConfigMap)}, func(cm *corev1.ConfigMap) {
		cm.Data[grant.RevokedBelowEpochKey] = strconv.FormatInt(epoch, 10)
	})).To(Succeed())
}
