package envtest

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	. "github.com/onsi/gomega/gstruct"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers"
)

// A record the operator cannot read never came from a write whose outcome a
// client could not determine (the library writes only what the LockGrant
// webhook admits), so it raises no ReconciliationRequired and does not keep
// its LockGrant from being collected; it is reported once instead.
var _ = Describe("hostile input: an unreadable unresolved-mutation record", func() {
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
		newFencedResource(ns, "batch", 3600)
	})

	It("ignores and reports once a garbage record planted through break-glass, and still collects its LockGrant", func() {
		primary.stop()
		primary = startOperator("unreadable-records", issuerClock, controllers.Options{EndedGrantRetention: 2 * time.Second})
		DeferCleanup(func() {
			primary.stop()
			primary = startOperator("primary-after-unreadable-records", issuerClock, controllers.Options{})
		})
		lg := waitPhase(request(ns, "batch", "worker-a", "a"), locksv1.PhaseHeld)
		// cluster-admin holds the break-glass verb: the override is audited, not judged.
		Expect(setAnnotation(admin, lg, locksv1.AnnotationUnresolvedMutation, "{not json")).To(Succeed())

		primary.step(locksv1.UnresolvedMutationDeadline + time.Minute)
		Eventually(reconciliationOf(ns), 10*time.Second, 50*time.Millisecond).Should(PointTo(MatchFields(IgnoreExtras, Fields{
			"Status": Equal(metav1.ConditionFalse), "Reason": Equal(locksv1.ReasonUnreadableMutationRecord),
			"Message": And(ContainSubstring(lg.Name), ContainSubstring("not an unresolved-mutation record"))})))
		reported := func() []corev1.Event { return eventsWithReason(ns, "batch", locksv1.ReasonUnreadableMutationRecord) }
		Eventually(reported).Should(HaveLen(1))
		for range 3 {
			primary.step(time.Minute)
		}
		Consistently(reconciliationOf(ns), time.Second, 50*time.Millisecond).Should(
			HaveField("Status", metav1.ConditionFalse), "a garbage record raised ReconciliationRequired")
		Expect(reported()).To(ConsistOf(HaveField("Series", BeNil())), "reported more than once")

		release(lg)
		waitPhase(lg, locksv1.PhaseReleased)
		Eventually(func() bool {
			primary.clock.Step(time.Second)
			return apierrors.IsNotFound(admin.Get(suiteCtx, client.ObjectKeyFromObject(lg), &locksv1.LockGrant{}))
		}, time.Minute, 250*time.Millisecond).Should(BeTrue(), "a LockGrant with an unreadable record was never collected")
		Eventually(reconciliationOf(ns)).Should(HaveField("Reason", locksv1.ReasonNoUnresolvedMutation))
	})
})

// eventsWithReason lists the Events about the object name in ns with reason.
func eventsWithReason(ns, name, reason string) []corev1.Event {
	var list corev1.EventList
	Expect(admin.List(suiteCtx, &list, client.InNamespace(ns))).To(Succeed())
	var out []corev1.Event
	for _, e := range list.Items {
		if e.InvolvedObject.Name == name && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}
