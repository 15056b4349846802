package envtest

import (
	"errors"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

var deploymentsGVR = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}

// deploymentKind is the built-in kind the chart's example declares. Its
// content here is an annotation of the pod template: the Deployment is
// created before it is protected, so the API server defaults its spec once
// and a fenced write's digest is of what gets stored.
var deploymentKind = protectedKind{
	name: "Deployment", gvk: appsv1.SchemeGroupVersion.WithKind("Deployment"),
	setContent: func(u *unstructured.Unstructured, v string) {
		Expect(unstructured.SetNestedField(u.Object, v, "spec", "template", "metadata", "annotations", "result")).To(Succeed())
	},
	getContent: func(u *unstructured.Unstructured) string {
		s, _, _ := unstructured.NestedString(u.Object, "spec", "template", "metadata", "annotations", "result")
		return s
	},
}

// A write to /status is not a fenced write: the acceptance webhook lets it
// through because the API server keeps everything but status as stored.
// Each kind's status strategy decides what "everything" is, so these specs
// ask the API server what lands through /status of a protected object.
var _ = Describe("the status subresource of a protected object", Ordered, func() {
	var (
		ns        string
		stopGuard func()
		installed *admissionregistrationv1.ValidatingWebhookConfiguration
		created   []client.Object
	)

	BeforeAll(func() {
		ns = newNamespace()
		installed = webhookConfiguration()
		// The installer's part for a declared built-in kind: the operator
		// reads it, the workers write it (their own RBAC).
		rules := map[string]rbacv1.PolicyRule{
			"deployment-reader": {APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"get", "list", "watch"}},
			"deployment-writer": {APIGroups: []string{"apps"}, Resources: []string{"deployments", "deployments/status"}, Verbs: []string{"*"}},
		}
		subjects := map[string]rbacv1.Subject{
			"deployment-reader": {Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: locksv1.OperatorUsername(opNamespace)},
			"deployment-writer": {Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: workersGroup},
		}
		for name, rule := range rules {
			role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{rule}}
			binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: []rbacv1.Subject{subjects[name]},
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}}
			for _, obj := range []client.Object{role, binding} {
				Expect(admin.Create(suiteCtx, obj)).To(Succeed())
				created = append(created, obj)
			}
		}
		stopGuard = startGuard(append(append([]schema.GroupVersionResource{}, suiteKinds...), deploymentsGVR))
		Eventually(func(g Gomega) {
			for _, w := range webhookConfiguration().Webhooks {
				if w.Name == localcp.ProtectedWebhook || w.Name == localcp.EnrolledWebhook {
					g.Expect(hasKindRule(w.Rules, deploymentsGVR)).To(BeTrue())
				}
			}
		}).Should(Succeed())
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

	// protectedDeployment creates a Deployment, then its entry, and writes it
	// once under a grant: it then carries the label, the resource annotation,
	// a fence and a receipt log.
	protectedDeployment := func(name string, mode locksv1.EnforcementMode) target {
		GinkgoHelper()
		labels := map[string]string{"app": name}
		Expect(admin.Create(suiteCtx, &appsv1.Deployment{ObjectMeta: objectMeta(ns, name), Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.invalid/web:1"}}}},
		}})).To(Succeed())
		t := newTarget(deploymentKind, ns, name, mode)
		Expect(t.write(held(ns, name, "worker-a", name), 1, "v1")).To(Succeed())
		return t
	}
	protectedShard := func(name string) target {
		GinkgoHelper()
		t := newTarget(shardKind, ns, name, locksv1.EnforcementEnforce)
		Expect(t.write(held(ns, name, "worker-a", name), 1, "v1")).To(Succeed())
		return t
	}

	It("refuses a tenant's /status write of fencekeeper's marks where the kind would store them", func() {
		got := map[string]string{}
		for _, t := range []target{protectedDeployment("web", locksv1.EnforcementEnforce), protectedShard("shard")} {
			for _, c := range statusCases() {
				got[t.kind.gvk.Kind+": "+c.what] = t.statusWrite(workers["worker-b"], c)
			}
			Expect(t.content()).To(Equal("v1"))
		}
		AddReportEntry("outcomes", got)
		Expect(got).To(Equal(map[string]string{
			// apps/v1 Deployment: the status strategy resets spec and labels only.
			"Deployment: plants another fence":          "refused " + string(fence.FenceRequired),
			"Deployment: strips the receipt log":        "refused " + string(fence.FenceRequired),
			"Deployment: points the resource elsewhere": "refused " + string(fence.ProtectionRemoved),
			"Deployment: drops the resource annotation": "refused " + string(fence.ProtectionRemoved),
			"Deployment: drops the protected label":     "dropped by the API server",
			"Deployment: writes status only":            "landed",
			// A custom resource's status strategy keeps all but status.
			"InvoiceShard: plants another fence":          "dropped by the API server",
			"InvoiceShard: strips the receipt log":        "dropped by the API server",
			"InvoiceShard: points the resource elsewhere": "dropped by the API server",
			"InvoiceShard: drops the resource annotation": "dropped by the API server",
			"InvoiceShard: drops the protected label":     "dropped by the API server",
			"InvoiceShard: writes status only":            "landed",
		}))
	})

	It("warns in Shadow, except that fence state never changes without a segment", func() {
		t := protectedDeployment("shadow", locksv1.EnforcementShadow)
		warnings := &warningCollector{}
		c := warningClient("worker-b", warnings)
		cases := statusCases()
		byWhat := map[string]statusCase{}
		for _, sc := range cases {
			byWhat[sc.what] = sc
		}
		Expect(t.statusWrite(c, byWhat["plants another fence"])).To(Equal("refused " + string(fence.FenceRequired)))
		Expect(t.statusWrite(c, byWhat["strips the receipt log"])).To(Equal("refused " + string(fence.FenceRequired)))
		Expect(t.statusWrite(c, byWhat["points the resource elsewhere"])).To(Equal("landed"))
		Expect(warnings.all()).To(ContainElement(HavePrefix("fencekeeper: would deny: " + string(fence.ProtectionRemoved) + ":")))
	})

	// Fence state is only ever written at a target, through any path: none
	// is planted on an object before it becomes one.
	It("plants no fence state through /status of an object nobody protects", func() {
		labels := map[string]string{"app": "free"}
		Expect(admin.Create(suiteCtx, &appsv1.Deployment{ObjectMeta: objectMeta(ns, "free"), Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.invalid/web:1"}}}},
		}})).To(Succeed())
		free := target{kind: deploymentKind, ns: ns, name: "free"}
		plant := statusCase{"plants a fence", func(u *unstructured.Unstructured) {
			u.SetAnnotations(map[string]string{fence.AnnotationFence: `{"grant":{"fenceToken":999}}`})
		}, func(_, after *unstructured.Unstructured) bool {
			return after.GetAnnotations()[fence.AnnotationFence] != ""
		}}
		Expect(free.statusWrite(workers["worker-b"], plant)).To(Equal("refused " + string(fence.WrongResource)))
		Expect(free.statusWrite(workers["worker-b"], statusCases()[len(statusCases())-1])).To(Equal("landed"))
	})
})

// statusCase is one /status write: what it tries to change besides status,
// and how to tell that change in the stored object.
type statusCase struct {
	what   string
	mutate func(u *unstructured.Unstructured)
	landed func(before, after *unstructured.Unstructured) bool
}

func statusCases() []statusCase {
	annotation := func(key string) func(before, after *unstructured.Unstructured) bool {
		return func(before, after *unstructured.Unstructured) bool {
			return before.GetAnnotations()[key] != after.GetAnnotations()[key]
		}
	}
	setAnnotation := func(key, value string) func(u *unstructured.Unstructured) {
		return func(u *unstructured.Unstructured) {
			ann := u.GetAnnotations()
			if value == "" {
				delete(ann, key)
			} else {
				ann[key] = value
			}
			u.SetAnnotations(ann)
		}
	}
	return []statusCase{
		{"plants another fence", setAnnotation(fence.AnnotationFence, `{"grant":{"fenceToken":999}}`), annotation(fence.AnnotationFence)},
		{"strips the receipt log", setAnnotation(fence.AnnotationReceipts, ""), annotation(fence.AnnotationReceipts)},
		{"points the resource elsewhere", setAnnotation(fence.AnnotationResource, "elsewhere"), annotation(fence.AnnotationResource)},
		{"drops the resource annotation", setAnnotation(fence.AnnotationResource, ""), annotation(fence.AnnotationResource)},
		{"drops the protected label", func(u *unstructured.Unstructured) { u.SetLabels(map[string]string{"app": "other"}) },
			func(before, after *unstructured.Unstructured) bool {
				return after.GetLabels()[fence.LabelProtected] != before.GetLabels()[fence.LabelProtected]
			}},
		{"writes status only", func(*unstructured.Unstructured) {}, func(before, after *unstructured.Unstructured) bool {
			return after.GetResourceVersion() != before.GetResourceVersion()
		}},
	}
}

// statusWrite writes the object's /status as c, with c's change besides a
// new status.replicas, and says what became of it: refused (with the
// verdict), landed, or dropped by the API server (admitted, not stored).
func (t target) statusWrite(c client.Client, sc statusCase) string {
	GinkgoHelper()
	before := t.get()
	u := before.DeepCopy()
	replicas, _, _ := unstructured.NestedInt64(u.Object, "status", "replicas")
	Expect(unstructured.SetNestedField(u.Object, replicas+1, "status", "replicas")).To(Succeed())
	sc.mutate(u)
	err := c.Status().Update(suiteCtx, u)
	after := t.get()
	switch {
	case err != nil:
		Expect(after.GetResourceVersion()).To(Equal(before.GetResourceVersion()), "%s: refused, yet the object changed", sc.what)
		var api apierrors.APIStatus
		if errors.As(err, &api) && api.Status().Details != nil {
			for _, cause := range api.Status().Details.Causes {
				if cause.Type == fence.CauseVerdict {
					return "refused " + cause.Message
				}
			}
		}
		return "refused: " + err.Error()
	case sc.landed(before, after):
		return "landed"
	}
	return "dropped by the API server"
}
