package envtest

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
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

func namespaceLabels(name string) map[string]string {
	GinkgoHelper()
	var ns corev1.Namespace
	Expect(admin.Get(suiteCtx, client.ObjectKey{Name: name}, &ns)).To(Succeed())
	return ns.Labels
}
