package envtest

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// declareDelete makes a write commit the delete intent.
var declareDelete = writeOpts{envelope: func(e *fence.Envelope) { e.Intent = fence.IntentDelete }}

var _ = Describe("DELETE of a protected object", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	deleteAs := func(user string, t target) func() error {
		return func() error { return workers[user].Delete(suiteCtx, t.get()) }
	}
	acquire := func(c *lockclient.Client, requestID string) *lockclient.Lock {
		GinkgoHelper()
		ctx, cancel := context.WithTimeout(suiteCtx, 20*time.Second)
		defer cancel()
		l, err := c.Acquire(ctx, "batch", lockclient.AcquireOptions{RequestID: requestID})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(l.Orphan)
		return l
	}

	It("denies a delete by the holder's identity that no fenced segment declared", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		a := held(ns, "batch", "worker-a", "a")
		Expect(t.write(a, 1, "v1")).To(Succeed())
		// A stale process of the same workload (same identity, no knowledge of
		// the operation) deletes: the grant is current and it is the owner, but
		// nothing it committed declared the delete.
		t.deniedWith(fence.DeleteNotDeclared, deleteAs("worker-a", t))
		Expect(t.content()).To(Equal("v1"))
		// Another user is refused even after the holder declared the delete.
		Expect(t.write(a, 2, "v1", declareDelete)).To(Succeed())
		t.deniedWith(fence.DeleteNotDeclared, deleteAs("worker-b", t))
		Expect(deleteAs("worker-a", t)()).To(Succeed())
		Expect(t.get()).To(BeNil())
	})

	It("honours an intent only under the grant that declared it", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		a := held(ns, "batch", "worker-a", "a")
		Expect(t.write(a, 1, "v1")).To(Succeed())
		Expect(t.write(a, 2, "v1", declareDelete)).To(Succeed())
		stored, err := fence.ParseEnvelope(t.get().GetAnnotations()[fence.AnnotationFence])
		Expect(err).NotTo(HaveOccurred())
		Expect(stored.Intent).To(Equal(fence.IntentDelete), "the stored segment declares the delete")

		// The lock is handed on: the same identity under a new grant (fence 2),
		// then another worker (fence 3). Neither may use fence 1's intent.
		release(a)
		waitPhase(a, locksv1.PhaseReleased)
		a2 := held(ns, "batch", "worker-a", "a2")
		Expect(a2.Status.Grant.FenceToken).To(BeEquivalentTo(2))
		t.deniedWith(fence.DeleteNotDeclared, deleteAs("worker-a", t))
		release(a2)
		waitPhase(a2, locksv1.PhaseReleased)
		b := held(ns, "batch", "worker-b", "b")
		t.deniedWith(fence.DeleteNotDeclared, deleteAs("worker-a", t))
		t.deniedWith(fence.DeleteNotDeclared, deleteAs("worker-b", t))

		// An intent declared by a grant that then expires does not count either.
		Expect(t.write(b, 1, "v1", declareDelete)).To(Succeed())
		primary.step(11 * time.Second)
		waitPhase(b, locksv1.PhaseExpired)
		t.deniedWith(fence.DeleteNotDeclared, deleteAs("worker-b", t))
		Expect(t.content()).To(Equal("v1"))
	})

	It("deletes through the client: intent segment, then the delete", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		c, _ := faultyWorker(ns, "worker-a")
		l := acquire(c, "job-1")
		op := l.Operation("retire")
		cm := configMapNamed(ns, "batch")
		_, err := op.Commit(suiteCtx, cm, setData(cm, "final"))
		Expect(err).NotTo(HaveOccurred())
		r, err := op.Delete(suiteCtx, configMapNamed(ns, "batch"))
		Expect(err).NotTo(HaveOccurred())
		Expect([]int64{r.Fence, r.Segment}).To(Equal([]int64{1, 2}))
		Expect(t.get()).To(BeNil())
		// Nothing left to delete.
		_, err = op.Delete(suiteCtx, configMapNamed(ns, "batch"))
		Expect(err).To(MatchError(ContainSubstring("not found")))
	})

	It("lets the holder re-create what it deleted with the next segment, and nobody else", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		c, _ := faultyWorker(ns, "worker-a")
		l := acquire(c, "job-1")
		op := l.Operation("rebuild")
		cm := configMapNamed(ns, "batch")
		_, err := op.Commit(suiteCtx, cm, setData(cm, "v1"))
		Expect(err).NotTo(HaveOccurred())
		published := t.get().GetAnnotations()
		_, err = op.Delete(suiteCtx, configMapNamed(ns, "batch"))
		Expect(err).NotTo(HaveOccurred())
		Expect(getFR(ns, "batch").Status.DeletedTarget).To(HaveField("Segment", int64(2)))

		// A stranger re-creates it, unlabelled, with the holder's published
		// envelope and a forged receipt for an operation that never ran.
		forged := `[{"fence":1,"segment":3,"operation":"rebuild-2","payload":"sha256:` + strings.Repeat("cd", 32) +
			`","receipt":"sha256:` + strings.Repeat("ab", 32) + `"}]`
		t.deniedWith(fence.FenceRequired, func() error {
			return workers["worker-b"].Create(suiteCtx, t.unfenced("v1", nil, map[string]string{fence.AnnotationReceipts: forged}))
		})
		t.deniedWith(fence.WrongOwner, func() error {
			return workers["worker-b"].Create(suiteCtx, t.unfenced("v1", nil, map[string]string{
				fence.AnnotationFence: published[fence.AnnotationFence], fence.AnnotationReceipts: forged,
			}))
		})

		// The holder continues: segment 3, no false FENCE_REGRESSION.
		cm = configMapNamed(ns, "batch")
		r, err := l.Operation("rebuild-2").Commit(suiteCtx, cm, setData(cm, "v2"))
		Expect(err).NotTo(HaveOccurred())
		Expect([]int64{r.Fence, r.Segment}).To(Equal([]int64{1, 3}))
		Expect(t.content()).To(Equal("v2"))
	})

	It("resolves a delete whose answer was lost", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		c, f := faultyWorker(ns, "worker-a")
		l := acquire(c, "job-1")
		op := l.Operation("retire")
		cm := configMapNamed(ns, "batch")
		_, err := op.Commit(suiteCtx, cm, setData(cm, "final"))
		Expect(err).NotTo(HaveOccurred())
		f.add(&fault{method: http.MethodDelete, path: "/configmaps/", dropResponse: true, times: 1})
		_, err = op.Delete(suiteCtx, cm)
		Expect(err).NotTo(HaveOccurred())
		Expect(t.get()).To(BeNil())
	})

	It("does not delete what was written after the intent", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		var once sync.Once
		var lock *lockclient.Lock
		cfg := rest.CopyConfig(testEnvUserConfig("worker-a"))
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if req.Method == http.MethodDelete && strings.Contains(req.URL.Path, "/configmaps/") {
					// Between the intent (segment 2) and the delete, the
					// holder's grant writes segment 3.
					once.Do(func() { Expect(t.write(getGrant(ns, lock.Name()), 3, "late", writeOpts{})).To(Succeed()) })
				}
				return rt.RoundTrip(req)
			})
		}
		c, err := lockclient.NewForConfig(suiteCtx, cfg, ns)
		Expect(err).NotTo(HaveOccurred())
		lock = acquire(c, "job-1")
		op := lock.Operation("op-" + lock.Name()) // the operation t.write uses
		cm := configMapNamed(ns, "batch")
		_, err = op.Commit(suiteCtx, cm, setData(cm, "final"))
		Expect(err).NotTo(HaveOccurred())
		_, err = op.Delete(suiteCtx, cm)
		Expect(err).To(MatchError(lockclient.ErrChangedSinceIntent))
		Expect(t.content()).To(Equal("late"))
	})

	It("kubectl fence delete commits the intent and deletes; a stale grant's is refused", func() {
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		a := testEnvUserConfig("worker-a")
		var g struct{ Name string }
		kubectlFence(a, "acquire", "batch", "-n", ns, "--request-id", "a1", "-o", "json").json(&g)
		file := manifestFile("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: batch\ndata:\n  result: done\n")
		Expect(kubectlFence(a, "write", g.Name, "-f", file, "-n", ns).code).To(Equal(0))

		// Under an expired grant the intent segment itself is refused.
		primary.step(11 * time.Second)
		waitPhase(getGrant(ns, g.Name), locksv1.PhaseExpired)
		r := kubectlFence(a, "delete", g.Name, "-n", ns, "--unguarded")
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring("ConfigMap/batch not deleted: NOT_HELD"))
		Expect(t.content()).To(Equal("done"))

		var g2 struct{ Name string }
		kubectlFence(a, "acquire", "batch", "-n", ns, "--request-id", "a2", "-o", "json").json(&g2)
		var res struct {
			Object    string
			Verdict   fence.Verdict
			Fence     int64
			Segment   int64
			Operation string
			Receipt   string
		}
		kubectlFence(a, "delete", g2.Name, "-n", ns, "-o", "json").json(&res)
		Expect(res.Object).To(Equal("ConfigMap/batch"))
		Expect(res.Verdict).To(Equal(fence.Accepted))
		Expect([]int64{res.Fence, res.Segment}).To(Equal([]int64{2, 1}))
		Expect(res.Receipt).To(HavePrefix("sha256:"))
		Expect(t.get()).To(BeNil())
		r = kubectlFence(a, "delete", g2.Name, "-n", ns)
		Expect(r.code).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring("ConfigMap/batch does not exist: nothing to delete"))
	})
})
