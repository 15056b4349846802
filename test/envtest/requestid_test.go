package envtest

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// A requestID belongs to its owner (docs/contract.md: one LockGrant per resource,
// owner and requestID). When the LockGrant name left the owner out, a
// co-tenant who guessed a predictable requestID (nightly-2026-07-19) created
// its LockGrant first and the owner's create failed AlreadyExists
// (ErrRequestIDTaken): the owner was blocked. A platform team writing a
// LockGrant by hand had to compute SHA-256 for its name.
var _ = Describe("requestIDs belong to their owner", func() {
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
		newFencedResource(ns, "batch", 30)
	})

	It("lets no other tenant take or block an owner's requestID", func() {
		const rid = "nightly-2026-07-19"
		// worker-b gets there first, under its own name for that requestID:
		// admitted, and it holds the resource.
		squatter := newGrant(ns, "batch", "worker-b", rid)
		squatter.Name = locksv1.LockGrantName("batch", "worker-b", rid)
		Expect(workers["worker-b"].Create(suiteCtx, squatter)).To(Succeed())
		waitPhase(squatter, locksv1.PhaseHeld)
		// ... and by hand under the name worker-a's library will use: refused,
		// naming the name that request must have.
		byHand := newGrant(ns, "batch", "worker-b", rid)
		byHand.Name = locksv1.LockGrantName("batch", "worker-a", rid)
		Expect(workers["worker-b"].Create(suiteCtx, byHand)).To(invalidAt("metadata.name",
			`must be "`+locksv1.LockGrantName("batch", "worker-b", rid)+`"`))

		// worker-a's request with that requestID queues behind the holder
		// (it is not worker-b's duplicate) and is served once it releases.
		c, _ := faultyWorker(ns, "worker-a")
		type acquired struct {
			l   *lockclient.Lock
			err error
		}
		done := make(chan acquired, 1)
		ctx, cancel := context.WithTimeout(suiteCtx, 20*time.Second)
		DeferCleanup(cancel)
		go func() {
			l, err := c.Acquire(ctx, "batch", lockclient.AcquireOptions{RequestID: rid})
			done <- acquired{l, err}
		}()
		mine := newGrant(ns, "batch", "worker-a", rid)
		mine.Name = locksv1.LockGrantName("batch", "worker-a", rid)
		Eventually(func() locksv1.LockGrantPhase {
			select {
			case a := <-done:
				Expect(a.err).NotTo(HaveOccurred(), "worker-a's Acquire while worker-b holds")
			default:
			}
			return phaseIfExists(mine)
		}, 20*time.Second, 20*time.Millisecond).Should(Equal(locksv1.PhasePending))
		stays(mine, locksv1.PhasePending)
		release(squatter)
		var a acquired
		Eventually(done, 20*time.Second).Should(Receive(&a))
		Expect(a.err).NotTo(HaveOccurred())
		DeferCleanup(a.l.Orphan)
		Expect(a.l.State()).To(Equal(lockclient.StateHeld))
		Expect(a.l.LockGrant().Name).To(Equal(mine.Name))
		Expect(a.l.LockGrant().Spec.Owner).To(Equal("worker-a"))
	})

	It("tells the owner's client that a LockGrant written by hand under its name is another request", func() {
		byHand := newGrant(ns, "batch", "worker-a", "nightly")
		byHand.Name = locksv1.LockGrantName("batch", "worker-a", "nightly")
		byHand.Spec.Lease = "by-hand"
		Expect(workers["worker-a"].Create(suiteCtx, byHand)).To(Succeed())
		c, _ := faultyWorker(ns, "worker-a")
		ctx, cancel := context.WithTimeout(suiteCtx, 20*time.Second)
		defer cancel()
		_, err := c.Acquire(ctx, "batch", lockclient.AcquireOptions{RequestID: "nightly"})
		Expect(err).To(MatchError(lockclient.ErrRequestIDTaken))
		Expect(err.Error()).To(And(ContainSubstring(byHand.Name), ContainSubstring(`spec.lease is "by-hand", not "lease-nightly"`)))
	})

	It("admits and serves a LockGrant written by hand under any name", func() {
		lg := newGrant(ns, "batch", "worker-a", "nightly")
		lg.Name = "nightly-import"
		Expect(workers["worker-a"].Create(suiteCtx, lg)).To(Succeed())
		waitPhase(lg, locksv1.PhaseHeld)
	})

	It("serves the first of two hand-written LockGrants of one owner and requestID, denies the others, and keeps the queue moving", func() {
		blocker := waitPhase(request(ns, "batch", "worker-c", "blocker"), locksv1.PhaseHeld)
		first := handWritten(ns, "nightly-import", "worker-a", "nightly")
		waitPhase(first, locksv1.PhasePending)
		second := handWritten(ns, "nightly-import-retry", "worker-a", "nightly")
		deniedAsDuplicate(second, "nightly-import")
		honest := request(ns, "batch", "worker-b", "honest")
		waitPhase(honest, locksv1.PhasePending)

		release(blocker)
		waitPhase(first, locksv1.PhaseHeld)
		stays(honest, locksv1.PhasePending)
		// A duplicate arriving while the original holds is denied too.
		deniedAsDuplicate(handWritten(ns, "nightly-import-again", "worker-a", "nightly"), "nightly-import")
		release(first)
		waitPhase(honest, locksv1.PhaseHeld)
		Expect(getGrant(ns, second.Name).Status.Phase).To(Equal(locksv1.PhaseDenied))
	})
})

// handWritten creates, as owner, a LockGrant on "batch" under name.
func handWritten(ns, name, owner, requestID string) *locksv1.LockGrant {
	GinkgoHelper()
	lg := newGrant(ns, "batch", owner, requestID)
	lg.Name = name
	Expect(workers[owner].Create(suiteCtx, lg)).To(Succeed())
	return lg
}

// deniedAsDuplicate waits until lg is Denied as a duplicate of the LockGrant named original.
func deniedAsDuplicate(lg *locksv1.LockGrant, original string) {
	GinkgoHelper()
	got := waitPhase(lg, locksv1.PhaseDenied)
	c := meta.FindStatusCondition(got.Status.Conditions, locksv1.ConditionIssued)
	Expect(c).NotTo(BeNil())
	Expect(c.Reason).To(Equal(locksv1.ReasonDuplicateRequest))
	Expect(c.Message).To(ContainSubstring("LockGrant " + original + " "))
}

// phaseIfExists is lg's phase, "" while it does not exist or has none.
func phaseIfExists(lg *locksv1.LockGrant) locksv1.LockGrantPhase {
	var got locksv1.LockGrant
	if err := admin.Get(suiteCtx, client.ObjectKeyFromObject(lg), &got); err != nil {
		return ""
	}
	return got.Status.Phase
}
