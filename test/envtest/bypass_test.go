package envtest

import (
	"math"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// shardKind has status and scale subresources (testdata/invoiceshards.yaml).
var shardKind = protectedKind{
	name: "custom resource with subresources", gvk: schema.GroupVersionKind{Group: "billing.example.com", Version: "v1", Kind: "InvoiceShard"},
	setContent: func(u *unstructured.Unstructured, v string) {
		u.Object["spec"] = map[string]any{"result": v, "replicas": int64(1)}
	},
	getContent: func(u *unstructured.Unstructured) string {
		s, _, _ := unstructured.NestedString(u.Object, "spec", "result")
		return s
	},
}

// unfenced builds the object as a stranger would write it: no fence, and
// labels and annotations only if given.
// plantForgery creates t, unlabelled and so before anything protects it,
// carrying a fence annotation for its resource under fence f with a proof
// no key made.
func plantForgery(t target, f int64) {
	GinkgoHelper()
	a := newGrant(t.ns, t.name, "worker-a", "x")
	forged := fence.Envelope{Grant: grant.Grant{Schema: grant.Schema, Resource: "test/" + t.ns + "/" + t.name, Owner: "worker-a", RequestID: "x",
		Lease: "l", OperationRoot: a.Spec.OperationRoot, FenceToken: f, BackendRevision: "1", PolicyGeneration: 1, IssuerEpoch: 1, TTLSeconds: 10,
		IssuedAt: "2026-01-01T00:00:00Z"}, Proof: "ed25519:nobody:" + strings.Repeat("A", 86) + "==", Operation: "job", Segment: 1, Payload: "sha256:" + strings.Repeat("cd", 32)}
	ann := map[string]string{fence.AnnotationResource: t.name}
	_, err := fence.Stamp(ann, forged)
	Expect(err).NotTo(HaveOccurred())
	Expect(workers["worker-c"].Create(suiteCtx, t.unfenced("x", nil, ann))).To(Succeed())
}

func (t target) unfenced(v string, labels, annotations map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(t.kind.gvk)
	u.SetNamespace(t.ns)
	u.SetName(t.name)
	u.SetLabels(labels)
	u.SetAnnotations(annotations)
	t.kind.setContent(u, v)
	return u
}

// impersonating is an admin client acting as user in groups.
func impersonating(user string, groups ...string) client.Client {
	cfg := rest.CopyConfig(adminCfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// Every path around the acceptance point that a user with ordinary RBAC has:
// the registry decides what is protected, not the object's labels.
var _ = Describe("the registry decides what is protected", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	for _, kind := range protectedKinds {
		Context("for a "+kind.name, func() {
			It("denies a stranger creating the absent target without the label", func() {
				t := newTarget(kind, ns, "batch", locksv1.EnforcementEnforce)
				t.deniedWith(fence.FenceRequired, func() error {
					return workers["worker-b"].Create(suiteCtx, t.unfenced("planted", nil, nil))
				})
			})

			It("denies removing the label or the annotation, even under a current grant", func() {
				t := newTarget(kind, ns, "batch", locksv1.EnforcementEnforce)
				a := held(ns, "batch", "worker-a", "a")
				Expect(t.write(a, 1, "v1")).To(Succeed())
				t.deniedWith(fence.ProtectionRemoved, func() error {
					return t.write(a, 2, "v2", writeOpts{object: func(u *unstructured.Unstructured) { u.SetLabels(nil) }})
				})
				t.deniedWith(fence.ProtectionRemoved, func() error {
					return t.write(a, 2, "v2", writeOpts{object: func(u *unstructured.Unstructured) {
						ann := u.GetAnnotations()
						delete(ann, fence.AnnotationResource)
						u.SetAnnotations(ann)
					}})
				})
				// A stranger's unlabelled update is seen and denied too.
				t.deniedWith(fence.ProtectionRemoved, func() error {
					u := t.get()
					u.SetLabels(nil)
					t.kind.setContent(u, "stranger")
					return workers["worker-b"].Update(suiteCtx, u)
				})
				Expect(t.content()).To(Equal("v1"))
			})
		})
	}

	It("denies /scale of a protected custom resource and lets status through", func() {
		t := newTarget(shardKind, ns, "shard", locksv1.EnforcementEnforce)
		a := held(ns, "shard", "worker-a", "a")
		Expect(t.write(a, 1, "v1")).To(Succeed())
		obj := t.get()
		scale := &unstructured.Unstructured{}
		scale.SetGroupVersionKind(autoscalingv1.SchemeGroupVersion.WithKind("Scale"))
		Expect(workers["worker-b"].SubResource("scale").Get(suiteCtx, obj, scale)).To(Succeed())
		Expect(unstructured.SetNestedField(scale.Object, int64(7), "spec", "replicas")).To(Succeed())
		t.deniedWith(fence.FenceRequired, func() error {
			return workers["worker-b"].SubResource("scale").Update(suiteCtx, obj, client.WithSubResourceBody(scale))
		})
		replicas, _, _ := unstructured.NestedInt64(t.get().Object, "spec", "replicas")
		Expect(replicas).To(Equal(int64(1)))
		// The status subresource carries no business content.
		obj = t.get()
		Expect(unstructured.SetNestedField(obj.Object, int64(1), "status", "replicas")).To(Succeed())
		Expect(admin.Status().Update(suiteCtx, obj)).To(Succeed())
		// Nor can /status carry a metadata change past the webhook.
		obj = t.get()
		obj.SetLabels(nil)
		ann := obj.GetAnnotations()
		ann[fence.AnnotationReceipts] = "[]"
		obj.SetAnnotations(ann)
		_ = workers["worker-b"].Status().Update(suiteCtx, obj)
		Expect(t.get().GetLabels()).To(HaveKeyWithValue(fence.LabelProtected, "true"))
		Expect(t.get().GetAnnotations()[fence.AnnotationReceipts]).NotTo(Equal("[]"))
	})

	It("fences status of a custom kind without a status subresource", func() {
		t := newTarget(protectedKinds[1], ns, "batch", locksv1.EnforcementEnforce)
		a := held(ns, "batch", "worker-a", "a")
		Expect(t.write(a, 1, "v1")).To(Succeed())
		t.deniedWith(fence.FenceRequired, func() error {
			u := t.get()
			Expect(unstructured.SetNestedField(u.Object, "done", "status", "phase")).To(Succeed())
			return workers["worker-b"].Update(suiteCtx, u)
		})
	})

	It("lets the namespace controller empty a terminating namespace, audited, and nobody else", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		a := held(ns, "batch", "worker-a", "a")
		Expect(t.write(a, 1, "v1")).To(Succeed())
		nsController := impersonating(locksv1.NamespaceControllerUsername, "system:masters")
		// Not terminating: the namespace controller is nobody special.
		t.deniedWith(fence.DeleteNotDeclared, func() error { return nsController.Delete(suiteCtx, t.get()) })

		// The namespace controller deletes in no fixed order; a target whose
		// entry went first is no longer protected and its delete is no
		// teardown. A finalizer keeps the entry until the target is gone.
		const keep = "example.com/keep-entry"
		Expect(update(admin, getFR(ns, "batch"), func(fr *locksv1.FencedResource) { fr.Finalizers = append(fr.Finalizers, keep) })).To(Succeed())

		// kube-controller-manager's namespace controller empties it now. A
		// worker's delete that gets there first is still refused.
		Expect(admin.Delete(suiteCtx, &corev1.Namespace{ObjectMeta: objectMeta("", ns)})).To(Succeed())
		if obj := t.get(); obj != nil {
			if err := workers["worker-b"].Delete(suiteCtx, obj); !apierrors.IsNotFound(err) {
				Expect(err).To(denied(fence.DeleteNotDeclared))
			}
		}
		Eventually(t.get, 30*time.Second).Should(BeNil(), "the namespace controller did not delete the enforced target")
		// Audited on the Namespace (its Events land in default): a terminating namespace takes no new Events.
		Eventually(func() []string { return eventReasons("default", ns) }).Should(ContainElement(locksv1.EventReasonNamespaceTeardown))
		Expect(update(admin, getFR(ns, "batch"), func(fr *locksv1.FencedResource) { fr.Finalizers = nil })).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(admin.Get(suiteCtx, client.ObjectKey{Name: ns}, &corev1.Namespace{}))
		}, 30*time.Second).Should(BeTrue(), "namespace %s was not deleted", ns)
	})

	It("ends protection with a Shadow entry: its target is writable again", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementShadow)
		Expect(workers["worker-b"].Create(suiteCtx, t.unfenced("v1", map[string]string{fence.LabelProtected: "true"},
			map[string]string{fence.AnnotationResource: "batch"}))).To(Succeed())
		Expect(admin.Delete(suiteCtx, getFR(ns, "batch"))).To(Succeed())
		Eventually(func() error {
			u := t.get()
			t.kind.setContent(u, "v2")
			return workers["worker-c"].Update(suiteCtx, u)
		}).Should(Succeed())
		Expect(t.content()).To(Equal("v2"))
	})

	It("counts planted fence state for nothing: it neither raises highestObservedFence nor jams the object", func() {
		kind := protectedKinds[0]
		other := newTarget(kind, ns, "other", locksv1.EnforcementEnforce)
		o := held(ns, "other", "worker-b", "o")
		Expect(other.write(o, 1, "o1")).To(Succeed())
		for i := 0; i < 4; i++ { // fence 5 of another resource
			release(o)
			waitPhase(o, locksv1.PhaseReleased)
			o = held(ns, "other", "worker-b", "o"+string(rune('a'+i)))
			Expect(other.write(o, 1, "o")).To(Succeed())
		}
		planted := map[string]string{fence.AnnotationResource: "batch",
			fence.AnnotationFence: other.get().GetAnnotations()[fence.AnnotationFence], fence.AnnotationReceipts: other.get().GetAnnotations()[fence.AnnotationReceipts]}
		labels := map[string]string{fence.LabelProtected: "true"}
		// In a namespace that holds entries, fence state is written to targets only.
		stray := target{kind: kind, ns: ns, name: "stray"}
		stray.deniedWith(fence.WrongResource, func() error { return workers["worker-c"].Create(suiteCtx, stray.unfenced("x", labels, planted)) })

		// Elsewhere, unlabelled, before the object is registered, anything goes: plant it there.
		fresh := newNamespace()
		t := target{kind: kind, ns: fresh, name: "batch"}
		Expect(workers["worker-c"].Create(suiteCtx, t.unfenced("x", nil, planted))).To(Succeed())
		newTarget(kind, fresh, "batch", locksv1.EnforcementEnforce)
		a := held(fresh, "batch", "worker-a", "a")
		Expect(a.Status.Grant.FenceToken).To(Equal(int64(1)))
		Expect(t.write(a, 1, "v1")).To(Succeed())
		Expect(t.write(a, 2, "v2")).To(Succeed())
		Consistently(func() int64 { return getFR(fresh, "batch").Status.HighestObservedFence }, "1s").Should(BeNumerically("<=", 1))
		receipts, err := fence.ParseReceipts(t.get().GetAnnotations()[fence.AnnotationReceipts])
		Expect(err).NotTo(HaveOccurred())
		Expect(receipts).To(HaveLen(2), "the planted receipts are not inherited")
	})

	// The floor check once parsed the target's fence
	// annotation without verifying it, so a forgery planted before the
	// namespace was enrolled (fence 2^63-1, a bogus proof) made an entry for
	// the object impossible to create, whatever floor the schema allows.
	It("does not let a forged fence planted before registration raise the floor an entry needs", func() {
		kind := protectedKinds[0]
		fresh := newNamespace()
		plantForgery(target{kind: kind, ns: fresh, name: "batch"}, math.MaxInt64)
		newTarget(kind, fresh, "batch", locksv1.EnforcementEnforce) // no floor: the forgery counts for nothing
		h := held(fresh, "batch", "worker-a", "a")
		Expect(h.Status.Grant.FenceToken).To(Equal(int64(1)))
	})

	It("lets the client start a new receipt log over a forgery of its own resource planted before registration", func() {
		kind := protectedKinds[0]
		fresh := newNamespace()
		t := target{kind: kind, ns: fresh, name: "batch"}
		plantForgery(t, 1)
		newTarget(kind, fresh, "batch", locksv1.EnforcementEnforce, func(fr *locksv1.FencedResource) { fr.Spec.FenceFloor = 1 })

		c, _ := faultyWorker(fresh, "worker-a")
		l := mustAcquire(c, "batch", "job-1")
		cm := configMapNamed(fresh, "batch")
		r, err := l.Operation("job").Commit(suiteCtx, cm, setData(cm, "v1"))
		Expect(err).NotTo(HaveOccurred())
		receipts, err := fence.ParseReceipts(t.get().GetAnnotations()[fence.AnnotationReceipts])
		Expect(err).NotTo(HaveOccurred())
		Expect(receipts).To(ConsistOf(r), "the forged log is not inherited")
	})

	It("denies a stranger re-creating a deleted target while its entry exists", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		t.deniedWith(fence.FenceRequired, func() error {
			return workers["worker-b"].Create(suiteCtx, t.unfenced("planted", map[string]string{"app": "x"}, nil))
		})
		Expect(apierrors.IsNotFound(admin.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: "batch"}, &corev1.ConfigMap{}))).To(BeTrue())
	})
})
