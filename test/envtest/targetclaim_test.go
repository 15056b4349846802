package envtest

import (
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/webhooks"
)

// One object has one registry entry, also when two creates race: the create
// webhook claims the target with a Lease whose name the API server keeps
// unique (docs/security.md). The specs run under the operator-namespace
// policy, which lets nobody but the operator write a claim: the claims are
// taken and collected through it, and the specs age them as the operator.
var _ = Describe("Target claims", Ordered, func() {
	var (
		op        client.Client // the operator's identity
		stopGuard func()
	)
	BeforeAll(func() {
		var err error
		op, err = client.New(opCfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		stopGuard = startGuard(suiteKinds)
		Eventually(func() error {
			return setAnchorData(admin, locksv1.TrustBundleConfigMap, "k-probe", randomPublicKey(), client.DryRunAll)
		}).Should(notOperator)
	})
	AfterAll(func() {
		if stopGuard != nil {
			stopGuard()
		}
		removeTrustAnchorPolicy(admin)
	})
	entry := func(ns, name, target string) *locksv1.FencedResource {
		return &locksv1.FencedResource{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: locksv1.FencedResourceSpec{ResourceID: ns + "/" + name, LeaseDurationSeconds: 10,
				Target: &locksv1.ObjectTarget{APIVersion: "v1", Kind: "ConfigMap", Name: target}},
		}
	}
	claimOf := func(ns, target string) *coordinationv1.Lease {
		l := &coordinationv1.Lease{}
		Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: opNamespace,
			Name: locksv1.TargetClaimName(ns, locksv1.TargetKey("", "ConfigMap", target))}, l)).To(Succeed())
		return l
	}

	It("admits one of two entries created at the same moment for one target", func() {
		ns := newNamespace()
		for round := range 20 {
			target := fmt.Sprintf("t-%d", round)
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i := range 2 {
				wg.Go(func() { errs[i] = admin.Create(suiteCtx, entry(ns, fmt.Sprintf("e-%d-%d", round, i), target)) })
			}
			wg.Wait()
			admitted := 0
			for _, err := range errs {
				if err == nil {
					admitted++
					continue
				}
				// The loser either saw the winner stored, or its claim fresh.
				Expect(apierrors.IsInvalid(err) || apierrors.IsConflict(err)).To(BeTrue(), "round %d: %v", round, err)
			}
			Expect(admitted).To(Equal(1), "round %d: %v", round, errs)
			var list locksv1.FencedResourceList
			Expect(admin.List(suiteCtx, &list, client.InNamespace(ns))).To(Succeed())
			n := 0
			for _, fr := range list.Items {
				if fr.Spec.Target.Name == target {
					n++
				}
			}
			Expect(n).To(Equal(1), "round %d", round)
		}
	})

	It("holds a target for an entry that is not stored for the grace, then lets it go", func() {
		ns := newNamespace()
		Expect(admin.Create(suiteCtx, entry(ns, "first", "t"))).To(Succeed())
		Expect(admin.Delete(suiteCtx, entry(ns, "first", "t"))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(admin.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: "first"}, &locksv1.FencedResource{}))
		}).Should(BeTrue())
		// Its own name takes it back at once.
		Expect(admin.Create(suiteCtx, entry(ns, "first", "t"))).To(Succeed())
		Expect(admin.Delete(suiteCtx, entry(ns, "first", "t"))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(admin.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: "first"}, &locksv1.FencedResource{}))
		}).Should(BeTrue())
		// Another entry waits: "first" might be a create still on its way.
		err := admin.Create(suiteCtx, entry(ns, "second", "t"))
		Expect(apierrors.IsConflict(err)).To(BeTrue(), "%v", err)
		Expect(err).To(MatchError(And(ContainSubstring("claimed for FencedResource "+ns+"/first"), ContainSubstring("retry after"))))
		Expect(*claimOf(ns, "t").Spec.HolderIdentity).To(Equal(ns + "/first"))
		// Once the claim is older than the grace, it is taken over.
		old := claimOf(ns, "t")
		old.Spec.AcquireTime = &metav1.MicroTime{Time: time.Now().Add(-3 * time.Minute)}
		Expect(op.Update(suiteCtx, old)).To(Succeed())
		Expect(admin.Create(suiteCtx, entry(ns, "second", "t"))).To(Succeed())
		Expect(*claimOf(ns, "t").Spec.HolderIdentity).To(Equal(ns + "/second"))
		// And the entry that holds it keeps it, however old the claim.
		held := claimOf(ns, "t")
		held.Spec.AcquireTime = &metav1.MicroTime{Time: time.Now().Add(-time.Hour)}
		Expect(op.Update(suiteCtx, held)).To(Succeed())
		Expect(admin.Create(suiteCtx, entry(ns, "third", "t"))).To(invalidAt("spec.target", "already protected by FencedResource second"))
	})

	// Every entry ever created left its claim behind, so a
	// tenant creating and deleting entries grew the operator namespace
	// without bound. The operator deletes a claim a create would take over.
	It("collects the claims of deleted entries after the grace, as the operator, and keeps live entries' claims", func() {
		ns := newNamespace()
		for _, name := range []string{"gone-1", "gone-2", "live"} {
			Expect(admin.Create(suiteCtx, entry(ns, name, "t-"+name))).To(Succeed())
		}
		for _, name := range []string{"gone-1", "gone-2"} {
			Expect(admin.Delete(suiteCtx, entry(ns, name, "t-"+name))).To(Succeed())
		}
		age := func(target string, by time.Duration) {
			l := claimOf(ns, target)
			l.Spec.AcquireTime = &metav1.MicroTime{Time: time.Now().Add(-by)}
			Expect(op.Update(suiteCtx, l)).To(Succeed())
		}
		age("t-gone-1", 3*time.Minute) // past the grace
		age("t-gone-2", time.Minute)   // its create might still be on its way
		age("t-live", time.Hour)       // old, but its entry holds it
		c := &webhooks.TargetClaimCollector{Claims: op, Entries: op, Writer: op, Namespace: opNamespace}
		Eventually(func() error { // the operator's own identity: its Role must allow list and delete
			_, err := c.Collect(suiteCtx)
			return err
		}).Should(Succeed())
		exists := func(target string) bool {
			err := admin.Get(suiteCtx, client.ObjectKey{Namespace: opNamespace, Name: locksv1.TargetClaimName(ns, locksv1.TargetKey("", "ConfigMap", target))}, &coordinationv1.Lease{})
			Expect(client.IgnoreNotFound(err)).To(Succeed())
			return err == nil
		}
		Expect(exists("t-gone-1")).To(BeFalse(), "a stale claim is collected")
		Expect(exists("t-gone-2")).To(BeTrue(), "a claim younger than the grace is kept")
		Expect(exists("t-live")).To(BeTrue(), "a live entry's claim is kept")
		// And a new entry for the collected target needs no take-over.
		Expect(admin.Create(suiteCtx, entry(ns, "again", "t-gone-1"))).To(Succeed())
	})

	It("leaves no claim behind for a dry run or a refused create", func() {
		ns := newNamespace()
		Expect(admin.Create(suiteCtx, entry(ns, "dry", "t"), client.DryRunAll)).To(Succeed())
		bad := entry(ns, "bad", "t")
		bad.Spec.Target.Kind = "NoSuchKind"
		Expect(admin.Create(suiteCtx, bad)).NotTo(Succeed())
		for _, kind := range []string{"ConfigMap", "NoSuchKind"} {
			err := admin.Get(suiteCtx, client.ObjectKey{Namespace: opNamespace,
				Name: locksv1.TargetClaimName(ns, locksv1.TargetKey("", kind, "t"))}, &coordinationv1.Lease{})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s: %v", kind, err)
		}
		// The target is free for an entry of another name.
		Expect(admin.Create(suiteCtx, entry(ns, "real", "t"))).To(Succeed())
	})
})
