package envtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// holdPath serves holdPoint on the suite's webhook server.
const holdPath = "/test-hold"

// holds is a second validating webhook for ConfigMaps that a spec arms to
// hold one request after fencekeeper's webhook admitted it and before the API
// server commits it: a write in flight at the server, as when etcd is slow or
// cut off, which commits whenever it is let go (its etcd transaction still
// conditioned on the version it was sent with).
var holds = &holdPoint{}

type holdPoint struct {
	mu    sync.Mutex
	armed *hold
	calls map[string]int // requests seen, by namespace
}

type hold struct {
	op       admissionv1.Operation
	ns, name string
	// decided is how many requests of op fencekeeper's webhook had decided
	// when the hold was armed: the held request waits for its own decision first (the
	// API server calls validating webhooks in parallel).
	decided float64
	// onHold runs once the request is admitted and held.
	onHold   func()
	held     chan struct{} // closed after onHold
	released chan struct{}
}

// arm holds the next request op on ns/name.
func (h *holdPoint) arm(op admissionv1.Operation, ns, name string, onHold func()) *hold {
	a := &hold{op: op, ns: ns, name: name, decided: admissionDecisions(op), onHold: onHold, held: make(chan struct{}), released: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed = a
	return a
}

func (a *hold) release() { close(a.released) }

func (h *holdPoint) Handle(ctx context.Context, req admission.Request) admission.Response {
	h.mu.Lock()
	if h.calls == nil {
		h.calls = map[string]int{}
	}
	h.calls[req.Namespace]++
	a := h.armed
	if a == nil || req.Operation != a.op || req.Namespace != a.ns || req.Name != a.name {
		h.mu.Unlock()
		return admission.Allowed("")
	}
	h.armed = nil
	h.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for admissionDecisions(a.op) <= a.decided && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if a.onHold != nil {
		a.onHold()
	}
	close(a.held)
	select {
	case <-a.released:
	case <-ctx.Done():
	case <-time.After(20 * time.Second):
	}
	return admission.Allowed("")
}

// admissionDecisions is how many requests of operation op fencekeeper's
// acceptance webhook decided so far.
func admissionDecisions(op admissionv1.Operation) float64 {
	families, err := metrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != "fencekeeper_admission_duration_seconds" {
			continue
		}
		for _, m := range f.Metric {
			for _, l := range m.GetLabel() {
				if l.GetName() == "operation" && l.GetValue() == string(op) {
					return float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	return 0
}

// installHold routes ns's ConfigMap writes and deletes through holds.
func installHold(ns string) {
	GinkgoHelper()
	o := testEnv.WebhookInstallOptions
	url := fmt.Sprintf("https://%s:%d%s", o.LocalServingHost, o.LocalServingPort, holdPath)
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "test-hold-" + ns},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "hold.test.fencekeeper.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: o.LocalServingCAData},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"CREATE", "UPDATE", "DELETE"}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](30),
		}},
	}
	Expect(admin.Create(suiteCtx, cfg)).To(Succeed())
	DeferCleanup(func() { Expect(admin.Delete(context.Background(), cfg)).To(Succeed()) })
	// The API server learns of the configuration through its informer.
	probes := 0
	Eventually(func() int {
		probes++
		Expect(admin.Create(suiteCtx, configMapNamed(ns, fmt.Sprintf("hold-probe-%d", probes)))).To(Succeed())
		holds.mu.Lock()
		defer holds.mu.Unlock()
		return holds.calls[ns]
	}).Should(BeNumerically(">", 0), "the API server does not call the hold webhook yet")
}

// Found by make chaos: a segment whose first send got no answer
// was read back as absent and sent again; the grant had ended by then, the
// second send was refused, and the client reported the refusal, which by
// its contract means nothing was written. Then the first send, admitted
// while the grant was current and conditioned on the version the client
// had read, committed. A read that does not show a write proves nothing
// while it may still land.
var _ = Describe("a write in flight at the API server", func() {
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
		installHold(ns)
	})

	type setup struct {
		c    *lockclient.Client
		f    *faults
		l    *lockclient.Lock
		op   *lockclient.Operation
		cm   *corev1.ConfigMap
		tgt  target
		ends func() // the grant's end, on the issuer's clock
	}
	start := func() setup {
		GinkgoHelper()
		tgt := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce, func(fr *locksv1.FencedResource) { fr.Spec.LeaseDurationSeconds = 60 })
		c, f := faultyWorker(ns, "worker-a")
		l := mustAcquire(c, "batch", "job-1")
		return setup{c: c, f: f, l: l, op: l.Operation("settle-2026-07-19"), cm: configMapNamed(ns, "batch"), tgt: tgt,
			ends: func() { primary.step(61 * time.Second) }}
	}
	// stall holds the next request op on the object after fencekeeper
	// admitted it, ends the grant on the issuer's clock, and leaves the
	// client without an answer while the request stays at the server.
	stall := func(s setup, op admissionv1.Operation, method, path string) *hold {
		h := holds.arm(op, ns, "batch", s.ends)
		s.f.add(&fault{method: method, path: path, abandon: h.held, times: 1})
		return h
	}
	notRefused := func(err error) {
		GinkgoHelper()
		Expect(err).To(MatchError(lockclient.ErrMutationUnknown), "a refusal would say nothing was written")
		_, denied := lockclient.AsDenial(err)
		Expect(denied).To(BeFalse())
		Expect(err).NotTo(MatchError(lockclient.ErrExpired))
	}

	It("reports an update MUTATION_UNKNOWN, not refused, while its first send may still land", func() {
		s := start()
		_, err := s.op.Commit(suiteCtx, s.cm, setData(s.cm, "part 1"))
		Expect(err).NotTo(HaveOccurred())
		h := stall(s, admissionv1.Update, http.MethodPut, "/configmaps/")
		_, err = s.op.Commit(suiteCtx, s.cm, setData(s.cm, "part 2"))
		notRefused(err)
		Expect(getGrant(ns, s.l.Name()).Annotations).To(HaveKey(locksv1.AnnotationUnresolvedMutation))
		var unknown *lockclient.UnknownOutcomeError
		Expect(errors.As(err, &unknown)).To(BeTrue())
		resolve := func() lockclient.Resolution {
			out, _, err := s.op.Resolve(suiteCtx, configMapNamed(ns, "batch"), unknown.Sent)
			Expect(err).NotTo(HaveOccurred())
			return out
		}
		Expect(resolve()).To(Equal(lockclient.InFlight), "held at the server: not landed, and it still may")
		h.release()
		Eventually(s.tgt.content).Should(Equal("part 2"), "the first send commits: the client must not have called it refused")
		Expect(resolve()).To(Equal(lockclient.Applied))
	})

	It("reports a create MUTATION_UNKNOWN, not refused, while its first send may still land", func() {
		s := start()
		h := stall(s, admissionv1.Create, http.MethodPost, "/configmaps")
		_, err := s.op.Commit(suiteCtx, s.cm, setData(s.cm, "part 1"))
		notRefused(err)
		h.release()
		Eventually(func() string {
			if u := s.tgt.get(); u != nil {
				return s.tgt.kind.getContent(u)
			}
			return "(absent)"
		}).Should(Equal("part 1"), "the first send creates the object")
	})

	It("reports a delete MUTATION_UNKNOWN, not refused, while its first send may still land", func() {
		s := start()
		_, err := s.op.Commit(suiteCtx, s.cm, setData(s.cm, "part 1"))
		Expect(err).NotTo(HaveOccurred())
		h := stall(s, admissionv1.Delete, http.MethodDelete, "/configmaps/")
		_, err = s.op.Delete(suiteCtx, s.cm)
		notRefused(err)
		h.release()
		Eventually(s.tgt.get).Should(BeNil(), "the first send deletes the object")
	})

	It("reports the refusal once the object moved past the version the lost send was conditioned on", func() {
		s := start()
		_, err := s.op.Commit(suiteCtx, s.cm, setData(s.cm, "part 1"))
		Expect(err).NotTo(HaveOccurred())
		// The first send of segment 2 is held; before the client reads, a
		// newer holder's segment lands (the object moves on), so the held
		// send can never commit: the refusal the client meets is the truth.
		var next *lockclient.Lock
		h := holds.arm(admissionv1.Update, ns, "batch", func() {
			defer GinkgoRecover()
			s.ends()
			b, err := lockclient.NewForConfig(suiteCtx, testEnvUserConfig("worker-b"), ns)
			Expect(err).NotTo(HaveOccurred())
			ctx, cancel := context.WithTimeout(suiteCtx, 20*time.Second)
			defer cancel()
			next, err = b.Acquire(ctx, "batch", lockclient.AcquireOptions{RequestID: "job-2"})
			Expect(err).NotTo(HaveOccurred())
			cm := configMapNamed(ns, "batch")
			_, err = next.Operation("next").Commit(ctx, cm, setData(cm, "by worker-b"))
			Expect(err).NotTo(HaveOccurred())
		})
		s.f.add(&fault{method: http.MethodPut, path: "/configmaps/", abandon: h.held, times: 1})
		_, err = s.op.Commit(suiteCtx, s.cm, setData(s.cm, "part 2"))
		h.release()
		Expect(err).To(Or(MatchError(lockclient.ErrExpired), MatchError(lockclient.ErrStaleOwner), MatchError(lockclient.ErrNotHeld)))
		Expect(err).NotTo(MatchError(lockclient.ErrMutationUnknown))
		Expect(next).NotTo(BeNil())
		next.Orphan()
		Consistently(s.tgt.content, 2*time.Second).Should(Equal("by worker-b"))
	})
})
