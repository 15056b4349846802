// Package envtest runs fencekeeper against a real kube-apiserver and etcd
// (the binaries hack/build-control-plane.sh builds into bin/k8s). The issuer
// and the webhooks run in-process as real, distinct, RBAC-limited users, and
// workers act through their own authenticated clients.
package envtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers"
	"github.com/fencekeeper/fencekeeper/webhooks"
)

const (
	operatorUser = "system:serviceaccount:fencekeeper-system:fencekeeper-controller-manager"
	workersGroup = "fencekeeper:workers"
	opNamespace  = controllers.DefaultNamespace
)

var (
	testEnv   *envtest.Environment
	adminCfg  *rest.Config
	admin     client.Client
	scheme    = runtime.NewScheme()
	opCfg     *rest.Config
	suiteCtx  context.Context
	cancelAll context.CancelFunc
	// workers are authenticated clients of distinct users, by user name.
	workers = map[string]client.Client{}
	// primary is the issuer most specs run against; specs that restart the
	// issuer replace it.
	primary *operator
	// issuerClock is the operator's clock: the issuers' and the webhook's.
	issuerClock *clocktesting.FakeClock
)

func TestEnvtest(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "fencekeeper envtest suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(locksv1.AddToScheme(scheme))
	suiteCtx, cancelAll = context.WithCancel(context.Background())

	root := repoRoot()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join(root, "bin", "k8s")
	}
	Expect(filepath.Join(assets, "kube-apiserver")).To(BeAnExistingFile(),
		"the control plane is not built: run `make test` (or hack/build-control-plane.sh) first")
	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases"), filepath.Join(root, "test", "envtest", "testdata")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: assets,
		WebhookInstallOptions: envtest.WebhookInstallOptions{ValidatingWebhooks: webhookConfigurations(root)},
	}
	var err error
	adminCfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	admin, err = client.New(adminCfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	Expect(admin.Create(suiteCtx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opNamespace}})).To(Succeed())
	// The operator runs with exactly the generated RBAC (config/rbac/role.yaml),
	// which proves it is sufficient; workers get the requester role.
	for _, obj := range loadYAML(filepath.Join(root, "config", "rbac", "role.yaml"), filepath.Join(root, "config", "rbac", "lockgrant_requester_role.yaml")) {
		Expect(admin.Create(suiteCtx, obj)).To(Succeed())
	}
	bind := func(kind, roleName, ns string, subject rbacv1.Subject) {
		meta := metav1.ObjectMeta{Name: roleName + "-" + strings.ToLower(subject.Kind), Namespace: ns}
		ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: kind, Name: roleName}
		var obj client.Object = &rbacv1.ClusterRoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: []rbacv1.Subject{subject}}
		if kind == "Role" {
			obj = &rbacv1.RoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: []rbacv1.Subject{subject}}
		}
		Expect(admin.Create(suiteCtx, obj)).To(Succeed())
	}
	opSubject := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: operatorUser}
	bind("ClusterRole", "manager-role", "", opSubject)
	bind("ClusterRole", "target-reader", "", opSubject)
	bind("Role", "manager-role", opNamespace, opSubject)
	workerSubject := rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: workersGroup}
	bind("ClusterRole", "lockgrant-requester", "", workerSubject)
	// The protected objects of the tests: workers write them, the operator reads
	// the custom kind's targets (as an installation grants for its kinds).
	Expect(admin.Create(suiteCtx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "protected-object-writer"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "create", "update", "patch", "delete"}},
		{APIGroups: []string{"billing.example.com"}, Resources: []string{"invoicebatches"}, Verbs: []string{"get", "list", "create", "update", "patch", "delete"}},
	}})).To(Succeed())
	bind("ClusterRole", "protected-object-writer", "", workerSubject)
	Expect(admin.Create(suiteCtx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "target-reader"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"billing.example.com"}, Resources: []string{"invoicebatches"}, Verbs: []string{"get"}},
	}})).To(Succeed())

	opUser, err := testEnv.AddUser(envtest.User{Name: operatorUser}, adminCfg)
	Expect(err).NotTo(HaveOccurred())
	opCfg = opUser.Config()
	opCfg.QPS, opCfg.Burst = 500, 1000
	for _, name := range []string{"worker-a", "worker-b", "worker-c", "worker-d", "worker-e"} {
		u, err := testEnv.AddUser(envtest.User{Name: name, Groups: []string{workersGroup}}, adminCfg)
		Expect(err).NotTo(HaveOccurred())
		workers[name], err = client.New(u.Config(), client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
	}

	issuerClock = clocktesting.NewFakeClock(time.Now())
	startWebhookServer()
	primary = startOperator("primary", issuerClock, controllers.Options{})
})

var _ = AfterSuite(func() {
	if cancelAll != nil {
		cancelAll()
	}
	if primary != nil {
		primary.stop()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

// startWebhookServer serves the admission webhooks for the whole suite, as the
// operator user, in a manager of its own: in a deployment every replica serves
// webhooks while only the leader issues, so specs can stop and restart issuers.
func startWebhookServer() {
	o := testEnv.WebhookInstallOptions
	mgr, err := ctrl.NewManager(opCfg, ctrl.Options{
		Scheme:  scheme,
		Cache:   controllers.CacheOptions(opNamespace),
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: o.LocalServingHost, Port: o.LocalServingPort, CertDir: o.LocalServingCertDir,
		}),
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(webhooks.SetupLockGrantWebhook(mgr)).To(Succeed())
	Expect(webhooks.SetupFencedResourceWebhook(mgr)).To(Succeed())
	_, err = webhooks.SetupProtectedWebhook(mgr, opNamespace, issuerClock)
	Expect(err).NotTo(HaveOccurred())
	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(suiteCtx)).To(Succeed())
	}()
	Eventually(func() error { return mgr.GetWebhookServer().StartedChecker()(nil) }).Should(Succeed())
}

// webhookConfigurations loads the generated webhook manifests and adds the
// test's custom kind to the protected-object webhook, as an installation adds
// its own kinds (docs/protecting-objects.md).
func webhookConfigurations(root string) []*admissionregistrationv1.ValidatingWebhookConfiguration {
	var out []*admissionregistrationv1.ValidatingWebhookConfiguration
	for _, obj := range loadYAML(filepath.Join(root, "config", "webhook", "manifests.yaml")) {
		cfg := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration)
		for i := range cfg.Webhooks {
			if cfg.Webhooks[i].Name == "vprotected.fencekeeper.dev" {
				rule := cfg.Webhooks[i].Rules[0].DeepCopy()
				rule.APIGroups, rule.APIVersions, rule.Resources = []string{"billing.example.com"}, []string{"v1"}, []string{"invoicebatches"}
				cfg.Webhooks[i].Rules = append(cfg.Webhooks[i].Rules, *rule)
			}
		}
		out = append(out, cfg)
	}
	Expect(out).NotTo(BeEmpty())
	return out
}

// operator is one running issuer (a manager with its own cache).
type operator struct {
	issuer *controllers.Issuer
	clock  *clocktesting.FakeClock
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func startOperator(name string, clk *clocktesting.FakeClock, opts controllers.Options) *operator {
	mgr, err := ctrl.NewManager(opCfg, ctrl.Options{
		Scheme:  scheme,
		Cache:   controllers.CacheOptions(opNamespace),
		Metrics: metricsserver.Options{BindAddress: "0"},
		// Leader election is off: specs start several issuers on purpose.
	})
	Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(suiteCtx)
	opts.Namespace, opts.Clock, opts.InstanceName = opNamespace, clk, name
	issuer, err := controllers.Setup(ctx, mgr, opts)
	Expect(err).NotTo(HaveOccurred())
	op := &operator{issuer: issuer, clock: clk, cancel: cancel}
	op.done.Add(1)
	go func() {
		defer GinkgoRecover()
		defer op.done.Done()
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
	Eventually(issuer.Ready, 20*time.Second).Should(BeTrue(), "issuer %s did not become ready", name)
	return op
}

// stop ends the operator and waits until it has fully stopped.
func (o *operator) stop() {
	o.cancel()
	o.done.Wait()
}

// step advances the issuer's clock and makes it look at every resource again
// (in production time passes and requeues fire; here time is ours).
func (o *operator) step(d time.Duration) {
	o.clock.Step(d)
	o.issuer.ResyncAll()
}

func repoRoot() string {
	dir, err := os.Getwd()
	Expect(err).NotTo(HaveOccurred())
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		Expect(parent).NotTo(Equal(dir), "go.mod not found above the test directory")
		dir = parent
	}
}

// loadYAML reads multi-document manifests into typed objects.
func loadYAML(paths ...string) []client.Object {
	var out []client.Object
	for _, p := range paths {
		f, err := os.Open(p)
		Expect(err).NotTo(HaveOccurred())
		dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); err != nil {
				break
			}
			if len(u.Object) == 0 {
				continue
			}
			obj, err := scheme.New(u.GroupVersionKind())
			Expect(err).NotTo(HaveOccurred())
			Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj)).To(Succeed())
			out = append(out, obj.(client.Object))
		}
		f.Close()
	}
	return out
}

// newNamespace makes a namespace for one spec.
func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-"}}
	Expect(admin.Create(suiteCtx, ns)).To(Succeed())
	return ns.Name
}

func newFencedResource(ns, name string, lease int32, mutate ...func(*locksv1.FencedResource)) *locksv1.FencedResource {
	fr := &locksv1.FencedResource{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       locksv1.FencedResourceSpec{ResourceID: "test/" + ns + "/" + name, LeaseDurationSeconds: lease},
	}
	for _, m := range mutate {
		m(fr)
	}
	Expect(admin.Create(suiteCtx, fr)).To(Succeed())
	return fr
}

func root(s string) string {
	return "sha256:" + strings.Repeat(fmt.Sprintf("%02x", len(s)%256), 32)
}

// request creates a LockGrant as worker `owner`, named after its requestID.
func request(ns, resource, owner, requestID string) *locksv1.LockGrant {
	lg := newGrant(ns, resource, owner, requestID)
	Expect(workers[owner].Create(suiteCtx, lg)).To(Succeed())
	return lg
}

func newGrant(ns, resource, owner, requestID string) *locksv1.LockGrant {
	return &locksv1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: resource + "-" + requestID, Finalizers: []string{locksv1.GrantFinalizer}},
		Spec: locksv1.LockGrantSpec{
			Resource: resource, Owner: owner, RequestID: requestID, Lease: "lease-" + requestID,
			OperationRoot: root(requestID),
		},
	}
}

func getGrant(ns, name string) *locksv1.LockGrant {
	lg := &locksv1.LockGrant{}
	Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name}, lg)).To(Succeed())
	return lg
}

func getFR(ns, name string) *locksv1.FencedResource {
	fr := &locksv1.FencedResource{}
	Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name}, fr)).To(Succeed())
	return fr
}

// waitPhase waits until the LockGrant reaches phase and returns it.
func waitPhase(lg *locksv1.LockGrant, phase locksv1.LockGrantPhase) *locksv1.LockGrant {
	GinkgoHelper()
	var got *locksv1.LockGrant
	Eventually(func() locksv1.LockGrantPhase {
		got = getGrant(lg.Namespace, lg.Name)
		return got.Status.Phase
	}, 20*time.Second, 20*time.Millisecond).Should(Equal(phase), "LockGrant %s", lg.Name)
	return got
}

// consistently asserts that the LockGrant stays in phase for a moment.
func stays(lg *locksv1.LockGrant, phase locksv1.LockGrantPhase) {
	GinkgoHelper()
	Consistently(func() locksv1.LockGrantPhase {
		return getGrant(lg.Namespace, lg.Name).Status.Phase
	}, 500*time.Millisecond, 50*time.Millisecond).Should(Equal(phase), "LockGrant %s", lg.Name)
}

// update re-reads obj and applies mutate until the write succeeds.
func update[T client.Object](c client.Client, obj T, mutate func(T)) error {
	for {
		if err := c.Get(suiteCtx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		mutate(obj)
		err := c.Update(suiteCtx, obj)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

func release(lg *locksv1.LockGrant) {
	GinkgoHelper()
	Expect(update(workers[lg.Spec.Owner], &locksv1.LockGrant{ObjectMeta: lg.ObjectMeta}, func(g *locksv1.LockGrant) { g.Spec.Release = true })).To(Succeed())
}

func renew(lg *locksv1.LockGrant) {
	GinkgoHelper()
	Expect(update(workers[lg.Spec.Owner], &locksv1.LockGrant{ObjectMeta: lg.ObjectMeta}, func(g *locksv1.LockGrant) { g.Spec.Renewals++ })).To(Succeed())
}

// eventReasons lists the reasons of Events about obj.
func eventReasons(ns, name string) []string {
	var list corev1.EventList
	Expect(admin.List(suiteCtx, &list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}

func objectMeta(ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name}
}
