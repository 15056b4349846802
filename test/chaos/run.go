package chaos

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// Config is one chaos run: Schedules seeded schedules on one replicated
// control plane, each Length long with its own namespace and workers.
type Config struct {
	Root, Dir string
	Bins      Binaries
	Broken    BrokenRules
	// Seed of the first schedule; schedule i plays Seed+i.
	Seed      uint64
	Schedules int
	Length    time.Duration
	// Workers; the last two are adversaries, one on each API server (so
	// one always reaches a webhook replica cut off from the other).
	Workers int
	// Faults the nemesis draws from (default: every kind).
	Faults []string
	// NetID picks the subnet 10.77.<NetID>.0/24 and the interface names.
	NetID int
	Out   io.Writer
}

// resources each schedule protects: three ConfigMaps and a Widget.
var resources = []string{"cm-0", "cm-1", "cm-2", "wd-0"}

// Run plays the schedules and checks each; the report counts violations.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Workers < 3 {
		cfg.Workers = 3
	}
	start := time.Now()
	c, err := startCluster(ctx, cfg.Root, cfg.Dir, cfg.NetID, cfg.Workers, cfg.Bins, cfg.Broken)
	if err != nil {
		return nil, err
	}
	defer c.Stop()
	fmt.Fprintf(cfg.Out, "control plane up in %v: 3 etcd members, 2 kube-apiservers, 2 operators, %d workers, a PostgreSQL store, each in its own network namespace (10.77.%d.0/24)\n",
		time.Since(start).Round(time.Second), cfg.Workers, cfg.NetID)
	var users []*user
	for i := 0; i < cfg.Workers; i++ {
		u, err := c.pki.user(c.dir, fmt.Sprintf("system:serviceaccount:chaos:worker-%d", i+1), []string{localcp.WorkersGroup}, c.servers)
		if err != nil {
			return nil, err
		}
		users = append(users, u)
	}
	report := &Report{Broken: cfg.Broken}
	for i := 0; i < cfg.Schedules && ctx.Err() == nil; i++ {
		seed := cfg.Seed + uint64(i)
		s, err := c.schedule(ctx, cfg, seed, users)
		if err != nil {
			return report, fmt.Errorf("schedule %d: %w", seed, err)
		}
		s.print(cfg.Out)
		report.add(s)
	}
	if ctx.Err() != nil {
		// An interrupted run is not a passing one, whatever it saw so far.
		return report, fmt.Errorf("interrupted after %d of %d schedules: %w", report.Schedules, cfg.Schedules, ctx.Err())
	}
	report.print(cfg.Out)
	return report, nil
}

// schedule plays one seed: workers on a fresh namespace, the nemesis, a
// quiet recovery, then the checker.
func (c *Cluster) schedule(ctx context.Context, cfg Config, seed uint64, users []*user) (*scheduleResult, error) {
	ns := fmt.Sprintf("chaos-%d", seed)
	if err := c.restore(ctx); err != nil {
		return nil, err
	}
	if err := c.createResources(ctx, ns); err != nil {
		return nil, err
	}
	obs := newObserver(c, ns)
	octx, stopObs := context.WithCancel(ctx)
	defer stopObs()
	go obs.run(octx)

	eventsDir := filepath.Join(c.dir, ns)
	if err := os.MkdirAll(eventsDir, 0o700); err != nil {
		return nil, err
	}
	workers, err := c.startWorkers(ns, eventsDir, seed, users)
	defer func() { // on every way out, interrupted or not
		for _, w := range workers {
			w.kill()
		}
	}()
	if err != nil {
		return nil, err
	}
	kinds := cfg.Faults
	if len(kinds) == 0 {
		kinds = faultKinds
	}
	faults := plan(seed, cfg.Length, kinds)
	fmt.Fprintf(cfg.Out, "\n== schedule seed=%d (%d faults over %v)\n", seed, len(faults), cfg.Length)
	begin := time.Now()
	c.play(ctx, seed, begin, faults, workers)
	sleepUntil(ctx, begin.Add(cfg.Length))
	// Recovery: everything healed and running, workers go on for a while
	// (each finishes or resolves what the faults left open), then stop.
	if err := c.restore(ctx); err != nil {
		return nil, err
	}
	for _, w := range workers {
		if !w.running() {
			_ = w.start()
		}
	}
	_ = ctxtime.Sleep(ctx, 12*time.Second)
	for _, w := range workers {
		w.stop(40 * time.Second)
	}
	_ = ctxtime.Sleep(ctx, 2*time.Second) // the observer sees the last releases
	stopObs()
	res, err := c.check(ctx, ns, eventsDir, obs, faults)
	if err != nil {
		return nil, err
	}
	res.seed = seed
	return res, nil
}

// startWorkers starts one worker per user on its node; the last two are adversaries.
func (c *Cluster) startWorkers(ns, eventsDir string, seed uint64, users []*user) ([]*proc, error) {
	var workers []*proc
	for i, u := range users {
		name := fmt.Sprintf("worker-%d", i+1)
		argv := []string{c.bins.Self, "worker", "-name=" + name, "-kubeconfig=" + u.kubeconfigs[i%2], "-namespace=" + ns,
			"-resources=" + strings.Join(resources, ","), "-events=" + filepath.Join(eventsDir, name+".jsonl"), "-seed=" + strconv.FormatUint(seed*100+uint64(i), 10),
			"-store-dsn=" + c.store.tcpDSN(storeWorker, c.store.workerPassword)}
		if i >= len(users)-2 {
			argv = append(argv, "-adversary")
		}
		p := &proc{name: name, node: c.workerNodes[i], logPath: filepath.Join(eventsDir, name+".log"), argv: argv}
		if err := p.start(); err != nil {
			return workers, err
		}
		workers = append(workers, p)
	}
	return workers, nil
}

// play applies the faults on their schedule, healing each when it ends.
func (c *Cluster) play(ctx context.Context, seed uint64, begin time.Time, faults []fault, workers []*proc) {
	for i := range faults {
		f := &faults[i]
		if !sleepUntil(ctx, begin.Add(f.Start)) {
			return
		}
		f.at = time.Now()
		heal, err := c.apply(f, workers)
		if err != nil {
			f.applyErr = err.Error()
		}
		c.logf("seed %d: %s", seed, f)
		sleepUntil(ctx, f.at.Add(f.Length))
		heal()
		f.healed = time.Now()
	}
}

// restore heals the network, resets clocks, resumes and restarts every
// control-plane process, and waits until both API servers answer.
func (c *Cluster) restore(ctx context.Context) error {
	if err := c.net.heal(); err != nil {
		return err
	}
	for _, f := range c.skewFiles {
		_ = os.WriteFile(f, []byte("0s"), 0o600)
	}
	for _, group := range [][]*proc{c.etcd, c.apis, c.fronts, c.ops} {
		for _, p := range group {
			p.signal(syscall.SIGCONT)
			if !p.running() {
				if err := p.start(); err != nil {
					return err
				}
			}
		}
	}
	if err := c.store.restart(ctx); err != nil {
		return err
	}
	return c.waitAPIServers(ctx)
}

func (c *Cluster) createResources(ctx context.Context, ns string) error {
	admin, err := c.adminClient(0)
	if err != nil {
		return err
	}
	if err := c.createStoreTables(ctx, ns); err != nil {
		return err
	}
	// Every resource names the store: each claim commits to it, so each
	// store fault meets commits on all four, and each hand-off is published.
	objs := []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: storeSecret},
			StringData: map[string]string{"dsn": c.store.tcpDSN(storeOperator, c.store.operatorPassword)}}}
	stores := []locksv1.StoreReference{{Name: storeSecret, SecretRef: locksv1.StoreSecretReference{Name: storeSecret}}}
	for _, r := range resources {
		target := &locksv1.ObjectTarget{APIVersion: "v1", Kind: "ConfigMap", Name: r}
		if isWidget(r) {
			target = &locksv1.ObjectTarget{APIVersion: "example.com/v1", Kind: "Widget", Name: r}
		}
		objs = append(objs, &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: r}, Spec: locksv1.FencedResourceSpec{
			ResourceID: ns + "/" + r, LeaseDurationSeconds: 5, Enforcement: locksv1.EnforcementEnforce, Target: target, Stores: stores,
		}})
	}
	for _, o := range objs {
		o := o
		// The operators may still be settling after the last schedule's faults.
		if err := poll(ctx, 60*time.Second, "create "+o.GetName(), func() error { return client.IgnoreAlreadyExists(admin.Create(ctx, o)) }); err != nil {
			return err
		}
	}
	return nil
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(time.Until(t)):
		return true
	}
}

// observer follows the namespace's FencedResources through both API
// servers and keeps, per resource, when each fence was first seen issued:
// a write sent after that moment with a lower fence must be denied by a
// linearizable registry read, whatever the timing.
type observer struct {
	c  *Cluster
	ns string

	mu    sync.Mutex
	first map[string]map[int64]time.Time // resource -> fenceToken -> first seen
	// seen: per API server, the protected objects' versions as its watch
	// delivered them, in order.
	seen [2][]watched
}

// watched is one object version a watch delivered.
type watched struct {
	name  string
	rev   int64
	value registerValue
}

func newObserver(c *Cluster, ns string) *observer {
	return &observer{c: c, ns: ns, first: map[string]map[int64]time.Time{}}
}

func (o *observer) run(ctx context.Context) {
	for i := range o.c.apis {
		go o.follow(ctx, i, locksv1.GroupVersion.WithKind("FencedResourceList"), func(u *unstructured.Unstructured) { o.see(u) })
		for _, gvk := range []schema.GroupVersionKind{{Version: "v1", Kind: "ConfigMapList"}, {Group: "example.com", Version: "v1", Kind: "WidgetList"}} {
			go o.follow(ctx, i, gvk, func(u *unstructured.Unstructured) { o.record(i, u) })
		}
	}
	<-ctx.Done()
}

// follow lists and then watches the namespace's objects of kind gvk through
// API server api, handing each version delivered to each (relisting after a
// broken watch, as informers do).
func (o *observer) follow(ctx context.Context, api int, gvk schema.GroupVersionKind, each func(*unstructured.Unstructured)) {
	for ctx.Err() == nil {
		cl, err := o.c.adminClient(api)
		if err != nil {
			return
		}
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk)
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = cl.List(lctx, list, client.InNamespace(o.ns))
		cancel()
		if err != nil {
			_ = ctxtime.Sleep(ctx, 200*time.Millisecond)
			continue
		}
		for i := range list.Items {
			each(&list.Items[i])
		}
		wl := &unstructured.UnstructuredList{}
		wl.SetGroupVersionKind(gvk)
		w, err := cl.Watch(ctx, wl, client.InNamespace(o.ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}})
		if err != nil {
			_ = ctxtime.Sleep(ctx, 200*time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			if u, ok := ev.Object.(*unstructured.Unstructured); ok && ev.Type != "DELETED" && ev.Type != "ERROR" {
				each(u)
			}
		}
		w.Stop()
	}
}

func (o *observer) record(api int, u *unstructured.Unstructured) {
	rev, err := strconv.ParseInt(u.GetResourceVersion(), 10, 64)
	if err != nil {
		return
	}
	e, _ := parseEnvelope(u.GetAnnotations()[fence.AnnotationFence])
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen[api] = append(o.seen[api], watched{name: u.GetName(), rev: rev, value: registerValue{Fence: e.Grant.FenceToken, Req: e.Grant.RequestID, Segment: e.Segment}})
}

func (o *observer) see(fr *unstructured.Unstructured) {
	now := time.Now()
	token, _, _ := unstructured.NestedInt64(fr.Object, "status", "fenceToken")
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.first[fr.GetName()]
	if m == nil {
		m = map[int64]time.Time{}
		o.first[fr.GetName()] = m
	}
	if _, seen := m[token]; !seen {
		m[token] = now
	}
}

// supersededBefore: a fence above f was seen issued for res before t.
func (o *observer) supersededBefore(res string, f int64, t time.Time) (int64, time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for fence, at := range o.first[res] {
		if fence > f && at.Before(t) {
			return fence, at, true
		}
	}
	return 0, time.Time{}, false
}
