package envtest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers"
	"github.com/fencekeeper/fencekeeper/internal/certs"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/webhooks"
)

// protectedKind is one kind of protected object the acceptance webhook serves.
type protectedKind struct {
	name       string
	gvk        schema.GroupVersionKind
	setContent func(u *unstructured.Unstructured, v string)
	getContent func(u *unstructured.Unstructured) string
}

var protectedKinds = []protectedKind{
	{
		name: "ConfigMap", gvk: schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
		setContent: func(u *unstructured.Unstructured, v string) { u.Object["data"] = map[string]any{"result": v} },
		getContent: func(u *unstructured.Unstructured) string {
			s, _, _ := unstructured.NestedString(u.Object, "data", "result")
			return s
		},
	},
	{
		name: "custom resource", gvk: schema.GroupVersionKind{Group: "billing.example.com", Version: "v1", Kind: "InvoiceBatch"},
		setContent: func(u *unstructured.Unstructured, v string) {
			u.Object["spec"] = map[string]any{"result": v, "lines": int64(9007199254740993)}
		},
		getContent: func(u *unstructured.Unstructured) string {
			s, _, _ := unstructured.NestedString(u.Object, "spec", "result")
			return s
		},
	},
}

// target is one protected object and its registry entry.
type target struct {
	kind protectedKind
	ns   string
	name string // also the FencedResource's name
}

func newTarget(k protectedKind, ns, name string, mode locksv1.EnforcementMode, mutate ...func(*locksv1.FencedResource)) target {
	newFencedResource(ns, name, 10, append([]func(*locksv1.FencedResource){func(fr *locksv1.FencedResource) {
		fr.Spec.Enforcement = mode
		fr.Spec.Target = &locksv1.ObjectTarget{APIVersion: k.gvk.GroupVersion().String(), Kind: k.gvk.Kind, Name: name}
	}}, mutate...)...)
	return target{kind: k, ns: ns, name: name}
}

func (t target) get() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(t.kind.gvk)
	err := admin.Get(suiteCtx, client.ObjectKey{Namespace: t.ns, Name: t.name}, u)
	if apierrors.IsNotFound(err) {
		return nil
	}
	Expect(err).NotTo(HaveOccurred())
	return u
}

func (t target) content() string { return t.kind.getContent(t.get()) }

// writeOpts adjust one fenced write.
type writeOpts struct {
	user     string                           // defaults to the grant's owner
	envelope func(*fence.Envelope)            // tamper with the envelope after it was built
	object   func(*unstructured.Unstructured) // tamper with the object after stamping
	raw      *string                          // use this fence annotation verbatim
	via      client.Client                    // write through this client (default: the user's worker client)
}

// write performs one fenced write of content v as segment seg under lg's grant,
// the way the worker client does: read, set content, digest, stamp, write.
func (t target) write(lg *locksv1.LockGrant, seg int64, v string, o ...writeOpts) error {
	var opt writeOpts
	if len(o) > 0 {
		opt = o[0]
	}
	// The grant from the LockGrant's status mirror, which follows the
	// registry's holder record by up to heldMirrorDelay (lockclient itself
	// takes it from the registry).
	Eventually(func() *locksv1.GrantDocument {
		lg = getGrant(lg.Namespace, lg.Name)
		return lg.Status.Grant
	}).ShouldNot(BeNil(), "LockGrant %s has no grant", lg.Name)
	u := t.get()
	create := u == nil
	if create {
		u = &unstructured.Unstructured{}
		u.SetGroupVersionKind(t.kind.gvk)
		u.SetNamespace(t.ns)
		u.SetName(t.name)
		u.SetLabels(map[string]string{fence.LabelProtected: "true"})
		u.SetAnnotations(map[string]string{fence.AnnotationResource: t.name})
	}
	// Like the client: a fenced write carries the protection marks.
	u.SetLabels(mergeMap(u.GetLabels(), map[string]string{fence.LabelProtected: "true"}))
	u.SetAnnotations(mergeMap(u.GetAnnotations(), map[string]string{fence.AnnotationResource: t.name}))
	t.kind.setContent(u, v)
	payload, err := fence.PayloadDigest(fence.ObjectPayload(u.Object))
	Expect(err).NotTo(HaveOccurred())
	env := fence.Envelope{Grant: lg.Status.Grant.ToGrant(), Proof: lg.Status.Proof, Operation: "op-" + lg.Name, Segment: seg, Payload: payload}
	if opt.envelope != nil {
		opt.envelope(&env)
	}
	ann := u.GetAnnotations()
	_, err = fence.Stamp(ann, env)
	Expect(err).NotTo(HaveOccurred())
	if opt.raw != nil {
		ann[fence.AnnotationFence] = *opt.raw
	}
	u.SetAnnotations(ann)
	if opt.object != nil {
		opt.object(u)
	}
	user := opt.user
	if user == "" {
		user = lg.Spec.Owner
	}
	via := opt.via
	if via == nil {
		via = workers[user]
	}
	if create {
		return via.Create(suiteCtx, u)
	}
	return via.Update(suiteCtx, u)
}

func mergeMap(m, add map[string]string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	for k, v := range add {
		m[k] = v
	}
	return m
}

// denied matches an admission denial by the acceptance webhook whose message
// starts with code and whose status details carry code as data, as the real
// API server passes them to the client.
func denied(code fence.Verdict) OmegaMatcher {
	return And(MatchError(ContainSubstring("denied the request: "+string(code)+":")),
		WithTransform(func(err error) string {
			var api apierrors.APIStatus
			if !errors.As(err, &api) || api.Status().Details == nil {
				return "no status details"
			}
			for _, c := range api.Status().Details.Causes {
				if c.Type == fence.CauseVerdict {
					return c.Message
				}
			}
			return "no verdict cause"
		}, Equal(string(code))))
}

// invalidAt matches a 422 from a registry validator whose field error is at
// path and says text: what kubectl shows, and what a client can act on.
func invalidAt(path, text string) OmegaMatcher {
	return And(WithTransform(apierrors.IsInvalid, BeTrue()), MatchError(ContainSubstring(text)),
		WithTransform(func(err error) []string {
			var api apierrors.APIStatus
			if !errors.As(err, &api) || api.Status().Details == nil {
				return nil
			}
			var fields []string
			for _, c := range api.Status().Details.Causes {
				fields = append(fields, c.Field)
			}
			return fields
		}, ContainElement(path)))
}

// deniedWith runs a write that must be denied with code, and checks that
// nothing about the stored object changed.
func (t target) deniedWith(code fence.Verdict, write func() error) {
	GinkgoHelper()
	before := t.get()
	Expect(write()).To(denied(code))
	after := t.get()
	if before == nil {
		Expect(after).To(BeNil())
		return
	}
	Expect(after.GetResourceVersion()).To(Equal(before.GetResourceVersion()), "a %s denial changed the object", code)
}

func held(ns, resource, owner, requestID string) *locksv1.LockGrant {
	return waitPhase(request(ns, resource, owner, requestID), locksv1.PhaseHeld)
}

var _ = Describe("the acceptance webhook", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	for _, kind := range protectedKinds {
		Context("for a "+kind.name, func() {
			It("rejects the stale owner of the seed story and keeps the new owner's data", func() {
				t := newTarget(kind, ns, "invoice", locksv1.EnforcementEnforce)
				a := held(ns, "invoice", "worker-a", "a")
				Expect(t.write(a, 1, "A: first half")).To(Succeed())
				b := request(ns, "invoice", "worker-b", "b")
				waitPhase(b, locksv1.PhasePending)

				// A pauses past its 10 s lease; the issuer's clock decides.
				primary.step(11 * time.Second)
				waitPhase(a, locksv1.PhaseExpired)
				heldB := waitPhase(b, locksv1.PhaseHeld)
				Expect(heldB.Status.Grant.FenceToken).To(Equal(getGrant(ns, a.Name).Status.Grant.FenceToken + 1))
				Expect(t.write(heldB, 1, "B: the whole batch")).To(Succeed())

				// A wakes up, still believing it holds the lock, and writes its next segment.
				t.deniedWith(fence.StaleOwner, func() error { return t.write(a, 2, "A: second half") })
				Expect(t.content()).To(Equal("B: the whole batch"))
				Eventually(func() int64 { return getFR(ns, "invoice").Status.HighestObservedFence }).Should(Equal(heldB.Status.Grant.FenceToken))
				Eventually(func() []string { return deniedVerdicts(ns, "invoice") }).Should(ContainElement(string(fence.StaleOwner)))
			})

			It("reaches every verdict through the API server and never changes the object on a denial", func() {
				t := newTarget(kind, ns, "batch", locksv1.EnforcementEnforce)
				other := newTarget(kind, ns, "other", locksv1.EnforcementEnforce)
				a := held(ns, "batch", "worker-a", "a")
				foreign := held(ns, "other", "worker-a", "f")
				Expect(t.write(a, 1, "v1")).To(Succeed())
				Expect(other.write(foreign, 1, "o1")).To(Succeed())

				t.deniedWith(fence.FenceRequired, func() error {
					u := t.get()
					t.kind.setContent(u, "unfenced")
					return workers["worker-a"].Update(suiteCtx, u)
				})
				bad := "{"
				t.deniedWith(fence.BadGrant, func() error { return t.write(a, 2, "v2", writeOpts{raw: &bad}) })
				huge := `{"grant":` + strings.Repeat(" ", fence.MaxFenceAnnotationBytes) + `}`
				t.deniedWith(fence.BadGrant, func() error { return t.write(a, 2, "v2", writeOpts{raw: &huge}) })
				t.deniedWith(fence.ForgedGrant, func() error {
					return t.write(a, 2, "v2", writeOpts{envelope: func(e *fence.Envelope) { e.Grant.FenceToken += 1000 }})
				})
				t.deniedWith(fence.WrongResource, func() error { return t.write(foreign, 2, "v2") })
				t.deniedWith(fence.WrongOwner, func() error { return t.write(a, 2, "v2", writeOpts{user: "worker-b"}) })
				t.deniedWith(fence.PayloadMismatch, func() error {
					return t.write(a, 2, "v2", writeOpts{object: func(u *unstructured.Unstructured) { t.kind.setContent(u, "something else") }})
				})
				t.deniedWith(fence.SegmentOutOfOrder, func() error { return t.write(a, 3, "v3") })
				t.deniedWith(fence.ReceiptLogMismatch, func() error {
					return t.write(a, 2, "v2", writeOpts{object: func(u *unstructured.Unstructured) {
						ann := u.GetAnnotations()
						ann[fence.AnnotationReceipts] = "[]"
						u.SetAnnotations(ann)
					}})
				})
				Expect(t.write(a, 2, "v2")).To(Succeed())
				// A delayed duplicate of segment 1: applied already, with its original receipt.
				receipts, err := fence.ParseReceipts(t.get().GetAnnotations()[fence.AnnotationReceipts])
				Expect(err).NotTo(HaveOccurred())
				t.deniedWith(fence.AlreadyApplied, func() error {
					err := t.write(a, 1, "v1")
					Expect(err).To(MatchError(ContainSubstring(receipts[0].Receipt)))
					return err
				})
				// Segment 2 again with other content: quarantined and recorded.
				t.deniedWith(fence.Quarantined, func() error { return t.write(a, 2, "tampered") })
				Eventually(func() []locksv1.QuarantineRecord { return getFR(ns, "batch").Status.Quarantine }).Should(ContainElement(
					And(HaveField("User", "worker-a"), HaveField("Segment", int64(2)), HaveField("AcceptedPayload", receipts[1].Payload))))

				// The holder's grant under a changed policy, before the issuer reacts.
				primary.stop()
				Expect(update(admin, &locksv1.FencedResource{ObjectMeta: getFR(ns, "batch").ObjectMeta}, func(fr *locksv1.FencedResource) {
					fr.Spec.OperationCategories = []string{""}
				})).To(Succeed())
				t.deniedWith(fence.PolicyStale, func() error { return t.write(a, 3, "v3") })
				primary = startOperator("primary-after-policy", issuerClock, controllers.Options{})
				waitPhase(a, locksv1.PhaseRevoked)
				t.deniedWith(fence.NotHeld, func() error { return t.write(a, 3, "v3") })

				b := held(ns, "batch", "worker-b", "b")
				Expect(t.write(b, 1, "b1")).To(Succeed())
				t.deniedWith(fence.StaleOwner, func() error { return t.write(a, 3, "v3") })

				setRevokedBelow(primary.issuer.Epoch() + 1)
				t.deniedWith(fence.RevokedEpoch, func() error { return t.write(b, 2, "b2") })
				setRevokedBelow(0)
				Expect(t.content()).To(Equal("b1"))
			})

			It("fences DELETE and the removal of the protection label", func() {
				t := newTarget(kind, ns, "batch", locksv1.EnforcementEnforce)
				a := held(ns, "batch", "worker-a", "a")
				Expect(t.write(a, 1, "v1")).To(Succeed())
				// Removing the label is a change like any other, and never allowed.
				t.deniedWith(fence.ProtectionRemoved, func() error {
					u := t.get()
					u.SetLabels(nil)
					return workers["worker-a"].Update(suiteCtx, u)
				})
				Expect(t.write(a, 2, "v1", writeOpts{object: func(u *unstructured.Unstructured) {
					u.SetLabels(map[string]string{fence.LabelProtected: "true", "team": "billing"})
				}})).To(Succeed())
				// Only the holder deletes, and only after declaring it (delete_test.go).
				t.deniedWith(fence.DeleteNotDeclared, func() error { return workers["worker-b"].Delete(suiteCtx, t.get()) })
				release(a)
				waitPhase(a, locksv1.PhaseReleased)
				t.deniedWith(fence.DeleteNotDeclared, func() error { return workers["worker-a"].Delete(suiteCtx, t.get()) })
				b := held(ns, "batch", "worker-b", "b")
				Expect(t.write(b, 1, "v1", writeOpts{envelope: func(e *fence.Envelope) { e.Intent = fence.IntentDelete }})).To(Succeed())
				Expect(workers["worker-b"].Delete(suiteCtx, t.get())).To(Succeed())
				Expect(t.get()).To(BeNil())
			})

			It("only warns in Shadow mode", func() {
				t := newTarget(kind, ns, "batch", locksv1.EnforcementShadow)
				warnings := &warningCollector{}
				c := warningClient("worker-a", warnings)
				u := &unstructured.Unstructured{}
				u.SetGroupVersionKind(t.kind.gvk)
				u.SetNamespace(ns)
				u.SetName("batch")
				u.SetLabels(map[string]string{fence.LabelProtected: "true"})
				u.SetAnnotations(map[string]string{fence.AnnotationResource: "batch"})
				t.kind.setContent(u, "unfenced")
				Expect(c.Create(suiteCtx, u)).To(Succeed())
				Expect(warnings.all()).To(ContainElement(HavePrefix("fencekeeper: would deny: FENCE_REQUIRED:")))
				Expect(t.content()).To(Equal("unfenced"))
			})
		})
	}

	It("binds an object to its own registry entry: no borrowing a Shadow entry, no rebinding", func() {
		kind := protectedKinds[0]
		t := newTarget(kind, ns, "batch", locksv1.EnforcementEnforce)
		newTarget(kind, ns, "scratch", locksv1.EnforcementShadow)
		a := held(ns, "batch", "worker-a", "a")
		Expect(t.write(a, 1, "v1")).To(Succeed())
		// A new object that points at a Shadow entry whose target is another
		// object is nobody's target (the registry decides, not the
		// annotation), and fence state is only ever written to a target.
		impostor := target{kind: kind, ns: ns, name: "impostor"}
		s := held(ns, "scratch", "worker-b", "s")
		impostor.deniedWith(fence.WrongResource, func() error {
			return impostor.write(s, 1, "x", writeOpts{object: func(u *unstructured.Unstructured) {
				u.SetAnnotations(map[string]string{fence.AnnotationResource: "scratch"})
				ann := u.GetAnnotations()
				_, _ = fence.Stamp(ann, mustEnvelope(s, u))
				u.SetAnnotations(ann)
			}})
		})
		// Without fence state it is an ordinary object.
		Expect(workers["worker-b"].Create(suiteCtx, impostor.unfenced("x", map[string]string{fence.LabelProtected: "true"},
			map[string]string{fence.AnnotationResource: "scratch"}))).To(Succeed())
		Consistently(func() int64 { return getFR(ns, "scratch").Status.HighestObservedFence }, "500ms").Should(BeZero())
		// The holder cannot move the object to another entry.
		t.deniedWith(fence.ProtectionRemoved, func() error {
			return t.write(a, 2, "v2", writeOpts{object: func(u *unstructured.Unstructured) {
				ann := u.GetAnnotations()
				ann[fence.AnnotationResource] = "scratch"
				u.SetAnnotations(ann)
			}})
		})
		// And a second registry entry for the same object is refused.
		dup := &locksv1.FencedResource{}
		dup.Namespace, dup.Name = ns, "batch-twin"
		dup.Spec = locksv1.FencedResourceSpec{ResourceID: "x", LeaseDurationSeconds: 10,
			Target: &locksv1.ObjectTarget{APIVersion: "v1", Kind: "ConfigMap", Name: "batch"}, FenceFloor: 5}
		Expect(admin.Create(suiteCtx, dup)).To(invalidAt("spec.target", "already protected by FencedResource batch"))
	})

	It("ratchets Enforce: no way back to Shadow, no deleting the entry while its target exists", func() {
		kind := protectedKinds[0]
		t := newTarget(kind, ns, "batch", locksv1.EnforcementShadow)
		Expect(update(admin, &locksv1.FencedResource{ObjectMeta: getFR(ns, "batch").ObjectMeta}, func(fr *locksv1.FencedResource) {
			fr.Spec.Enforcement = locksv1.EnforcementEnforce
		})).To(Succeed())
		Expect(update(admin, &locksv1.FencedResource{ObjectMeta: getFR(ns, "batch").ObjectMeta}, func(fr *locksv1.FencedResource) {
			fr.Spec.Enforcement = locksv1.EnforcementShadow
		})).To(invalidAt("spec.enforcement", "Shadow to Enforce only"))
		a := held(ns, "batch", "worker-a", "a")
		Expect(t.write(a, 1, "v1")).To(Succeed())
		Expect(admin.Delete(suiteCtx, getFR(ns, "batch"))).To(And(WithTransform(apierrors.IsForbidden, BeTrue()), MatchError(ContainSubstring("which still exists"))))
		// Re-creating a registry entry must start above the fences the target accepted.
		t2 := newTarget(kind, ns, "twin", locksv1.EnforcementShadow)
		b := held(ns, "twin", "worker-b", "b")
		Expect(t2.write(b, 1, "t1")).To(Succeed())
		Expect(admin.Delete(suiteCtx, getFR(ns, "twin"))).To(Succeed())
		again := &locksv1.FencedResource{}
		again.Namespace, again.Name = ns, "twin"
		again.Spec = locksv1.FencedResourceSpec{ResourceID: "test/" + ns + "/twin", LeaseDurationSeconds: 10,
			Target: &locksv1.ObjectTarget{APIVersion: "v1", Kind: "ConfigMap", Name: "twin"}}
		Expect(admin.Create(suiteCtx, again)).To(invalidAt("spec.fenceFloor", "already accepted fence 1: set spec.fenceFloor to at least 1"))
		again.Spec.FenceFloor = 1
		Expect(admin.Create(suiteCtx, again)).To(Succeed())
	})

	It("raises FENCE_REGRESSION when the registry goes backwards and recovers through fenceFloor", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		var last *locksv1.LockGrant
		for i := 0; i < 3; i++ { // fences 1..3 reach the object
			last = held(ns, "batch", "worker-a", fmt.Sprintf("r%d", i))
			Expect(t.write(last, 1, fmt.Sprintf("v%d", i))).To(Succeed())
			release(last)
			waitPhase(last, locksv1.PhaseReleased)
		}
		// highestObservedFence is read off the stored object, so it trails the last write by one.
		Eventually(func() int64 { return getFR(ns, "batch").Status.HighestObservedFence }).Should(Equal(int64(2)))
		// Restore an old snapshot of the registry: fence 2, nothing observed.
		rewindRegistry(ns, "batch", func(status map[string]any) {
			status["fenceToken"] = int64(2)
			status["highestObservedFence"] = int64(0)
			delete(status, "holder")
		})
		Eventually(func() int64 { return getFR(ns, "batch").Status.FenceToken }).Should(Equal(int64(2)))
		c := held(ns, "batch", "worker-c", "c")
		Expect(c.Status.Grant.FenceToken).To(Equal(int64(3)), "the rewound registry reissues fence 3, which the object already accepted")
		t.deniedWith(fence.FenceRegression, func() error { return t.write(c, 1, "c1") })
		Eventually(func() []string { return deniedVerdicts(ns, "batch") }).Should(ContainElement(string(fence.FenceRegression)))
		var fr *locksv1.FencedResource
		Eventually(func() string {
			fr = getFR(ns, "batch")
			if c := findCondition(fr, locksv1.ConditionFenceRegression); c != nil {
				return string(c.Status)
			}
			return ""
		}).Should(Equal("True"))
		Expect(fr.Status.HighestObservedFence).To(Equal(int64(3)), "the regression restores the highest fence seen, never lowers it")
		Expect(t.content()).To(Equal("v2"))

		// Recovery: an operator raises fenceFloor above the highest fence seen.
		Expect(update(admin, &locksv1.FencedResource{ObjectMeta: fr.ObjectMeta}, func(fr *locksv1.FencedResource) { fr.Spec.FenceFloor = 10 })).To(Succeed())
		waitPhase(c, locksv1.PhaseRevoked)
		// The twice-issued fence, no longer current, is bound to another root at the object.
		t.deniedWith(fence.RootMismatch, func() error { return t.write(c, 2, "c2") })
		d := held(ns, "batch", "worker-d", "d")
		Expect(d.Status.Grant.FenceToken).To(Equal(int64(11)))
		Expect(t.write(d, 1, "d1")).To(Succeed())
		Eventually(func() string {
			return string(findCondition(getFR(ns, "batch"), locksv1.ConditionFenceRegression).Status)
		}).Should(Equal("False"))
		Expect(t.content()).To(Equal("d1"))
	})

	It("leaves the newer content when an old and a new owner race, every time", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		const rounds = 15
		for i := 0; i < rounds; i++ {
			old := held(ns, "batch", "worker-a", fmt.Sprintf("old-%d", i))
			Expect(t.write(old, 1, fmt.Sprintf("old %d seg 1", i))).To(Succeed())
			next := request(ns, "batch", "worker-b", fmt.Sprintf("new-%d", i))
			waitPhase(next, locksv1.PhasePending)
			primary.step(11 * time.Second) // the old owner's lease runs out while it is paused
			next = waitPhase(next, locksv1.PhaseHeld)
			var wg sync.WaitGroup
			var oldErr error
			for w := 0; w < 2; w++ {
				wg.Add(1)
				go func() {
					defer GinkgoRecover()
					defer wg.Done()
					for { // each writer retries optimistic-concurrency conflicts, as a real one would
						var err error
						if w == 0 {
							err = t.write(old, 2, fmt.Sprintf("old %d seg 2", i))
						} else {
							err = t.write(next, 1, fmt.Sprintf("new %d", i))
						}
						if !apierrors.IsConflict(err) {
							if w == 0 {
								oldErr = err
							} else {
								Expect(err).NotTo(HaveOccurred())
							}
							return
						}
					}
				}()
			}
			wg.Wait()
			Expect(oldErr).To(Or(denied(fence.StaleOwner), denied(fence.NotHeld)))
			Expect(t.content()).To(Equal(fmt.Sprintf("new %d", i)), "round %d", i)
			release(next)
			waitPhase(next, locksv1.PhaseReleased)
		}
	})
})

func findCondition(fr *locksv1.FencedResource, typ string) *metav1.Condition {
	for i := range fr.Status.Conditions {
		if fr.Status.Conditions[i].Type == typ {
			return &fr.Status.Conditions[i]
		}
	}
	return nil
}

// rewindRegistry writes a FencedResource's status straight into etcd, as a
// restored snapshot would: no API validation, no admission, no CAS.
func rewindRegistry(ns, name string, mutate func(status map[string]any)) {
	GinkgoHelper()
	key := fmt.Sprintf("/registry/locks.fencekeeper.dev/fencedresources/%s/%s", ns, name)
	etcd := testEnv.ControlPlane.Etcd.URL.String()
	call := func(path string, body map[string]any) map[string]any {
		b, _ := json.Marshal(body)
		resp, err := http.Post(etcd+path, "application/json", bytes.NewReader(b))
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		Expect(resp.StatusCode).To(Equal(http.StatusOK), string(out))
		var m map[string]any
		Expect(json.Unmarshal(out, &m)).To(Succeed())
		return m
	}
	b64 := base64.StdEncoding.EncodeToString
	got := call("/v3/kv/range", map[string]any{"key": b64([]byte(key))})
	kvs, _ := got["kvs"].([]any)
	Expect(kvs).To(HaveLen(1), "no etcd key %s", key)
	raw, err := base64.StdEncoding.DecodeString(kvs[0].(map[string]any)["value"].(string))
	Expect(err).NotTo(HaveOccurred())
	var obj map[string]any
	Expect(json.Unmarshal(raw, &obj)).To(Succeed())
	status, _ := obj["status"].(map[string]any)
	mutate(status)
	raw, _ = json.Marshal(obj)
	call("/v3/kv/put", map[string]any{"key": b64([]byte(key)), "value": b64(raw)})
}

// mustEnvelope builds the envelope of segment 1 for u's current content.
func mustEnvelope(lg *locksv1.LockGrant, u *unstructured.Unstructured) fence.Envelope {
	lg = getGrant(lg.Namespace, lg.Name)
	payload, err := fence.PayloadDigest(fence.ObjectPayload(u.Object))
	Expect(err).NotTo(HaveOccurred())
	return fence.Envelope{Grant: lg.Status.Grant.ToGrant(), Proof: lg.Status.Proof, Operation: "op", Segment: 1, Payload: payload}
}

// warningCollector records the admission warnings a client receives.
type warningCollector struct {
	mu       sync.Mutex
	warnings []string
}

func (w *warningCollector) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.warnings = append(w.warnings, text)
}

func (w *warningCollector) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.warnings...)
}

func warningClient(user string, w *warningCollector) client.Client {
	cfg := rest.CopyConfig(testEnvUserConfig(user))
	cfg.WarningHandler = w
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

var _ = Describe("self-managed webhook certificates", func() {
	It("patch the caBundle of every webhook in the configuration", func() {
		cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		cfg.Name = "fencekeeper-cabundle-test"
		none := admissionregistrationv1.SideEffectClassNone
		url := "https://127.0.0.1:1/never-called"
		for _, name := range []string{"a.fencekeeper.dev", "b.fencekeeper.dev"} {
			cfg.Webhooks = append(cfg.Webhooks, admissionregistrationv1.ValidatingWebhook{
				Name: name, SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
				ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url},
			})
		}
		Expect(admin.Create(suiteCtx, cfg)).To(Succeed())
		DeferCleanup(func() { _ = admin.Delete(suiteCtx, cfg) })
		b, err := certs.Generate([]string{"127.0.0.1"}, time.Hour)
		Expect(err).NotTo(HaveOccurred())
		ctx, cancel := context.WithTimeout(suiteCtx, 10*time.Second)
		defer cancel()
		Expect((&webhooks.CABundlePatcher{Client: admin, Name: cfg.Name, CABundle: b.CACert}).Start(ctx)).To(Succeed())
		Expect(admin.Get(suiteCtx, client.ObjectKeyFromObject(cfg), cfg)).To(Succeed())
		for _, w := range cfg.Webhooks {
			Expect(w.ClientConfig.CABundle).To(Equal(b.CACert), w.Name)
		}
	})
})
