package envtest

import (
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// namespaceController is the user kube-controller-manager's namespace
// controller acts as (--use-service-account-credentials, the usual setup,
// and the suite's).
const namespaceController = locksv1.NamespaceControllerUsername

// LockGrants belong to their owner (docs/contract.md, "LockGrants belong to their owner"): every
// spec acts through the real API server as a distinct, RBAC-limited user.
var _ = Describe("LockGrant tenancy", func() {
	var (
		ns   string
		held *locksv1.LockGrant
	)
	BeforeEach(func() {
		ns = newNamespace()
		newFencedResource(ns, "batch", 30)
		// Created as earlier client versions did, with the release finalizer:
		// a finalizer a co-tenant could remove, and the issuer's removal of
		// it once the LockGrant is deleted.
		lg := newGrant(ns, "batch", "worker-a", "a")
		lg.Finalizers = []string{locksv1.GrantFinalizer}
		Expect(workers["worker-a"].Create(suiteCtx, lg)).To(Succeed())
		held = waitPhase(lg, locksv1.PhaseHeld)
	})

	It("denies a co-tenant's delete of another owner's held LockGrant, and the owner still holds", func() {
		err := workers["worker-b"].Delete(suiteCtx, held)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "co-tenant delete: %v", err)
		Expect(err.Error()).To(And(ContainSubstring(`"worker-a"`), ContainSubstring(`"worker-b"`)))
		stays(held, locksv1.PhaseHeld)
		lg := getGrant(ns, held.Name)
		Expect(lg.DeletionTimestamp).To(BeNil())
		Expect(getFR(ns, "batch").Status.Holder.GrantName).To(Equal(held.Name))
	})

	It("denies a co-tenant's change of annotations, finalizers, labels and owner references", func() {
		// The owner records an unresolved mutation (what pkg/lockclient does).
		Expect(update(workers["worker-a"], &locksv1.LockGrant{ObjectMeta: held.ObjectMeta}, func(g *locksv1.LockGrant) {
			metav1.SetMetaDataAnnotation(&g.ObjectMeta, locksv1.AnnotationUnresolvedMutation, recordJSON(nil))
		})).To(Succeed())

		fr := getFR(ns, "batch")
		mutations := map[string]func(*locksv1.LockGrant){
			"remove the unresolved-mutation annotation": func(g *locksv1.LockGrant) {
				delete(g.Annotations, locksv1.AnnotationUnresolvedMutation)
			},
			"add a finalizer":    func(g *locksv1.LockGrant) { g.Finalizers = append(g.Finalizers, "example.com/hold") },
			"remove a finalizer": func(g *locksv1.LockGrant) { g.Finalizers = nil },
			"change a label":     func(g *locksv1.LockGrant) { metav1.SetMetaDataLabel(&g.ObjectMeta, "team", "b") },
			"add an owner reference": func(g *locksv1.LockGrant) {
				g.OwnerReferences = append(g.OwnerReferences, metav1.OwnerReference{
					APIVersion: locksv1.GroupVersion.String(), Kind: "FencedResource", Name: fr.Name, UID: fr.UID})
			},
			"release it": func(g *locksv1.LockGrant) { g.Spec.Release = true },
		}
		for what, mutate := range mutations {
			err := update(workers["worker-b"], &locksv1.LockGrant{ObjectMeta: held.ObjectMeta}, mutate)
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "co-tenant may %s: %v", what, err)
			Expect(err.Error()).To(And(ContainSubstring(`"worker-a"`), ContainSubstring(`"worker-b"`)), what)
		}
		lg := getGrant(ns, held.Name)
		Expect(lg.Annotations).To(HaveKey(locksv1.AnnotationUnresolvedMutation))
		Expect(lg.Finalizers).To(Equal([]string{locksv1.GrantFinalizer}))
		Expect(lg.Labels).NotTo(HaveKey("team"))
		Expect(lg.OwnerReferences).To(BeEmpty())
		Expect(lg.Spec.Release).To(BeFalse())
		stays(held, locksv1.PhaseHeld)
	})

	It("lets the owner label, renew, release and delete its own LockGrants", func() {
		Expect(update(workers["worker-a"], &locksv1.LockGrant{ObjectMeta: held.ObjectMeta}, func(g *locksv1.LockGrant) {
			metav1.SetMetaDataLabel(&g.ObjectMeta, "team", "a")
			metav1.SetMetaDataAnnotation(&g.ObjectMeta, locksv1.AnnotationUnresolvedMutation, recordJSON(nil))
		})).To(Succeed())
		Expect(update(workers["worker-a"], &locksv1.LockGrant{ObjectMeta: held.ObjectMeta}, func(g *locksv1.LockGrant) {
			delete(g.Annotations, locksv1.AnnotationUnresolvedMutation)
		})).To(Succeed())
		renew(held)
		release(held)
		waitPhase(held, locksv1.PhaseReleased)

		next := waitPhase(request(ns, "batch", "worker-a", "b"), locksv1.PhaseHeld)
		Expect(workers["worker-a"].Delete(suiteCtx, next)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(admin.Get(suiteCtx, client.ObjectKeyFromObject(next), &locksv1.LockGrant{}))
		}).Should(BeTrue())
		// An ended LockGrant is out of the issuer's cache index; deleting it
		// brings it back in until the issuer has removed its finalizer.
		Expect(held.Finalizers).To(ContainElement(locksv1.GrantFinalizer))
		Expect(workers["worker-a"].Delete(suiteCtx, held)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(admin.Get(suiteCtx, client.ObjectKeyFromObject(held), &locksv1.LockGrant{}))
		}).Should(BeTrue())
	})

	It("denies a user who may delete LockGrants but holds no break-glass verb", func() {
		deleter := userClient("lockgrant-janitor")
		bindRole(ns, "lockgrant-janitor", "get", "list", "update", "patch", "delete")
		err := deleter.Delete(suiteCtx, held)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "delete without break-glass: %v", err)
		Expect(err.Error()).To(ContainSubstring(`"lockgrant-janitor"`))
		stays(held, locksv1.PhaseHeld)
	})

	It("allows and audits a break-glass user's changes and delete", func() {
		before := metricValue("fencekeeper_lockgrant_break_glass_total")
		oncall := userClient("oncall")
		bindRole(ns, "oncall", "get", "list", "update", "patch", "delete", "break-glass")
		Expect(update(workers["worker-a"], &locksv1.LockGrant{ObjectMeta: held.ObjectMeta}, func(g *locksv1.LockGrant) {
			metav1.SetMetaDataAnnotation(&g.ObjectMeta, locksv1.AnnotationUnresolvedMutation, recordJSON(nil))
		})).To(Succeed())
		// Reconciling by hand: the on-call engineer clears the record.
		Expect(update(oncall, &locksv1.LockGrant{ObjectMeta: held.ObjectMeta}, func(g *locksv1.LockGrant) {
			delete(g.Annotations, locksv1.AnnotationUnresolvedMutation)
		})).To(Succeed())
		Expect(oncall.Delete(suiteCtx, held)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(admin.Get(suiteCtx, client.ObjectKeyFromObject(held), &locksv1.LockGrant{}))
		}).Should(BeTrue())

		notes := func() []string { return eventNotes(ns, held.Name, "BreakGlass") }
		Eventually(notes).Should(ContainElement(And(ContainSubstring(`"oncall"`), ContainSubstring("delete"), ContainSubstring(`"worker-a"`))))
		Eventually(notes).Should(ContainElement(And(ContainSubstring(`"oncall"`), ContainSubstring(locksv1.AnnotationUnresolvedMutation))))
		Expect(metricValue("fencekeeper_lockgrant_break_glass_total")).To(BeNumerically(">=", before+2))
	})

	It("treats cluster-admin as break-glass: authorized for every verb, and audited", func() {
		Expect(admin.Delete(suiteCtx, held)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(admin.Get(suiteCtx, client.ObjectKeyFromObject(held), &locksv1.LockGrant{}))
		}).Should(BeTrue())
		Eventually(func() []string { return eventNotes(ns, held.Name, "BreakGlass") }).Should(ContainElement(ContainSubstring("delete")))
	})

	It("denies the namespace controller while the namespace is live", func() {
		err := namespaceControllerClient().Delete(suiteCtx, held)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "namespace controller in a live namespace: %v", err)
		// The webhook's refusal, not RBAC's: the bootstrap role may delete anything.
		Expect(err.Error()).To(ContainSubstring(`"worker-a"`))
		stays(held, locksv1.PhaseHeld)
	})

	It("lets a namespace holding a FencedResource and a held LockGrant be deleted", func() {
		waiter := request(ns, "batch", "worker-b", "b")
		waitQueued(ns, "batch", waiter.Name)
		// kube-controller-manager's namespace controller empties it as its
		// own service account: the webhooks let it delete the held grant, the
		// waiter and the FencedResource, and the operator releases the grant.
		Expect(admin.Delete(suiteCtx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(admin.Get(suiteCtx, client.ObjectKey{Name: ns}, &corev1.Namespace{}))
		}, 30*time.Second).Should(BeTrue(), "namespace %s was not deleted", ns)
		// A terminating namespace takes no new Events: the audit record is
		// about the Namespace, so it lands in the default namespace.
		Eventually(func() []string { return eventNotes(metav1.NamespaceDefault, ns, locksv1.EventReasonNamespaceDeletion) }).Should(
			ContainElement(And(ContainSubstring(held.Name), ContainSubstring(`"worker-a"`))))
	})
})

// waitQueued waits until the FencedResource queues the LockGrant.
func waitQueued(ns, fr, grant string) {
	GinkgoHelper()
	Eventually(func() []string {
		var names []string
		for _, q := range getFR(ns, fr).Status.Queue {
			names = append(names, q.GrantName)
		}
		return names
	}).Should(ContainElement(grant))
}

var userClients sync.Map

// userClient is an authenticated client of a user outside the workers group.
func userClient(name string) client.Client {
	if c, ok := userClients.Load(name); ok {
		return c.(client.Client)
	}
	u, err := cp.AddUser(name)
	Expect(err).NotTo(HaveOccurred())
	c, err := client.New(u.Config(), client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	userClients.Store(name, c)
	return c
}

// bindRole grants user the verbs on LockGrants in ns.
func bindRole(ns, user string, verbs ...string) {
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{locksv1.GroupVersion.Group}, Resources: []string{"lockgrants"}, Verbs: verbs}}}
	Expect(admin.Create(suiteCtx, role)).To(Succeed())
	Expect(admin.Create(suiteCtx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}})).To(Succeed())
}

// namespaceControllerClient authenticates as the namespace controller's
// user, so that RBAC gives it the bootstrap role the real one has
// (system:controller:namespace-controller, bound to that service account).
func namespaceControllerClient() client.Client {
	return userClient(namespaceController)
}

// eventNotes lists the notes of the Events in eventNS with reason about the named object.
func eventNotes(eventNS, name, reason string) []string {
	var list corev1.EventList
	Expect(admin.List(suiteCtx, &list, client.InNamespace(eventNS))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Name == name && e.Reason == reason {
			out = append(out, e.Message)
		}
	}
	return out
}
