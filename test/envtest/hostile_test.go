package envtest

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// A field of 128 multibyte characters passed the schema
// (maxLength counts characters) and then failed the grant's byte limit in
// the issuer, which aborted every decision for the resource: nobody queued
// behind it was served. The schema and the LockGrant webhook now count
// bytes as a grant does, and say which field and which limit.
var _ = Describe("hostile input: field sizes in bytes", func() {
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
		newFencedResource(ns, "batch", 10)
	})

	long := strings.Repeat("ü", 128) // 128 characters, 256 bytes
	for _, c := range []struct {
		field string
		set   func(*locksv1.LockGrant)
	}{
		{"requestID", func(lg *locksv1.LockGrant) {
			lg.Spec.RequestID = long
			lg.Name = locksv1.LockGrantName("batch", "worker-a", long)
		}},
		{"lease", func(lg *locksv1.LockGrant) { lg.Spec.Lease = long }},
		{"operationCategory", func(lg *locksv1.LockGrant) { lg.Spec.OperationCategory = long }},
	} {
		It("refuses a LockGrant whose "+c.field+" is 128 characters but 256 bytes, and serves the next request", func() {
			lg := newGrant(ns, "batch", "worker-a", "hostile")
			c.set(lg)
			Expect(workers["worker-a"].Create(suiteCtx, lg)).To(invalidAt("spec."+c.field, "at most 253 bytes of UTF-8"))
			honest := request(ns, "batch", "worker-b", "honest")
			Eventually(func() locksv1.LockGrantPhase { return getGrant(ns, honest.Name).Status.Phase }, 10*time.Second).Should(Equal(locksv1.PhaseHeld))
		})
	}
})

// A policy entry longer in bytes than a grant field could never be matched
// by a signable request: the entry is refused where it is written.
var _ = Describe("hostile input: FencedResource policy entries in bytes", func() {
	long := strings.Repeat("ü", 128) // 128 characters, 256 bytes
	for field, set := range map[string]func(*locksv1.FencedResource){
		"operationCategories": func(fr *locksv1.FencedResource) { fr.Spec.OperationCategories = []string{"settle", long} },
		"allowedOwners":       func(fr *locksv1.FencedResource) { fr.Spec.AllowedOwners = []string{long} },
	} {
		It("refuses an "+field+" entry of 128 characters but 256 bytes", func() {
			ns := newNamespace()
			fr := &locksv1.FencedResource{ObjectMeta: objectMeta(ns, "batch"),
				Spec: locksv1.FencedResourceSpec{ResourceID: "batch", LeaseDurationSeconds: 10}}
			set(fr)
			Expect(admin.Create(suiteCtx, fr)).To(invalidAt("spec."+field, "at most 253 bytes of UTF-8"))
		})
	}
})
