// Package envtest runs fencekeeper against a real kube-apiserver and etcd
// (the binaries hack/build-control-plane.sh builds into bin/k8s), with
// kube-controller-manager's namespace and garbage-collector controllers, so
// namespace teardown takes its real path. The issuer and the webhooks run
// in-process as real, distinct, RBAC-limited users, and workers act through
// their own authenticated clients.
package envtest

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/internal/rules/enrollment"
	"github.com/fencekeeper/fencekeeper/webhooks"
)

const (
	workersGroup = localcp.WorkersGroup
	opNamespace  = locksv1.DefaultNamespace
)

var (
	cp        *localcp.ControlPlane
	testEnv   *envtest.Environment
	adminCfg  *rest.Config
	admin     client.Client
	scheme    *runtime.Scheme
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
	// Decisions are quick, but a takeover or a revocation touches every
	// FencedResource the suite has made so far: wait up to 10 s, not 1 s.
	SetDefaultEventuallyTimeout(10 * time.Second)
	suiteCtx, cancelAll = context.WithCancel(context.Background())

	root, err := localcp.RepoRoot()
	Expect(err).NotTo(HaveOccurred())
	cp, err = localcp.Start(suiteCtx, localcp.Options{
		Root:            root,
		CRDDirs:         []string{filepath.Join(root, "test", "envtest", "testdata")},
		ProtectedKinds:  suiteKinds,
		EnvtestWebhooks: true,
		// Its namespace controller empties deleted namespaces through the
		// webhooks as system:serviceaccount:kube-system:namespace-controller.
		ControllerManager: true,
	})
	Expect(err).NotTo(HaveOccurred())
	testEnv, adminCfg, opCfg, scheme = cp.Env, cp.Admin, cp.Operator, cp.Scheme
	admin, err = client.New(adminCfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	for _, name := range []string{"worker-a", "worker-b", "worker-c", "worker-d", "worker-e"} {
		u, err := cp.AddUser(name, workersGroup)
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
	if cp != nil {
		Expect(cp.Stop()).To(Succeed())
	}
})

// startWebhookServer serves the admission webhooks for the whole suite, as the
// operator user, in a manager of its own: in a deployment every replica serves
// webhooks while only the leader issues, so specs can stop and restart issuers.
func startWebhookServer() {
	o := testEnv.WebhookInstallOptions
	mgr, err := ctrl.NewManager(opCfg, ctrl.Options{
		Scheme:  scheme,
		Cache:   controllers.CacheOptions(opNamespace, nil),
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: o.LocalServingHost, Port: o.LocalServingPort, CertDir: o.LocalServingCertDir,
		}),
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(webhooks.SetupLockGrantWebhook(mgr, opNamespace)).To(Succeed())
	Expect(webhooks.SetupFencedResourceWebhook(mgr, locksv1.WebhookConfigurationName, opNamespace, enrollment.NewExemptions(opNamespace, nil))).To(Succeed())
	_, err = webhooks.SetupProtectedWebhook(mgr, opNamespace, issuerClock)
	Expect(err).NotTo(HaveOccurred())
	mgr.GetWebhookServer().Register(holdPath, &webhook.Admission{Handler: holds})
	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(suiteCtx)).To(Succeed())
	}()
	Eventually(func() error { return mgr.GetWebhookServer().StartedChecker()(nil) }).Should(Succeed())
}

// operator is one running issuer (a manager with its own cache).
type operator struct {
	issuer *controllers.IssuerIdentity
	// cached reads through the manager's cache, as its controllers do.
	cached  client.Reader
	clock   *clocktesting.FakeClock
	cancel  context.CancelFunc
	done    sync.WaitGroup
	stopped atomic.Bool
}

func startOperator(name string, clk *clocktesting.FakeClock, opts controllers.Options) *operator {
	opts.CreationVersions = controllers.NewCreationVersions() // as internal/operator wires it
	mgr, err := ctrl.NewManager(opCfg, ctrl.Options{
		Scheme:  scheme,
		Cache:   controllers.CacheOptions(opNamespace, opts.CreationVersions),
		Metrics: metricsserver.Options{BindAddress: "0"},
		// Leader election is off: specs start several issuers on purpose.
	})
	Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(suiteCtx)
	opts.Namespace, opts.Clock, opts.InstanceName = opNamespace, clk, name
	issuer, err := controllers.Setup(ctx, mgr, opts)
	Expect(err).NotTo(HaveOccurred())
	op := &operator{issuer: issuer, cached: mgr.GetClient(), clock: clk, cancel: cancel}
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
	o.stopped.Store(true)
	o.cancel()
	o.done.Wait()
}

// A spec that stops the primary issuer and fails before it starts another
// must not leave every later spec without one.
var _ = AfterEach(func() {
	if primary != nil && primary.stopped.Load() {
		primary = startOperator("primary-restarted", issuerClock, controllers.Options{})
	}
})

// step advances the issuer's clock and makes it look at every resource again
// (in production time passes and requeues fire; here time is ours).
func (o *operator) step(d time.Duration) {
	o.clock.Step(d)
	o.issuer.ResyncAll()
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
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: locksv1.LockGrantName(resource, owner, requestID)},
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
func update[T client.Object](c client.Client, obj T, mutate func(T), opts ...client.UpdateOption) error {
	for {
		if err := c.Get(suiteCtx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		mutate(obj)
		err := c.Update(suiteCtx, obj, opts...)
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
