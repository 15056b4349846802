package envtest

import (
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	fkoperator "github.com/fencekeeper/fencekeeper/internal/operator"
	"github.com/fencekeeper/fencekeeper/internal/rules/protectedkinds"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// suiteKinds are the custom kinds the suite's webhook configuration covers
// as installed (suite_test.go); a guard run by a spec declares them too.
var suiteKinds = []schema.GroupVersionResource{
	{Group: "billing.example.com", Version: "v1", Resource: "invoicebatches"},
	{Group: "billing.example.com", Version: "v1", Resource: "invoiceshards"},
}

// widgetGVR is declared only by these specs (testdata/widgets.yaml).
var widgetGVR = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}

var widgetKind = protectedKind{
	name: "declared custom resource", gvk: schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"},
	setContent: func(u *unstructured.Unstructured, v string) {
		u.Object["spec"] = map[string]any{"result": v, "replicas": int64(1)}
	},
	getContent: func(u *unstructured.Unstructured) string {
		s, _, _ := unstructured.NestedString(u.Object, "spec", "result")
		return s
	},
}

// A kind is protected by declaring it to the operator (--protected-kinds):
// the operator keeps both protected webhook entries' rules in step with the
// list, and reads the kind through the installer's aggregated ClusterRole.
var _ = Describe("declared protected kinds", Ordered, func() {
	var (
		ns        string
		stopGuard func()
		installed *admissionregistrationv1.ValidatingWebhookConfiguration
		opClient  client.Client
		created   []client.Object
	)
	declared := append(append([]schema.GroupVersionResource{}, suiteKinds...), widgetGVR)
	widgetEntry := func(name string, mode locksv1.EnforcementMode) *locksv1.FencedResource {
		return &locksv1.FencedResource{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: locksv1.FencedResourceSpec{ResourceID: "test/" + ns + "/" + name, LeaseDurationSeconds: 10, Enforcement: mode,
				Target: &locksv1.ObjectTarget{APIVersion: widgetKind.gvk.GroupVersion().String(), Kind: widgetKind.gvk.Kind, Name: name}},
		}
	}

	BeforeAll(func() {
		ns = newNamespace()
		installed = webhookConfiguration()
		var err error
		opClient, err = client.New(opCfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		// Workers may write widgets (their own RBAC, as for any protected kind).
		writer := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "widget-writer"}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{widgetGVR.Group}, Resources: []string{"widgets", "widgets/scale", "widgets/status"}, Verbs: []string{"*"},
		}}}
		writers := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "widget-writer"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "widget-writer"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: workersGroup}}}
		for _, obj := range []client.Object{writer, writers} {
			Expect(admin.Create(suiteCtx, obj)).To(Succeed())
			created = append(created, obj)
		}
	})

	AfterAll(func() {
		if stopGuard != nil {
			stopGuard()
		}
		restoreSuiteAdmission(installed)
		for _, obj := range created {
			Expect(client.IgnoreNotFound(admin.Delete(suiteCtx, obj))).To(Succeed())
		}
	})

	It("cannot grant itself read access: the installer's aggregated ClusterRole does", func() {
		perKind := func() *rbacv1.ClusterRole {
			return &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: "fencekeeper-protected-kind-widgets.example.com", Labels: map[string]string{fkoperator.AggregateToManagerLabel: "true"}},
				Rules:      []rbacv1.PolicyRule{{APIGroups: []string{widgetGVR.Group}, Resources: []string{"widgets"}, Verbs: []string{"get", "list", "watch"}}},
			}
		}
		// The operator identity may not create ClusterRoles at all.
		Expect(opClient.Create(suiteCtx, perKind(), client.DryRunAll)).To(WithTransform(apierrors.IsForbidden, BeTrue()))
		// Even an identity allowed to create ClusterRoles cannot write one
		// granting what it does not hold: the API server's escalation check.
		// (This is why the operator is not given create on ClusterRoles.)
		roleMaker := clusterUserWithRole("clusterrole-maker", rbacv1.PolicyRule{
			APIGroups: []string{rbacv1.GroupName}, Resources: []string{"clusterroles"}, Verbs: []string{"create"}})
		created = append(created, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "clusterrole-maker"}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "clusterrole-maker"}})
		Expect(roleMaker.Create(suiteCtx, perKind(), client.DryRunAll)).To(And(
			WithTransform(apierrors.IsForbidden, BeTrue()), MatchError(ContainSubstring("attempting to grant RBAC permissions not currently held"))))

		widgets := &unstructured.UnstructuredList{}
		widgets.SetGroupVersionKind(widgetKind.gvk.GroupVersion().WithKind("WidgetList"))
		Expect(opClient.List(suiteCtx, widgets, client.InNamespace(ns))).To(WithTransform(apierrors.IsForbidden, BeTrue()))

		// The installer: the aggregated role of config/rbac bound to the
		// operator, and one labelled ClusterRole per declared kind.
		objs, err := localcp.LoadObjects(scheme, filepath.Join(cp.Root(), "config", "rbac", "protected_kinds_role.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(objs).To(HaveLen(1))
		aggregated := objs[0].(*rbacv1.ClusterRole)
		Expect(aggregated.AggregationRule).NotTo(BeNil())
		bound := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: aggregated.Name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: aggregated.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: locksv1.OperatorUsername(opNamespace)}}}
		for _, obj := range []client.Object{aggregated, bound, perKind()} {
			Expect(admin.Create(suiteCtx, obj)).To(Succeed())
			created = append(created, obj)
		}
		aggregateClusterRoles(aggregated.Name)
		Eventually(func() error { return opClient.List(suiteCtx, widgets, client.InNamespace(ns)) }).Should(Succeed())
	})

	It("refuses a registry entry for a kind whose writes the acceptance webhook does not see", func() {
		// Not declared yet: the webhook never sees a widget write, so an
		// entry would promise a protection nobody gives. A Shadow entry is
		// refused too: it could be switched to Enforce later.
		for _, mode := range []locksv1.EnforcementMode{locksv1.EnforcementEnforce, locksv1.EnforcementShadow} {
			err := admin.Create(suiteCtx, widgetEntry("w", mode))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%s entry: %v", mode, err)
			Expect(err).To(MatchError(And(ContainSubstring("spec.target"),
				ContainSubstring("widgets.example.com/v1"), ContainSubstring("--protected-kinds"))))
		}
		// A kind the API server does not serve at all is named as such.
		err := admin.Create(suiteCtx, &locksv1.FencedResource{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gadget"},
			Spec: locksv1.FencedResourceSpec{ResourceID: "test/" + ns + "/gadget", LeaseDurationSeconds: 10,
				Target: &locksv1.ObjectTarget{APIVersion: "example.com/v1", Kind: "Gadget", Name: "g"}},
		})
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err).To(MatchError(And(ContainSubstring("spec.target"), ContainSubstring("not served"))))
	})

	It("checks every write of a declared kind and of its /scale once the operator declares it", func() {
		// Not declared yet: the webhook never sees a widget write.
		Expect(workers["worker-b"].Create(suiteCtx, (target{kind: widgetKind, ns: ns, name: "w"}).unfenced("planted", nil, nil), client.DryRunAll)).To(Succeed())

		stopGuard = startGuard(declared)
		Eventually(func() error {
			return admin.Create(suiteCtx, widgetEntry("w", locksv1.EnforcementEnforce), client.DryRunAll)
		}).Should(Succeed())
		t := newTarget(widgetKind, ns, "w", locksv1.EnforcementEnforce)
		Eventually(func() error {
			return workers["worker-b"].Create(suiteCtx, t.unfenced("planted", nil, nil), client.DryRunAll)
		}).Should(denied(fence.FenceRequired))
		cfg := webhookConfiguration()
		for _, w := range cfg.Webhooks {
			protected := w.Name == localcp.ProtectedWebhook || w.Name == localcp.EnrolledWebhook
			Expect(hasKindRule(w.Rules, widgetGVR)).To(Equal(protected), "rules of %s: %v", w.Name, w.Rules)
		}
		Expect(cfg.Annotations).To(HaveKeyWithValue(locksv1.AnnotationProtectedKinds,
			"invoicebatches.billing.example.com/v1,invoiceshards.billing.example.com/v1,widgets.example.com/v1"))

		a := held(ns, "w", "worker-a", "a")
		Expect(t.write(a, 1, "v1")).To(Succeed())
		t.deniedWith(fence.FenceRequired, func() error {
			u := t.get()
			t.kind.setContent(u, "unfenced")
			return workers["worker-b"].Update(suiteCtx, u)
		})
		obj := t.get()
		scale := &unstructured.Unstructured{}
		scale.SetGroupVersionKind(autoscalingv1.SchemeGroupVersion.WithKind("Scale"))
		Expect(workers["worker-b"].SubResource("scale").Get(suiteCtx, obj, scale)).To(Succeed())
		Expect(unstructured.SetNestedField(scale.Object, int64(7), "spec", "replicas")).To(Succeed())
		t.deniedWith(fence.FenceRequired, func() error {
			return workers["worker-b"].SubResource("scale").Update(suiteCtx, obj, client.WithSubResourceBody(scale))
		})
		// Nor can /status carry a metadata change past the webhook.
		obj = t.get()
		obj.SetLabels(nil)
		_ = workers["worker-b"].Status().Update(suiteCtx, obj)
		Expect(t.get().GetLabels()).To(HaveKeyWithValue(fence.LabelProtected, "true"))
		Expect(t.content()).To(Equal("v1"))
	})

	It("restores a declared kind's rule removed by hand and removes an undeclared one", func() {
		Expect(stopGuard).NotTo(BeNil(), "runs after the guard was started")
		deploymentsGVR := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
		deployments := protectedkinds.Rule(deploymentsGVR)
		Expect(update(admin, &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: installed.ObjectMeta},
			func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
				for i := range c.Webhooks {
					w := &c.Webhooks[i]
					switch w.Name {
					case localcp.ProtectedWebhook:
						Expect(hasKindRule(w.Rules[len(w.Rules)-1:], widgetGVR)).To(BeTrue())
						w.Rules = w.Rules[:len(w.Rules)-1] // the widgets rule
					case localcp.EnrolledWebhook:
						w.Rules = append(w.Rules, deployments)
					}
				}
			})).To(Succeed())
		Eventually(func(g Gomega) {
			for _, w := range webhookConfiguration().Webhooks {
				switch w.Name {
				case localcp.ProtectedWebhook:
					g.Expect(hasKindRule(w.Rules, widgetGVR)).To(BeTrue(), "rules of %s: %v", w.Name, w.Rules)
				case localcp.EnrolledWebhook:
					g.Expect(hasKindRule(w.Rules, deploymentsGVR)).To(BeFalse(), "rules of %s: %v", w.Name, w.Rules)
				}
			}
		}).Should(Succeed())
		Eventually(func() []string { return driftEvents("rules") }).Should(ContainElement(And(
			ContainSubstring("restored declared widgets.example.com/v1"), ContainSubstring("removed undeclared deployments.apps/v1"))))
	})

	It("is reported by kubectl fence audit when a FencedResource targets an undeclared kind", func() {
		// The operator may read Deployments (an installer granted it) but
		// they are not declared: no webhook rule sees their writes.
		reader := &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "fencekeeper-protected-kind-deployments.apps", Labels: map[string]string{fkoperator.AggregateToManagerLabel: "true"}},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"get", "list", "watch"}}},
		}
		Expect(admin.Create(suiteCtx, reader)).To(Succeed())
		created = append(created, reader)
		aggregateClusterRoles("manager-protected-kinds-role")
		// Deployments were declared when the entry was made (the webhook
		// refuses an entry for an undeclared kind), then an operator with a
		// shorter list took over and removed their rules.
		web := func() *locksv1.FencedResource {
			return &locksv1.FencedResource{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
				Spec: locksv1.FencedResourceSpec{ResourceID: "test/" + ns + "/web", LeaseDurationSeconds: 10,
					Target: &locksv1.ObjectTarget{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"}},
			}
		}
		deploymentsGVR := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
		stopGuard()
		stopGuard = startGuard(append(append([]schema.GroupVersionResource{}, declared...), deploymentsGVR))
		Eventually(func() error { return admin.Create(suiteCtx, web()) }).Should(Succeed())
		stopGuard()
		stopGuard = startGuard(declared)
		Eventually(func(g Gomega) {
			for _, w := range webhookConfiguration().Webhooks {
				g.Expect(hasKindRule(w.Rules, deploymentsGVR)).To(BeFalse(), "rules of %s", w.Name)
			}
		}).Should(Succeed())
		var rep struct {
			Objects []struct {
				Object string   `json:"object"`
				Gaps   []string `json:"gaps"`
			} `json:"objects"`
		}
		r := kubectlFence(adminCfg, "audit", "-n", ns, "-o", "json")
		Expect(r.code).To(Equal(1), r.stderr)
		r.decode(&rep)
		gaps := map[string]string{}
		for _, o := range rep.Objects {
			gaps[o.Object] = strings.Join(o.Gaps, "; ")
		}
		Expect(gaps).To(HaveKeyWithValue("Deployment/web", And(
			ContainSubstring("deployments.apps/v1 is not a declared protected kind"), ContainSubstring("--protected-kinds"))))
		Expect(gaps).To(HaveKeyWithValue("Widget/w", BeEmpty()))
	})
})

// restoreSuiteAdmission leaves the suite as it was after specs that ran the
// guard with other kinds declared: the guard's policy off (see
// anchors_test.go) and the webhook rules as the suite installed them.
func restoreSuiteAdmission(installed *admissionregistrationv1.ValidatingWebhookConfiguration) {
	GinkgoHelper()
	removeTrustAnchorPolicy(admin)
	Expect(update(admin, &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: installed.ObjectMeta},
		func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
			c.Webhooks = installed.Webhooks
			delete(c.Annotations, locksv1.AnnotationProtectedKinds)
		})).To(Succeed())
}

// hasKindRule says whether rules hold the declared-kind rule of k (the API
// server adds scope: "*" to what the operator writes).
func hasKindRule(rules []admissionregistrationv1.RuleWithOperations, k schema.GroupVersionResource) bool {
	want := protectedkinds.Rule(k)
	for _, r := range rules {
		r.Scope = nil
		if equality.Semantic.DeepEqual(r, want) {
			return true
		}
	}
	return false
}

// aggregateClusterRoles does what kube-controller-manager's
// clusterrole-aggregation controller does (envtest runs no controller
// manager): it sets the rules of the aggregated ClusterRole name to the union
// of the rules of the ClusterRoles its aggregationRule selects, those
// aggregated themselves first (the built-in edit aggregates view).
func aggregateClusterRoles(name string) *rbacv1.ClusterRole {
	GinkgoHelper()
	agg := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}}
	Expect(update(admin, agg, func(agg *rbacv1.ClusterRole) {
		agg.Rules = nil
		for _, sel := range agg.AggregationRule.ClusterRoleSelectors {
			selector, err := metav1.LabelSelectorAsSelector(&sel)
			Expect(err).NotTo(HaveOccurred())
			var roles rbacv1.ClusterRoleList
			Expect(admin.List(suiteCtx, &roles, client.MatchingLabelsSelector{Selector: selector})).To(Succeed())
			for _, r := range roles.Items {
				switch {
				case r.Name == name:
				case r.AggregationRule != nil:
					agg.Rules = append(agg.Rules, aggregateClusterRoles(r.Name).Rules...)
				default:
					agg.Rules = append(agg.Rules, r.Rules...)
				}
			}
		}
	})).To(Succeed())
	return agg
}

// clusterUserWithRole adds a user bound to a ClusterRole (named like the user) with rules.
func clusterUserWithRole(name string, rules ...rbacv1.PolicyRule) client.Client {
	GinkgoHelper()
	Expect(admin.Create(suiteCtx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules})).To(Succeed())
	return boundUser(name, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}})
}
