package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// The tenant: its own user, with the requester role and ConfigMap write and
// FencedResource admin in its own namespace, and the requester role in the
// honest namespace (it may request the honest lock, as any authenticated
// user may by the lock's policy). Its FencedResources:
//   - tenantQueue and tenantRecords: their head is the tenant's own grant,
//     held for an hour, so every other grant queued there stays Pending (the
//     big-annotation grants and the garbage unresolved-mutation records);
//   - tenantOdd: a 1 s lease; the odd-field requests go there and the tenant
//     releases each one as soon as it is held.
//
// Its grants on the honest lock are released the moment they are held: a
// tenant that holds a lock it may request is served, not starving anyone.
const (
	tenantQueue   = "h-queue"
	tenantRecords = "h-rec"
	tenantOdd     = "h-odd"
	// padKey is the annotation the big grants carry.
	padKey = "tenant.example/padding"
	// recordGrants is how many Pending grants carry the garbage records.
	recordGrants = 16
)

type tenantSide struct {
	user string
	cfg  *rest.Config
	kube client.WithWatch
	http *http.Client
	// locks holds the anchors: the tenant's held heads of tenantQueue and tenantRecords.
	locks   []*lockclient.Lock
	anchors map[string]bool
	pad     string
	release chan heldGrant
	rec     *soakRecorder

	mu sync.Mutex
	// created lists every object the tenant created (for cleanup), by
	// kind/namespace/name.
	created map[string]createdObject
	// served are the tenant's grants the registry named as holder.
	served      map[string]bool
	lastClaimAt time.Time
	res         tenantResult
}

type createdObject struct {
	lockGrant bool
	key       types.NamespacedName
}

// heldGrant is a grant of the tenant's the registry named holder.
type heldGrant struct {
	ns, name string
	fence    int64
}

func createdKey(lockGrant bool, ns, name string) string {
	if lockGrant {
		return "LockGrant/" + ns + "/" + name
	}
	return "FencedResource/" + ns + "/" + name
}

func (t *tenantSide) remember(lockGrant bool, ns, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rememberLocked(lockGrant, ns, name)
}

func (t *tenantSide) rememberLocked(lockGrant bool, ns, name string) {
	t.created[createdKey(lockGrant, ns, name)] = createdObject{lockGrant: lockGrant, key: types.NamespacedName{Namespace: ns, Name: name}}
}

func (t *tenantSide) forget(lockGrant bool, ns, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.created, createdKey(lockGrant, ns, name))
}

// setupTenant creates the tenant's user, RBAC, namespace, FencedResources
// and anchors, probes the annotation budget and starts its releaser.
func (s *soakRun) setupTenant(ctx context.Context) (*tenantSide, error) {
	e := s.e
	if err := e.ensureClusterRole(ctx, "fencedresource_admin_role.yaml"); err != nil {
		return nil, err
	}
	cfg, user, err := e.user("tenant")
	if err != nil {
		return nil, err
	}
	t := &tenantSide{user: user, cfg: cfg, anchors: map[string]bool{}, release: make(chan heldGrant, 1024), rec: s.rec,
		created: map[string]createdObject{}, served: map[string]bool{}}
	t.res.init()
	if err := e.namespace(ctx, soakTenantNS); err != nil {
		return nil, err
	}
	subject := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}
	for _, b := range []*rbacv1.RoleBinding{
		roleBinding(soakTenantNS, "tenant-requester", "lockgrant-requester", subject),
		roleBinding(soakTenantNS, "tenant-writer", "protected-object-writer", subject),
		roleBinding(soakTenantNS, "tenant-fr-admin", "fencedresource-admin", subject),
		roleBinding(soakHonestNS, "tenant-requester", "lockgrant-requester", subject),
	} {
		if err := e.admin.Create(ctx, b); err != nil {
			return nil, err
		}
	}
	if t.kube, err = client.NewWithWatch(cfg, client.Options{Scheme: locksv1.Scheme}); err != nil {
		return nil, err
	}
	if t.http, err = rest.HTTPClientFor(cfg); err != nil {
		return nil, err
	}
	if err := t.setupEntries(ctx); err != nil {
		return nil, err
	}
	t.probeAnnotation(ctx)
	go t.releaser(ctx)
	if err := e.observeEntries(ctx, soakHonestNS, func(fr *locksv1.FencedResource) {
		if fr.Name == soakLock {
			s.rec.observe(fr, t.user, time.Now())
			t.noteHolder(fr)
		}
	}); err != nil {
		return nil, err
	}
	return t, e.observeEntries(ctx, soakTenantNS, t.noteHolder)
}

// ensureClusterRole creates a ClusterRole of config/rbac unless it exists
// (the local control plane installs only the requester's and writer's).
func (e *env) ensureClusterRole(ctx context.Context, file string) error {
	objs, err := localcp.LoadObjects(locksv1.Scheme, filepath.Join(e.cp.Root(), "config", "rbac", file))
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if err := e.admin.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// setupEntries creates the tenant's FencedResources (as the tenant: RBAC
// bindings take a moment to reach the authorizer, so Forbidden is retried)
// and takes the anchors.
func (t *tenantSide) setupEntries(ctx context.Context) error {
	for _, fr := range []struct {
		name  string
		lease int32
	}{{tenantQueue, 3600}, {tenantRecords, 3600}, {tenantOdd, 1}} {
		obj := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: soakTenantNS, Name: fr.name},
			Spec: locksv1.FencedResourceSpec{ResourceID: soakTenantNS + "/" + fr.name, LeaseDurationSeconds: fr.lease, Enforcement: locksv1.EnforcementEnforce}}
		if err := retryForbidden(ctx, func() error { return t.kube.Create(ctx, obj) }); err != nil {
			return fmt.Errorf("create FencedResource %s as the tenant: %w", fr.name, err)
		}
		t.remember(false, soakTenantNS, fr.name)
	}
	locks, err := lockclient.NewForConfig(ctx, t.cfg, soakTenantNS)
	if err != nil {
		return err
	}
	for _, name := range []string{tenantQueue, tenantRecords} {
		l, err := locks.Acquire(ctx, name, lockclient.AcquireOptions{RequestID: "anchor"})
		if err != nil {
			return fmt.Errorf("anchor %s: %w", name, err)
		}
		t.locks = append(t.locks, l)
		t.anchors[l.Name()] = true
		t.remember(true, soakTenantNS, l.Name())
	}
	return nil
}

func retryForbidden(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := f()
		if err == nil || !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			return err
		}
		if err := ctxtime.Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// noteHolder records the tenant's grants the registry holds and queues
// every one but an anchor for release.
func (t *tenantSide) noteHolder(fr *locksv1.FencedResource) {
	h := fr.Status.Holder
	if h == nil || h.Owner != t.user {
		return
	}
	t.mu.Lock()
	first := !t.served[h.GrantName]
	t.served[h.GrantName] = true
	if first && fr.Namespace == soakHonestNS {
		t.res.ServedOnHonest++
	}
	t.mu.Unlock()
	if first && !t.anchors[h.GrantName] {
		t.release <- heldGrant{fr.Namespace, h.GrantName, h.FenceToken}
	}
}

func (t *tenantSide) wasServed(name string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.served[name]
}

// releaser releases the tenant's held grants as they come (spec.release,
// as the owner: the webhook is not called).
func (t *tenantSide) releaser(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case held := <-t.release:
			lg := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: held.ns, Name: held.name}}
			if held.ns == soakHonestNS {
				t.rec.released(held.fence, time.Now(), true)
			}
			err := t.kube.Patch(ctx, lg, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"release":true}}`)))
			if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
				t.mu.Lock()
				t.res.ReleaseFailures++
				t.mu.Unlock()
			}
		}
	}
}

// probeAnnotation finds the largest annotation a LockGrant may carry, by
// dry-run creates: the API server's limit (256 KiB for all annotations,
// keys included) first, halved on refusal, then bisected between the
// largest admitted and the smallest refused size to within 1 KiB.
func (t *tenantSide) probeAnnotation(ctx context.Context) {
	p := &t.res.Annotation
	admitted, refused := 0, -1
	size := 256<<10 - len(padKey)
	for i := 0; i < 24 && size > 0; i++ {
		lg := t.bigGrant(soakTenantNS, tenantQueue, fmt.Sprintf("probe-%d", i), padding(size))
		err := t.kube.Create(ctx, lg, client.DryRunAll)
		p.Probes = append(p.Probes, annotationTry{Bytes: size, Admitted: err == nil})
		if err == nil {
			admitted = size
		} else {
			refused = size
			if p.Refusal == "" {
				p.Refusal = shorten(err.Error(), 300)
			}
		}
		switch {
		case admitted == 0:
			size /= 2
		case refused < 0 || refused-admitted <= 1024:
			size = 0
		default:
			size = (admitted + refused) / 2
		}
	}
	p.LargestAdmitted = admitted
	t.pad = padding(admitted)
}

// padding is n bytes of two-byte characters (one ASCII byte when n is odd).
func padding(n int) string {
	return strings.Repeat("ü", n/2) + strings.Repeat("x", n%2)
}

// bigGrant is a LockGrant of the tenant's carrying annotation value pad.
func (t *tenantSide) bigGrant(ns, resource, requestID, pad string) *locksv1.LockGrant {
	lg := t.grant(ns, resource, requestID)
	if pad != "" {
		lg.Annotations = map[string]string{padKey: pad}
	}
	return lg
}

// grant is a well-formed LockGrant of the tenant's.
func (t *tenantSide) grant(ns, resource, requestID string) *locksv1.LockGrant {
	return &locksv1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: locksv1.LockGrantName(resource, t.user, requestID)},
		Spec: locksv1.LockGrantSpec{Resource: resource, Owner: t.user, RequestID: requestID, Lease: "tenant-" + requestID,
			OperationRoot: lockclient.OperationRoot(resource + "/" + requestID)},
	}
}

// drivers are the tenant's running attacks.
type drivers struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (d *drivers) stop() { d.cancel() }
func (d *drivers) wait() { d.cancel(); d.wg.Wait() }

func (d *drivers) run(ctx context.Context, f func(context.Context)) {
	d.wg.Add(1)
	go func() { defer d.wg.Done(); f(ctx) }()
}

// start launches every attack; each acts only while s.hostile is open.
func (t *tenantSide) start(ctx context.Context, s *soakRun) *drivers {
	ctx, cancel := context.WithCancel(ctx)
	d := &drivers{cancel: cancel}
	every := s.cfg.duration / time.Duration(max(1, s.cfg.bigGrants))
	g := &s.hostile
	rep := &replica{kube: s.honest.replica, identity: s.honest.identity, tenant: t}
	for name, f := range map[string]func(context.Context){
		attackBig:       func(ctx context.Context) { t.bigGrants(ctx, g, s.cfg.bigGrants, every) },
		attackBigHonest: func(ctx context.Context) { paced(ctx, g, time.Second, t.bigOnHonestLock) },
		attackRecords:   func(ctx context.Context) { t.records(ctx, g) },
		attackChurn:     func(ctx context.Context) { t.churn(ctx, g) },
		attackSquat:     func(ctx context.Context) { paced(ctx, g, 250*time.Millisecond, t.squat) },
		attackOdd:       func(ctx context.Context) { t.odd(ctx, g) },
		attackReplica:   func(ctx context.Context) { paced(ctx, g, 250*time.Millisecond, rep.attempt) },
	} {
		if s.cfg.runs(name) {
			d.run(ctx, f)
		}
	}
	return d
}

// bigGrants queues n big-annotation grants behind the tenant's anchor, one
// every interval of hostile time.
func (t *tenantSide) bigGrants(ctx context.Context, g *gate, n int, every time.Duration) {
	i := 0
	paced(ctx, g, every, func(ctx context.Context) {
		if i >= n {
			return
		}
		i++
		t.createBig(ctx, soakTenantNS, tenantQueue, fmt.Sprintf("big-%d", i), &t.res.BigGrants)
	})
}

// bigOnHonestLock queues a big-annotation grant on the honest lock.
func (t *tenantSide) bigOnHonestLock(ctx context.Context) {
	t.mu.Lock()
	i := t.res.BigOnHonest.Attempts + 1
	t.mu.Unlock()
	t.createBig(ctx, soakHonestNS, soakLock, fmt.Sprintf("big-%d", i), &t.res.BigOnHonest)
}

func (t *tenantSide) createBig(ctx context.Context, ns, resource, id string, c *admissionCount) {
	lg := t.bigGrant(ns, resource, id, t.pad)
	err := t.kube.Create(ctx, lg)
	if ctx.Err() != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c.count(err)
	if err == nil {
		t.rememberLocked(true, ns, lg.Name)
	}
}

// churn creates FencedResources whose targets name missing ConfigMaps and
// deletes each a second later: every create claims its target with a Lease
// in the operator's namespace.
func (t *tenantSide) churn(ctx context.Context, g *gate) {
	type live struct {
		name string
		at   time.Time
	}
	var queue []live
	n := 0
	paced(ctx, g, 400*time.Millisecond, func(ctx context.Context) {
		for len(queue) > 0 && time.Since(queue[0].at) > time.Second && ctx.Err() == nil {
			t.deleteEntry(ctx, queue[0].name, &t.res.Churn)
			queue = queue[1:]
		}
		n++
		name := fmt.Sprintf("churn-%d", n)
		fr := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: soakTenantNS, Name: name},
			Spec: locksv1.FencedResourceSpec{ResourceID: soakTenantNS + "/" + name, LeaseDurationSeconds: 10, Enforcement: locksv1.EnforcementEnforce,
				Target: &locksv1.ObjectTarget{APIVersion: "v1", Kind: "ConfigMap", Name: fmt.Sprintf("missing-%d", n)}}}
		err := t.kube.Create(ctx, fr)
		if ctx.Err() != nil {
			return
		}
		t.mu.Lock()
		t.res.Churn.Created.count(err)
		if err == nil {
			t.lastClaimAt = time.Now()
			t.rememberLocked(false, soakTenantNS, name)
		}
		t.mu.Unlock()
		if err == nil {
			queue = append(queue, live{name, time.Now()})
		}
	})
	for _, l := range queue {
		t.deleteEntry(context.WithoutCancel(ctx), l.name, &t.res.Churn)
	}
}

func (t *tenantSide) deleteEntry(ctx context.Context, name string, c *churnResult) {
	err := t.kube.Delete(ctx, &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: soakTenantNS, Name: name}})
	if ctx.Err() != nil {
		return // cleanup deletes it
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c.Deleted.count(client.IgnoreNotFound(err))
	if err == nil || apierrors.IsNotFound(err) {
		delete(t.created, createdKey(false, soakTenantNS, name))
	}
}

// honestRequestID matches the honest workers' requestIDs.
var honestRequestID = regexp.MustCompile(`^soak-w(\d+)-(\d+)$`)

// squat reads the honest lock's holder (its requestID says the worker and
// its count) and takes the next requestIDs of that worker before it asks.
func (t *tenantSide) squat(ctx context.Context) {
	var fr locksv1.FencedResource
	if err := t.kube.Get(ctx, types.NamespacedName{Namespace: soakHonestNS, Name: soakLock}, &fr); err != nil || fr.Status.Holder == nil {
		return
	}
	m := honestRequestID.FindStringSubmatch(fr.Status.Holder.RequestID)
	if m == nil {
		return
	}
	worker, _ := strconv.Atoi(m[1])
	n, _ := strconv.Atoi(m[2])
	// Only this goroutine squats: squatUpTo needs no lock.
	from := max(n+2, t.res.squatUpTo[worker]+1)
	if from > n+4 {
		return
	}
	t.res.squatUpTo[worker] = n + 4
	for k := from; k <= n+4; k++ {
		lg := t.grant(soakHonestNS, soakLock, fmt.Sprintf("soak-w%d-%d", worker, k))
		err := t.kube.Create(ctx, lg)
		t.mu.Lock()
		switch {
		case err == nil:
			t.res.Squats.Taken++
			t.rememberLocked(true, soakHonestNS, lg.Name)
		case apierrors.IsAlreadyExists(err):
			t.res.Squats.Late++
		default:
			t.res.Squats.Refused++
			if t.res.Squats.Refusal == "" {
				t.res.Squats.Refusal = shorten(err.Error(), 300)
			}
		}
		t.mu.Unlock()
	}
}

// cleanup deletes every object the tenant created, LockGrants first, and
// waits until they are gone (the operator releases held ones and drops
// their finalizer).
func (t *tenantSide) cleanup(ctx context.Context, e *env) error {
	for _, l := range t.locks {
		l.Orphan()
	}
	t.mu.Lock()
	var grants, entries []types.NamespacedName
	for _, o := range t.created {
		if o.lockGrant {
			grants = append(grants, o.key)
		} else {
			entries = append(entries, o.key)
		}
	}
	t.mu.Unlock()
	if err := t.deleteAll(ctx, e, grants, true); err != nil {
		return err
	}
	return t.deleteAll(ctx, e, entries, false)
}

// deleteAll deletes the objects as the tenant, eight at a time, and waits
// up to two minutes until all are gone.
func (t *tenantSide) deleteAll(ctx context.Context, e *env, keys []types.NamespacedName, lockGrants bool) error {
	kind := locksv1.GroupVersion.WithKind("FencedResource")
	if lockGrants {
		kind = locksv1.GroupVersion.WithKind("LockGrant")
	}
	work := make(chan types.NamespacedName)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range work {
				m := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}
				m.SetGroupVersionKind(kind)
				if err := t.kube.Delete(ctx, m); client.IgnoreNotFound(err) != nil {
					t.cleanupError(fmt.Sprintf("delete %s %s: %v", kind.Kind, k, err))
				}
			}
		}()
	}
	for _, k := range keys {
		work <- k
	}
	close(work)
	wg.Wait()
	deadline := time.Now().Add(2 * time.Minute)
	for len(keys) > 0 && ctx.Err() == nil {
		left, err := remaining(ctx, e, kind, keys)
		if err == nil {
			keys = left
		}
		if len(keys) == 0 || time.Now().After(deadline) {
			break
		}
		_ = ctxtime.Sleep(ctx, 500*time.Millisecond)
	}
	t.mu.Lock()
	t.res.LeftAfterCleanup += len(keys)
	t.mu.Unlock()
	return ctx.Err()
}

func (t *tenantSide) cleanupError(msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.res.CleanupErrors) < 5 {
		t.res.CleanupErrors = append(t.res.CleanupErrors, shorten(msg, 200))
	}
}

// remaining lists which of keys still exist, by a metadata-only list of
// their namespaces (the big grants' bodies stay on the server).
func remaining(ctx context.Context, e *env, kind schema.GroupVersionKind, keys []types.NamespacedName) ([]types.NamespacedName, error) {
	exists := map[types.NamespacedName]bool{}
	for _, ns := range []string{soakHonestNS, soakTenantNS} {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(kind.GroupVersion().WithKind(kind.Kind + "List"))
		if err := e.admin.List(ctx, list, client.InNamespace(ns)); err != nil {
			return nil, err
		}
		for _, m := range list.Items {
			exists[types.NamespacedName{Namespace: m.Namespace, Name: m.Name}] = true
		}
	}
	var left []types.NamespacedName
	for _, k := range keys {
		if exists[k] {
			left = append(left, k)
		}
	}
	return left, nil
}
