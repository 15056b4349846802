package envtest

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// The API server keeps every object's managedFields, decoded into maps, in
// its watch cache, and recomputes them on every write. A status the
// operator owns field by field cost more there than the status itself (the
// holder, each condition, every store), on every registry entry and grant
// of the cluster; an atomic status is one path.
var _ = Describe("the API server's field ownership of a registry entry and a grant", func() {
	It("records the operator's status writes as one path", func() {
		ns := newNamespace()
		newFencedResource(ns, "batch", 3600)
		a := held(ns, "batch", "worker-a", "a")
		b := request(ns, "batch", "worker-b", "b")
		waitPhase(b, locksv1.PhasePending)
		release(a)
		waitPhase(b, locksv1.PhaseHeld)
		waitPhase(a, locksv1.PhaseReleased)

		fr := getFR(ns, "batch")
		Expect(fr.Status.Holder).NotTo(BeNil())
		Expect(fr.Status.Conditions).NotTo(BeEmpty())
		Expect(statusOwnership(fr)).To(ConsistOf(`{"f:status":{}}`), "FencedResource %s", fr.Name)
		for _, lg := range []*locksv1.LockGrant{a, b} {
			got := getGrant(ns, lg.Name)
			Expect(got.Status.Conditions).NotTo(BeEmpty())
			Expect(statusOwnership(got)).To(ConsistOf(`{"f:status":{}}`), "LockGrant %s", lg.Name)
		}
	})
})

// statusOwnership is the field set of every managedFields entry of obj's
// status subresource.
func statusOwnership(obj client.Object) []string {
	var sets []string
	for _, e := range obj.GetManagedFields() {
		if e.Subresource == "status" && e.FieldsV1 != nil {
			sets = append(sets, e.FieldsV1.GetRawString())
		}
	}
	return sets
}
