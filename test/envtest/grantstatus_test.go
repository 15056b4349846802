package envtest

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers"
)

// The issuer writes a LockGrant's status as one JSON patch conditioned on the
// version it read (controllers.WriteGrantStatus). What the API server makes
// of it: a decision made from an older view must never move a LockGrant, and
// the status sent must be the status stored, not merged into the old one.
var _ = Describe("the issuer's LockGrant status write", func() {
	It("is a conflict from a stale version and replaces the whole status from the current one", func() {
		ns := newNamespace()
		newFencedResource(ns, "batch", 3600)
		lg := request(ns, "batch", "worker-a", "status-write")
		stale := waitPhase(lg, locksv1.PhaseHeld)
		release(lg)
		released := waitPhase(lg, locksv1.PhaseReleased)
		Expect(released.Status.ExpiresAt).NotTo(BeNil())
		opClient, err := client.New(opCfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())

		// The status a decision made from the Held view would write.
		st := *released.Status.DeepCopy()
		st.ExpiresAt, st.ObservedRenewals = nil, 7
		err = controllers.WriteGrantStatus(suiteCtx, opClient, stale.DeepCopy(), st)
		Expect(apierrors.IsConflict(err)).To(BeTrue(), "a write from resourceVersion %s (stored: %s): %v",
			stale.ResourceVersion, released.ResourceVersion, err)
		Expect(getGrant(ns, lg.Name).Status).To(Equal(released.Status), "the conflict changed the status")

		// From the current version: stored exactly as sent, expiresAt gone,
		// and lg left at the version the write made.
		written := released.DeepCopy()
		Expect(controllers.WriteGrantStatus(suiteCtx, opClient, written, st)).To(Succeed())
		stored := getGrant(ns, lg.Name)
		Expect(written.ResourceVersion).NotTo(Equal(released.ResourceVersion))
		Expect(written.ResourceVersion).To(Equal(stored.ResourceVersion))
		Expect(stored.Status).To(Equal(st))
		Expect(stored.Spec).To(Equal(released.Spec))
		Expect(written.Status).To(Equal(st))
	})
})
