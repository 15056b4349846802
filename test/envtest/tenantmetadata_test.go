package envtest

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// What a tenant attaches to a LockGrant (labels, annotations, finalizers,
// owner references) is bounded at admission, also when the owner changes it,
// and an unresolved-mutation record must be one: every operator replica
// caches every LockGrant, and a garbage record raised a false
// ReconciliationRequired and kept its LockGrant from ever being collected.
var _ = Describe("hostile input: what a tenant attaches to a LockGrant", func() {
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
		newFencedResource(ns, "batch", 3600)
	})

	It("refuses labels and annotations over the budget at create and at the owner's update, naming the limit and the size", func() {
		over := newGrant(ns, "batch", "worker-a", "over")
		over.Annotations = fillMetadata(over, locksv1.MaxLockGrantMetadataBytes+1)
		Expect(workers["worker-a"].Create(suiteCtx, over)).To(invalidAt("metadata", fmt.Sprintf("%d bytes", locksv1.MaxLockGrantMetadataBytes+1)))
		Expect(workers["worker-a"].Create(suiteCtx, over)).To(MatchError(ContainSubstring(fmt.Sprint(locksv1.MaxLockGrantMetadataBytes))))

		spam := newGrant(ns, "batch", "worker-a", "labels")
		spam.Labels = map[string]string{}
		for i := range 300 {
			spam.Labels[fmt.Sprintf("l-%03d", i)] = strings.Repeat("v", 63)
		}
		Expect(workers["worker-a"].Create(suiteCtx, spam)).To(invalidAt("metadata", "16384 bytes"))

		largest := newGrant(ns, "batch", "worker-a", "largest")
		largest.Annotations = fillMetadata(largest, locksv1.MaxLockGrantMetadataBytes)
		Expect(workers["worker-a"].Create(suiteCtx, largest)).To(Succeed(), "the largest metadata the budget allows")

		held := request(ns, "batch", "worker-b", "held")
		err := setAnnotation(workers["worker-b"], held, blobAnnotation, strings.Repeat("x", locksv1.MaxLockGrantMetadataBytes))
		Expect(err).To(invalidAt("metadata", "16384 bytes"), "the owner's own update")
		Expect(getGrant(ns, held.Name).Annotations).NotTo(HaveKey(blobAnnotation))
	})

	It("refuses a garbage unresolved-mutation record from the owner, admits a valid one and its removal", func() {
		held := waitPhase(request(ns, "batch", "worker-a", "a"), locksv1.PhaseHeld)
		for what, garbage := range map[string]string{
			"not JSON":          "{not json",
			"fields missing":    `{"object":"ConfigMap/x"}`,
			"no fence":          recordJSON(func(r map[string]any) { r["fence"] = 0 }),
			"unknown member":    recordJSON(func(r map[string]any) { r["note"] = "x" }),
			"payload no digest": recordJSON(func(r map[string]any) { r["payload"] = "whatever" }),
			"over 4 KiB":        recordJSON(func(r map[string]any) { r["object"] = "ConfigMap/" + strings.Repeat("x", 4<<10) }),
		} {
			Expect(setAnnotation(workers["worker-a"], held, locksv1.AnnotationUnresolvedMutation, garbage)).To(
				invalidAt("metadata.annotations["+locksv1.AnnotationUnresolvedMutation+"]", "unresolved-mutation record"), what)
		}
		Expect(getGrant(ns, held.Name).Annotations).NotTo(HaveKey(locksv1.AnnotationUnresolvedMutation))

		Expect(setAnnotation(workers["worker-a"], held, locksv1.AnnotationUnresolvedMutation, recordJSON(nil))).To(Succeed())
		Expect(update(workers["worker-a"], &locksv1.LockGrant{ObjectMeta: objectMeta(ns, held.Name)}, func(g *locksv1.LockGrant) {
			delete(g.Annotations, locksv1.AnnotationUnresolvedMutation)
		})).To(Succeed())
		Expect(getGrant(ns, held.Name).Annotations).NotTo(HaveKey(locksv1.AnnotationUnresolvedMutation))
	})

})

// blobAnnotation is a tenant's annotation the operator never reads.
const blobAnnotation = "example.com/blob"

// fillMetadata returns lg's annotations plus blobAnnotation, sized so that
// lg's labels, annotations and finalizers hold exactly size bytes.
func fillMetadata(lg *locksv1.LockGrant, size int) map[string]string {
	used := 0
	for _, f := range lg.Finalizers {
		used += len(f)
	}
	for k, v := range lg.Labels {
		used += len(k) + len(v)
	}
	ann := map[string]string{}
	for k, v := range lg.Annotations {
		ann[k] = v
		used += len(k) + len(v)
	}
	ann[blobAnnotation] = strings.Repeat("x", size-used-len(blobAnnotation))
	return ann
}

func setAnnotation(c client.Client, lg *locksv1.LockGrant, key, value string) error {
	return update(c, &locksv1.LockGrant{ObjectMeta: objectMeta(lg.Namespace, lg.Name)}, func(g *locksv1.LockGrant) {
		metav1.SetMetaDataAnnotation(&g.ObjectMeta, key, value)
	})
}

// recordJSON is an unresolved-mutation record as pkg/lockclient writes it,
// changed by mutate.
func recordJSON(mutate func(map[string]any)) string {
	r := map[string]any{
		"object": "ConfigMap/batch", "operation": "settle", "fence": 1, "segment": 2,
		"payload": "sha256:" + strings.Repeat("ab", 32), "since": time.Now().UTC().Format(time.RFC3339Nano),
	}
	if mutate != nil {
		mutate(r)
	}
	b, err := json.Marshal(r)
	Expect(err).NotTo(HaveOccurred())
	return string(b)
}

// reconciliationOf reads the ReconciliationRequired condition of FencedResource batch in ns.
func reconciliationOf(ns string) func() *metav1.Condition {
	return func() *metav1.Condition {
		return findCondition(getFR(ns, "batch"), locksv1.ConditionReconciliationRequired)
	}
}
