package envtest

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers"
)

// Ended LockGrants are deleted after --ended-grant-retention, counted on the
// issuer's clock, or once more than --ended-grant-max-count have ended (the
// oldest first), except those recording a write whose outcome is unknown.
var _ = Describe("Ended LockGrant collection", func() {
	exists := func(lg *locksv1.LockGrant) func() bool {
		return func() bool {
			err := admin.Get(suiteCtx, client.ObjectKeyFromObject(lg), &locksv1.LockGrant{})
			Expect(client.IgnoreNotFound(err)).To(Succeed())
			return !apierrors.IsNotFound(err)
		}
	}
	gone := func(lg *locksv1.LockGrant) func() bool {
		return func() bool { return !exists(lg)() }
	}
	// collectWith replaces the primary issuer by one collecting with opts.
	collectWith := func(name string, opts controllers.Options) {
		primary.stop()
		primary = startOperator(name, issuerClock, opts)
		DeferCleanup(func() {
			primary.stop()
			primary = startOperator("primary-after-"+name, issuerClock, controllers.Options{})
		})
	}

	It("deletes ended LockGrants after the retention, and keeps held ones and unresolved records", func() {
		collectWith("collector", controllers.Options{EndedGrantRetention: 2 * time.Second})
		ns := newNamespace()
		newFencedResource(ns, "batch", 3600)
		done := waitPhase(request(ns, "batch", "worker-a", "done"), locksv1.PhaseHeld)
		release(done)
		waitPhase(done, locksv1.PhaseReleased)
		unresolved := waitPhase(request(ns, "batch", "worker-a", "unresolved"), locksv1.PhaseHeld)
		Expect(update(workers["worker-a"], &locksv1.LockGrant{ObjectMeta: unresolved.ObjectMeta}, func(g *locksv1.LockGrant) {
			metav1.SetMetaDataAnnotation(&g.ObjectMeta, locksv1.AnnotationUnresolvedMutation, recordJSON(nil))
		})).To(Succeed())
		release(unresolved)
		waitPhase(unresolved, locksv1.PhaseReleased)
		holding := waitPhase(request(ns, "batch", "worker-b", "holding"), locksv1.PhaseHeld)

		// The collector passes every second; the issuer's clock stands still,
		// so nothing has been ended for the retention yet.
		Consistently(exists(done), 2500*time.Millisecond, 100*time.Millisecond).Should(BeTrue())

		// Time passes on the issuer's clock (a second per poll: a pass may be
		// busy deleting what earlier specs left, and counts from when it
		// first sees a LockGrant ended).
		passing := func(check func() bool) func() bool {
			return func() bool {
				primary.clock.Step(time.Second)
				return check()
			}
		}
		Eventually(passing(gone(done)), time.Minute, 250*time.Millisecond).Should(BeTrue(), "ended LockGrant kept past the retention")
		Consistently(passing(exists(unresolved)), 3*time.Second, 250*time.Millisecond).Should(BeTrue(), "a LockGrant recording an unresolved write was deleted")
		Expect(getGrant(ns, holding.Name).Status.Phase).To(Equal(locksv1.PhaseHeld))

		// Resolved: it counts from then.
		Expect(update(workers["worker-a"], &locksv1.LockGrant{ObjectMeta: unresolved.ObjectMeta}, func(g *locksv1.LockGrant) {
			delete(g.Annotations, locksv1.AnnotationUnresolvedMutation)
		})).To(Succeed())
		Eventually(passing(gone(unresolved)), time.Minute, 250*time.Millisecond).Should(BeTrue())
		Expect(exists(holding)()).To(BeTrue())
	})

	It("deletes the oldest ended LockGrants beyond the count long before the retention", func() {
		// The count covers every ended LockGrant the issuer sees: what
		// earlier specs left is collected first, as the oldest.
		collectWith("collector-count", controllers.Options{EndedGrantRetention: time.Hour, EndedGrantMaxCount: 2})
		ns := newNamespace()
		newFencedResource(ns, "batch", 3600)
		var ended []*locksv1.LockGrant
		for _, id := range []string{"first", "second", "third"} {
			lg := waitPhase(request(ns, "batch", "worker-a", id), locksv1.PhaseHeld)
			release(lg)
			ended = append(ended, waitPhase(lg, locksv1.PhaseReleased))
		}
		// The issuer's clock stands still: none has been ended for the hour.
		Eventually(gone(ended[0]), 20*time.Second, 100*time.Millisecond).Should(BeTrue(), "the oldest ended LockGrant kept beyond the count")
		Consistently(func() bool { return exists(ended[1])() && exists(ended[2])() }, 3*time.Second, 100*time.Millisecond).
			Should(BeTrue(), "an ended LockGrant within the count was deleted before the retention")
	})
})
