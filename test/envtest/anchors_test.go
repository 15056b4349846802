package envtest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	fkoperator "github.com/fencekeeper/fencekeeper/internal/operator"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// The trust anchors (signing key, trust bundle, issuer-epoch record) and the
// webhook configuration are guarded by the operator's admission guard. The
// specs run it as the operator user in a manager of its own and remove the
// policy afterwards: other specs reset revokedBelowEpoch to 0 as cluster-admin
// to leave the suite as they found it, which the guard forbids.
// forbidden matches a 403; on a failure it shows what was returned instead.
var forbidden = WithTransform(func(err error) string {
	if apierrors.IsForbidden(err) {
		return "Forbidden"
	}
	return fmt.Sprintf("%v", err)
}, Equal("Forbidden"))

// notOperator matches the trust-anchor policy's refusal of anyone but the operator.
var notOperator = And(forbidden, MatchError(ContainSubstring("only the fencekeeper operator")))

var _ = Describe("trust anchors and the webhook configuration", Ordered, func() {
	var (
		nsAdmin   client.Client // may edit every ConfigMap and Secret of the operator namespace, but is not the operator
		rotator   client.Client // also holds the break-glass verb on trustanchors
		opClient  client.Client // the operator's identity
		stopGuard func()
		revoked0  string
		installed *admissionregistrationv1.ValidatingWebhookConfiguration
	)
	mayOnlyGrow := func(what string) OmegaMatcher {
		return And(forbidden, MatchError(ContainSubstring(what+" may only grow")))
	}

	BeforeAll(func() {
		nsAdmin = userWithRole("anchor-admin",
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps", "secrets"}, Verbs: []string{"*"}})
		rotator = userWithRole("anchor-rotator",
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"*"}},
			rbacv1.PolicyRule{APIGroups: []string{locksv1.GroupVersion.Group}, Resources: []string{"trustanchors"}, Verbs: []string{"rotate"}})
		var err error
		opClient, err = client.New(opCfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		revoked0 = anchorConfigMap(locksv1.TrustBundleConfigMap).Data[grant.RevokedBelowEpochKey]
		installed = webhookConfiguration()

		stopGuard = startGuard(suiteKinds)
		// The API server compiles a new policy asynchronously.
		Eventually(func() error {
			return setAnchorData(nsAdmin, locksv1.TrustBundleConfigMap, grant.RevokedBelowEpochKey, revoked0, client.DryRunAll)
		}).Should(notOperator)
	})

	AfterAll(func() {
		if stopGuard != nil {
			stopGuard()
		}
		removeTrustAnchorPolicy(nsAdmin)
		Eventually(func() error {
			return setAnchorData(admin, locksv1.TrustBundleConfigMap, grant.RevokedBelowEpochKey, revoked0)
		}).Should(Succeed())
	})

	It("lets the operator take over with a new epoch and create its key, and nobody else", func() {
		epoch0 := anchorEpoch()
		primary.stop()
		primary = startOperator("anchors", primary.clock, controllers.Options{})
		Expect(anchorEpoch()).To(BeNumerically(">", epoch0), "the new leader's epoch bump was not stored")
		Expect(primary.issuer.Epoch()).To(Equal(anchorEpoch()))

		key := func() *corev1.Secret {
			return &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: opNamespace, Name: locksv1.SigningKeySecret},
				Data:       map[string][]byte{"keyID": []byte("attacker"), "ed25519.seed": make([]byte, 32)},
			}
		}
		// Admission runs before the store notices the name is taken: the
		// operator passes admission and meets AlreadyExists, anyone else is stopped before.
		Expect(opClient.Create(suiteCtx, key(), client.DryRunAll)).To(WithTransform(apierrors.IsAlreadyExists, BeTrue()))
		Expect(nsAdmin.Create(suiteCtx, key(), client.DryRunAll)).To(notOperator)
	})

	It("denies anyone but the operator changing or deleting the signing key", func() {
		var sec corev1.Secret
		Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: opNamespace, Name: locksv1.SigningKeySecret}, &sec)).To(Succeed())
		before := sec.ResourceVersion
		Expect(update(nsAdmin, &corev1.Secret{ObjectMeta: objectMeta(opNamespace, locksv1.SigningKeySecret)}, func(s *corev1.Secret) {
			s.Data["ed25519.seed"] = make([]byte, 32)
		})).To(notOperator)
		Expect(update(nsAdmin, &corev1.Secret{ObjectMeta: objectMeta(opNamespace, locksv1.SigningKeySecret)}, func(s *corev1.Secret) {
			s.Labels = map[string]string{"touched": "yes"}
		})).To(notOperator)
		Expect(nsAdmin.Delete(suiteCtx, &corev1.Secret{ObjectMeta: objectMeta(opNamespace, locksv1.SigningKeySecret)})).To(notOperator)
		Expect(nsAdmin.DeleteAllOf(suiteCtx, &corev1.Secret{}, client.InNamespace(opNamespace))).To(notOperator)
		Expect(admin.Get(suiteCtx, client.ObjectKeyFromObject(&sec), &sec)).To(Succeed())
		Expect(sec.ResourceVersion).To(Equal(before))
	})

	It("keeps revokedBelowEpoch growing: only the operator or a break-glass rotation raises it, nobody lowers it", func() {
		cur, err := strconv.ParseInt(anchorConfigMap(locksv1.TrustBundleConfigMap).Data[grant.RevokedBelowEpochKey], 10, 64)
		Expect(err).NotTo(HaveOccurred())
		epoch := primary.issuer.Epoch()
		Expect(cur).To(BeNumerically("<", epoch), "an earlier spec left the issuing epoch revoked")
		raised := strconv.FormatInt(epoch, 10) // revokes older epochs, not the issuing one
		Expect(setAnchorData(nsAdmin, locksv1.TrustBundleConfigMap, grant.RevokedBelowEpochKey, raised)).To(notOperator)
		Expect(setAnchorData(rotator, locksv1.TrustBundleConfigMap, grant.RevokedBelowEpochKey, raised)).To(Succeed())

		lowered := strconv.FormatInt(epoch-1, 10)
		err = setAnchorData(nsAdmin, locksv1.TrustBundleConfigMap, grant.RevokedBelowEpochKey, lowered)
		Expect(err).To(notOperator)
		AddReportEntry("namespace admin lowers revokedBelowEpoch", err.Error())
		err = setAnchorData(rotator, locksv1.TrustBundleConfigMap, grant.RevokedBelowEpochKey, lowered)
		Expect(err).To(mayOnlyGrow("revokedBelowEpoch"))
		AddReportEntry("break-glass rotator lowers revokedBelowEpoch", err.Error())
		Expect(setAnchorData(opClient, locksv1.TrustBundleConfigMap, grant.RevokedBelowEpochKey, lowered)).To(mayOnlyGrow("revokedBelowEpoch"))
		Expect(update(opClient, &corev1.ConfigMap{ObjectMeta: objectMeta(opNamespace, locksv1.TrustBundleConfigMap)}, func(cm *corev1.ConfigMap) {
			delete(cm.Data, grant.RevokedBelowEpochKey)
		})).To(mayOnlyGrow("revokedBelowEpoch"))
		// The break-glass verb raises revokedBelowEpoch only: keys are the
		// operator's (kubectl fence keys rotate), and the bundle is never deleted.
		Expect(setAnchorData(rotator, locksv1.TrustBundleConfigMap, "k-extra", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")).To(notOperator)
		Expect(rotator.Delete(suiteCtx, &corev1.ConfigMap{ObjectMeta: objectMeta(opNamespace, locksv1.TrustBundleConfigMap)})).To(notOperator)
		Expect(nsAdmin.Delete(suiteCtx, &corev1.ConfigMap{ObjectMeta: objectMeta(opNamespace, locksv1.TrustBundleConfigMap)})).To(notOperator)
		Expect(anchorConfigMap(locksv1.TrustBundleConfigMap).Data[grant.RevokedBelowEpochKey]).To(Equal(raised))
	})

	It("keeps the issuer epoch growing and its record in place", func() {
		epoch := anchorEpoch()
		Expect(nsAdmin.Delete(suiteCtx, &corev1.ConfigMap{ObjectMeta: objectMeta(opNamespace, locksv1.IssuerEpochConfigMap)})).To(notOperator)
		Expect(setAnchorData(nsAdmin, locksv1.IssuerEpochConfigMap, "epoch", strconv.FormatInt(epoch+100, 10))).To(notOperator)
		Expect(setAnchorData(nsAdmin, locksv1.IssuerEpochConfigMap, "epoch", "0")).To(notOperator)
		Expect(setAnchorData(opClient, locksv1.IssuerEpochConfigMap, "epoch", strconv.FormatInt(epoch-1, 10))).To(mayOnlyGrow("the issuer epoch"))
		Expect(setAnchorData(opClient, locksv1.IssuerEpochConfigMap, "epoch", "x")).To(mayOnlyGrow("the issuer epoch"))
		Expect(anchorEpoch()).To(Equal(epoch))
	})

	It("restores the webhook configuration as installed, with an Event and a metric", func() {
		restored0 := metricValue("fencekeeper_webhook_configuration_restored_total")
		tamper := func(field string, mutate func(w *admissionregistrationv1.ValidatingWebhook)) {
			GinkgoHelper()
			events0 := len(driftEvents(field))
			Expect(update(admin, &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: locksv1.WebhookConfigurationName}},
				func(cfg *admissionregistrationv1.ValidatingWebhookConfiguration) {
					mutate(protectedHook(cfg))
				})).To(Succeed())
			Eventually(func() admissionregistrationv1.ValidatingWebhook {
				return *protectedHook(webhookConfiguration())
			}).Should(Equal(*protectedHook(installed)), "the operator did not restore %s", field)
			Eventually(func() []string { return driftEvents(field) }).Should(HaveLen(events0+1), "no %s Event for %s", locksv1.EventReasonWebhookConfigurationDrift, field)
		}
		ignore := admissionregistrationv1.Ignore
		tamper("failurePolicy", func(w *admissionregistrationv1.ValidatingWebhook) { w.FailurePolicy = &ignore })
		tamper("objectSelector", func(w *admissionregistrationv1.ValidatingWebhook) { w.ObjectSelector = nil })
		tamper("rules", func(w *admissionregistrationv1.ValidatingWebhook) {
			Expect(w.Rules[0].Resources).To(Equal([]string{"configmaps"}))
			w.Rules = w.Rules[1:] // protected ConfigMaps no longer reach the webhook
		})
		Expect(metricValue("fencekeeper_webhook_configuration_restored_total") - restored0).To(BeNumerically(">=", 3))
		AddReportEntry("drift Events", driftEvents(""))

		// Fencing is on again: an unfenced write of a protected ConfigMap is denied.
		ns := newNamespace()
		t := newTarget(protectedKinds[0], ns, "batch", locksv1.EnforcementEnforce)
		lg := held(ns, "batch", "worker-a", "a")
		Expect(t.write(lg, 1, "v1")).To(Succeed())
		t.deniedWith(fence.FenceRequired, func() error {
			return update(workers["worker-a"], &corev1.ConfigMap{ObjectMeta: objectMeta(ns, "batch")}, func(cm *corev1.ConfigMap) {
				cm.Data["result"] = "unfenced"
			})
		})

		// Nothing drifted: nothing is restored.
		restored := metricValue("fencekeeper_webhook_configuration_restored_total")
		Consistently(func() float64 { return metricValue("fencekeeper_webhook_configuration_restored_total") }, 2*time.Second, 100*time.Millisecond).
			Should(Equal(restored))
	})

	It("restores its admission policy and binding when they are changed or deleted", func() {
		Expect(update(admin, &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: fkoperator.TrustAnchorPolicyName}},
			func(p *admissionregistrationv1.ValidatingAdmissionPolicy) {
				for i := range p.Spec.Validations {
					p.Spec.Validations[i].Expression = "true"
				}
			})).To(Succeed())
		Expect(admin.Delete(suiteCtx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: fkoperator.TrustAnchorPolicyName}})).To(Succeed())
		Eventually(func() error {
			return admin.Get(suiteCtx, client.ObjectKey{Name: fkoperator.TrustAnchorPolicyName}, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{})
		}).Should(Succeed())
		Eventually(func() error {
			return nsAdmin.Delete(suiteCtx, &corev1.ConfigMap{ObjectMeta: objectMeta(opNamespace, locksv1.IssuerEpochConfigMap)}, client.DryRunAll)
		}).Should(notOperator)
		Eventually(func() error {
			return setAnchorData(nsAdmin, locksv1.TrustBundleConfigMap, grant.RevokedBelowEpochKey, "0", client.DryRunAll)
		}).Should(notOperator)
	})
})

// startGuard runs the operator's admission guard as the operator user with
// the declared kinds, the way operator.Run registers it (--protected-kinds,
// --cert-manager-username), and returns a function that stops it.
func startGuard(kinds []schema.GroupVersionResource) func() {
	mgr, err := ctrl.NewManager(opCfg, ctrl.Options{
		Scheme:  scheme,
		Cache:   controllers.CacheOptions(opNamespace, nil),
		Metrics: metricsserver.Options{BindAddress: "0"},
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(fkoperator.SetupAdmissionGuard(mgr, fkoperator.GuardOptions{
		Namespace: opNamespace, WebhookConfiguration: locksv1.WebhookConfigurationName, ProtectedKinds: kinds,
		CertManagerUsername: certManagerUser,
	})).To(Succeed())
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

// userWithRole adds a user bound to a Role with rules in the operator namespace.
func userWithRole(name string, rules ...rbacv1.PolicyRule) client.Client {
	GinkgoHelper()
	Expect(admin.Create(suiteCtx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: opNamespace, Name: name}, Rules: rules})).To(Succeed())
	return boundUser(name, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: opNamespace, Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}})
}

// boundUser binds the user name through binding (a RoleBinding or a
// ClusterRoleBinding without subjects) and returns a client acting as it.
func boundUser(name string, binding client.Object) client.Client {
	GinkgoHelper()
	user := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}}
	switch b := binding.(type) {
	case *rbacv1.RoleBinding:
		b.Subjects = user
	case *rbacv1.ClusterRoleBinding:
		b.Subjects = user
	}
	Expect(admin.Create(suiteCtx, binding)).To(Succeed())
	u, err := cp.AddUser(name)
	Expect(err).NotTo(HaveOccurred())
	c, err := client.New(u.Config(), client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

func anchorConfigMap(name string) *corev1.ConfigMap {
	GinkgoHelper()
	var cm corev1.ConfigMap
	Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: opNamespace, Name: name}, &cm)).To(Succeed())
	return &cm
}

func anchorEpoch() int64 {
	GinkgoHelper()
	n, err := strconv.ParseInt(anchorConfigMap(locksv1.IssuerEpochConfigMap).Data["epoch"], 10, 64)
	Expect(err).NotTo(HaveOccurred())
	return n
}

// removeTrustAnchorPolicy deletes the guard's policy and binding and waits
// until the API server no longer enforces them (probe, not the operator, may
// write the trust bundle again). Otherwise the next container's check that
// its own policy is enforced could be answered by this one on its way out,
// and the deletion would land in the middle of its specs.
func removeTrustAnchorPolicy(probe client.Client) {
	GinkgoHelper()
	for _, obj := range []client.Object{
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: fkoperator.TrustAnchorPolicyName}},
		&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: fkoperator.TrustAnchorPolicyName}},
	} {
		Expect(client.IgnoreNotFound(admin.Delete(suiteCtx, obj))).To(Succeed())
	}
	Eventually(func() error {
		return setAnchorData(probe, locksv1.TrustBundleConfigMap, "k-probe", randomPublicKey(), client.DryRunAll)
	}).Should(Succeed(), "the trust-anchor policy is still enforced after its deletion")
}

// setAnchorData sets one entry of an operator-namespace ConfigMap as c.
func setAnchorData(c client.Client, name, key, value string, opts ...client.UpdateOption) error {
	cm := &corev1.ConfigMap{ObjectMeta: objectMeta(opNamespace, name)}
	for {
		if err := c.Get(suiteCtx, client.ObjectKeyFromObject(cm), cm); err != nil {
			return err
		}
		cm.Data[key] = value
		err := c.Update(suiteCtx, cm, opts...)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

func webhookConfiguration() *admissionregistrationv1.ValidatingWebhookConfiguration {
	GinkgoHelper()
	var cfg admissionregistrationv1.ValidatingWebhookConfiguration
	Expect(admin.Get(suiteCtx, client.ObjectKey{Name: locksv1.WebhookConfigurationName}, &cfg)).To(Succeed())
	return &cfg
}

func protectedHook(cfg *admissionregistrationv1.ValidatingWebhookConfiguration) *admissionregistrationv1.ValidatingWebhook {
	GinkgoHelper()
	for i := range cfg.Webhooks {
		if cfg.Webhooks[i].Name == localcp.ProtectedWebhook {
			return &cfg.Webhooks[i]
		}
	}
	Fail("the webhook configuration has no " + localcp.ProtectedWebhook)
	return nil
}

// driftEvents are the notes of drift Events about the webhook configuration
// (cluster-scoped, so its Events live in the default namespace) naming field.
func driftEvents(field string) []string {
	var list corev1.EventList
	Expect(admin.List(suiteCtx, &list, client.InNamespace(metav1.NamespaceDefault))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Name == locksv1.WebhookConfigurationName && e.Reason == locksv1.EventReasonWebhookConfigurationDrift &&
			strings.Contains(e.Message, field) {
			out = append(out, e.Message)
		}
	}
	return out
}
