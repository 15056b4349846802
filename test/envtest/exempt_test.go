package envtest

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	fkoperator "github.com/fencekeeper/fencekeeper/internal/operator"
	"github.com/fencekeeper/fencekeeper/internal/rules/enrollment"
)

var _ = Describe("exempt namespaces", func() {
	It("refuses a FencedResource in kube-system, kube-public and the operator's namespace, and enrolls none of them", func() {
		for _, ns := range []string{metav1.NamespaceSystem, metav1.NamespacePublic, opNamespace} {
			fr := &locksv1.FencedResource{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "control-plane-config"},
				Spec: locksv1.FencedResourceSpec{ResourceID: "x/" + ns, LeaseDurationSeconds: 10,
					Target: &locksv1.ObjectTarget{APIVersion: "v1", Kind: "ConfigMap", Name: "some-config"}},
			}
			err := admin.Create(suiteCtx, fr)
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "creating a FencedResource in %s: %v", ns, err)
			Expect(err.Error()).To(And(ContainSubstring("namespace "+ns+" is exempt from fencing"), ContainSubstring("application namespace")))
			var got corev1.Namespace
			Expect(admin.Get(suiteCtx, client.ObjectKey{Name: ns}, &got)).To(Succeed())
			Expect(got.Labels).NotTo(HaveKey(locksv1.LabelEnrolledNamespace), "namespace %s was enrolled", ns)
		}
	})

	It("keeps the acceptance webhook away from the exempt namespaces by namespaceSelector", func() {
		cfg := webhookConfiguration()
		for _, name := range []string{localcp.ProtectedWebhook, localcp.EnrolledWebhook} {
			var w *admissionregistrationv1.ValidatingWebhook
			for i := range cfg.Webhooks {
				if cfg.Webhooks[i].Name == name {
					w = &cfg.Webhooks[i]
				}
			}
			Expect(w).NotTo(BeNil(), "no webhook %s", name)
			Expect(w.NamespaceSelector.MatchExpressions).To(ContainElement(metav1.LabelSelectorRequirement{
				Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn,
				Values: []string{opNamespace, metav1.NamespacePublic, metav1.NamespaceSystem}}), "webhook %s", name)
		}
	})

	It("takes the label off a namespace that was enrolled and became exempt, and says its entries protect nothing there", func() {
		ns := newNamespace()
		newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementShadow)
		Eventually(func() map[string]string { return namespaceLabels(ns) }).Should(HaveKeyWithValue(locksv1.LabelEnrolledNamespace, "true"))

		// The operator restarts with ns in --exempt-namespaces.
		primary.stop()
		exempting := startOperator("exempting", issuerClock, controllers.Options{Exempt: enrollment.NewExemptions(opNamespace, []string{ns})})
		defer exempting.stop()
		Eventually(func() map[string]string { return namespaceLabels(ns) }).ShouldNot(HaveKey(locksv1.LabelEnrolledNamespace))
		Eventually(func() []string { return eventsOf(metav1.NamespaceDefault, ns, locksv1.EventReasonNamespaceExempt) }).Should(ContainElement(
			And(ContainSubstring("namespace "+ns+" is exempt from fencing"), ContainSubstring("its 1 FencedResources protect nothing here any more"))))

		// Labelled by hand, it loses the label again.
		Expect(update(admin, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, func(n *corev1.Namespace) {
			n.Labels[locksv1.LabelEnrolledNamespace] = "true"
		})).To(Succeed())
		Eventually(func() map[string]string { return namespaceLabels(ns) }).ShouldNot(HaveKey(locksv1.LabelEnrolledNamespace))
		// The AfterEach restarts the primary, which does not exempt ns.
	})
})

var _ = Describe("the webhook shape on rollout", Ordered, func() {
	var saved *admissionregistrationv1.ValidatingWebhookConfiguration
	BeforeAll(func() { saved = webhookConfiguration() })
	AfterAll(func() {
		// The guards installed the trust-anchor policy; the specs after
		// reset revokedBelowEpoch as cluster-admin, which it forbids.
		removeTrustAnchorPolicy(admin)
		// Back to the configuration the suite installed, for the specs after.
		Expect(update(admin, &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: saved.Name}},
			func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
				c.Webhooks, c.Annotations = saved.Webhooks, saved.Annotations
			})).To(Succeed())
	})

	It("is taken over by the newer operator, and the older one does not write its shape back", func() {
		// The old operator's shape: generation 1, a 7 s timeout on the
		// protected entries and no exemption but its namespace.
		oldShape := func(context.Context) ([]admissionregistrationv1.ValidatingWebhook, error) {
			hooks := saved.DeepCopy().Webhooks
			for i := range hooks {
				if hooks[i].Name == localcp.ProtectedWebhook || hooks[i].Name == localcp.EnrolledWebhook {
					hooks[i].TimeoutSeconds = ptrTo(int32(7))
					hooks[i] = fkoperator.WithExemptions(hooks[i:i+1], []string{opNamespace})[0]
				}
			}
			return hooks, nil
		}
		stopOld := startShapeGuard(1, oldShape)
		defer stopOld()
		Eventually(func() string { return shapeOf(webhookConfiguration()) }).Should(Equal("generation 1, timeout 7, exempt [" + opNamespace + "]"))

		stopNew := startShapeGuard(2, nil)
		want := "generation 2, timeout 5, exempt [" + opNamespace + " kube-public kube-system]"
		Eventually(func() string { return shapeOf(webhookConfiguration()) }).Should(Equal(want))
		Eventually(func() []string {
			return eventsOf(metav1.NamespaceDefault, locksv1.WebhookConfigurationName, locksv1.EventReasonWebhookConfigurationAdopted)
		}).Should(ContainElement(ContainSubstring("webhook shape generation 2 (was 1)")))

		// The new operator goes (its replica moves); the old one still runs
		// and sees the configuration change: it leaves the newer shape alone.
		stopNew()
		Expect(update(admin, &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: locksv1.WebhookConfigurationName}},
			func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
				c.Labels = map[string]string{"poke": "1"}
			})).To(Succeed())
		Eventually(func() []string {
			return eventsOf(metav1.NamespaceDefault, locksv1.WebhookConfigurationName, locksv1.EventReasonWebhookConfigurationDrift)
		}).Should(ContainElement(ContainSubstring("names webhook shape generation 2, newer than this operator's 1: left as it is")))
		Consistently(func() string { return shapeOf(webhookConfiguration()) }, 3*time.Second, 200*time.Millisecond).Should(Equal(want))
	})
})

// startShapeGuard runs an admission guard of shape generation gen as the
// operator user; desired nil keeps this version's own shape.
func startShapeGuard(gen int, desired func(context.Context) ([]admissionregistrationv1.ValidatingWebhook, error)) func() {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(opCfg, ctrl.Options{Scheme: scheme, Cache: controllers.CacheOptions(opNamespace, nil), Metrics: metricsserver.Options{BindAddress: "0"}})
	Expect(err).NotTo(HaveOccurred())
	o := fkoperator.GuardOptions{
		Namespace: opNamespace, WebhookConfiguration: locksv1.WebhookConfigurationName, ProtectedKinds: suiteKinds,
		CertManagerUsername: certManagerUser, ShapeGeneration: gen, DesiredWebhooks: desired,
	}
	if desired == nil { // the operator of this version, as operator.Run sets it up
		o.ExemptNamespaces = enrollment.NewExemptions(opNamespace, nil).Names()
	}
	Expect(fkoperator.SetupAdmissionGuard(mgr, o)).To(Succeed())
	ctx, cancel := context.WithCancel(suiteCtx)
	var done sync.WaitGroup
	done.Add(1)
	go func() {
		defer GinkgoRecover()
		defer done.Done()
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
	return func() { cancel(); done.Wait() }
}

// shapeOf summarizes what the specs above change: the generation
// annotation, the protected entry's timeout and its exempt namespaces.
func shapeOf(cfg *admissionregistrationv1.ValidatingWebhookConfiguration) string {
	w := protectedHook(cfg)
	var exempt []string
	for _, e := range w.NamespaceSelector.MatchExpressions {
		if e.Key == corev1.LabelMetadataName {
			exempt = e.Values
		}
	}
	timeout := int32(0)
	if w.TimeoutSeconds != nil {
		timeout = *w.TimeoutSeconds
	}
	return "generation " + cfg.Annotations[locksv1.AnnotationWebhookShapeGeneration] + ", timeout " + strconv.Itoa(int(timeout)) + ", exempt [" + strings.Join(exempt, " ") + "]"
}

func namespaceLabels(name string) map[string]string {
	GinkgoHelper()
	var ns corev1.Namespace
	Expect(admin.Get(suiteCtx, client.ObjectKey{Name: name}, &ns)).To(Succeed())
	return ns.Labels
}

func ptrTo[T any](v T) *T { return &v }
