package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// The honest side: a ServiceAccount whose four worker pods hand one lock
// around (FencedResource soakLock, open to any authenticated user, as by
// default) and each write its ConfigMap target once per hold, with
// predictable requestIDs (soak-w<worker>-<n>), as a worker that persists
// its next requestID would. A fifth pod of the same ServiceAccount is the
// tenant's foothold: the "replica" (soak_replica.go).
const (
	soakHonestNS   = "soak-honest"
	soakTenantNS   = "soak-tenant"
	soakLock       = "soak-lock"
	soakData       = "soak-data"
	soakSA         = "soak-worker"
	soakWorkers    = 4
	soakLockLease  = 30
	soakReplicaPod = "soak-replica"
)

type honestSide struct {
	ns, identity string
	workers      []*lockclient.Client
	// replica is a client of the fifth pod of the workers' ServiceAccount.
	replica client.Client
}

// setupHonest creates the honest namespace, ServiceAccount, pods and the
// lock, and one lockclient per worker pod built from the pod's bound token.
func (s *soakRun) setupHonest(ctx context.Context) (*honestSide, error) {
	e, ns := s.e, soakHonestNS
	if err := e.namespace(ctx, ns); err != nil {
		return nil, err
	}
	objs := []client.Object{&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: soakSA}}}
	sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: soakSA, Namespace: ns}
	for _, role := range []string{"lockgrant-requester", "protected-object-writer"} {
		objs = append(objs, roleBinding(ns, soakSA+"-"+role, role, sa))
	}
	for _, obj := range objs {
		if err := e.admin.Create(ctx, obj); err != nil {
			return nil, err
		}
	}
	if err := e.fencedResource(ctx, ns, soakLock, soakLockLease, soakData); err != nil {
		return nil, err
	}
	h := &honestSide{ns: ns, identity: "system:serviceaccount:" + ns + ":" + soakSA}
	for i := 0; i < soakWorkers; i++ {
		cfg, err := s.podToken(ctx, ns, fmt.Sprintf("soak-worker-%d", i))
		if err != nil {
			return nil, err
		}
		c, err := lockclient.NewForConfig(ctx, cfg, ns)
		if err != nil {
			return nil, err
		}
		if c.Pod() == "" || c.Identity() != h.identity {
			return nil, fmt.Errorf("worker %d is %q from pod %q: the API server did not bind its token to its pod", i, c.Identity(), c.Pod())
		}
		h.workers = append(h.workers, c)
	}
	cfg, err := s.podToken(ctx, ns, soakReplicaPod)
	if err != nil {
		return nil, err
	}
	if h.replica, err = client.New(cfg, client.Options{Scheme: locksv1.Scheme}); err != nil {
		return nil, err
	}
	return h, nil
}

func roleBinding(ns, name, clusterRole string, subject rbacv1.Subject) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects: []rbacv1.Subject{subject}}
}

// podToken creates pod name of the workers' ServiceAccount (no kubelet runs
// it: it only has to exist) and returns a REST config with a token bound to
// it by the TokenRequest API, which the API server authenticates with the
// pod's UID in the user's extra.
func (s *soakRun) podToken(ctx context.Context, ns, name string) (*rest.Config, error) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{ServiceAccountName: soakSA,
		AutomountServiceAccountToken: ptr.To(false), Containers: []corev1.Container{{Name: "worker", Image: "worker"}}}}
	if err := s.e.admin.Create(ctx, pod); err != nil {
		return nil, err
	}
	tr, err := s.e.adminC.CoreV1().ServiceAccounts(ns).CreateToken(ctx, soakSA, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](4 * 3600),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for pod %s: %w", name, err)
	}
	cfg := rest.AnonymousClientConfig(s.e.cp.Admin)
	cfg.BearerToken = tr.Status.Token
	cfg.QPS, cfg.Burst = -1, 0
	return cfg, nil
}

// run starts the workers; the channel closes once all stopped (ctx ended).
func (h *honestSide) run(ctx context.Context, rec *soakRecorder) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range h.workers {
		wg.Add(1)
		go func() { defer wg.Done(); h.work(ctx, i, c, rec) }()
	}
	go func() { wg.Wait(); close(done) }()
	return done
}

// work is one worker's loop: acquire with the next requestID, write the
// target once under the grant, release.
func (h *honestSide) work(ctx context.Context, i int, c *lockclient.Client, rec *soakRecorder) {
	for n := 1; ctx.Err() == nil; n++ {
		id := fmt.Sprintf("soak-w%d-%d", i, n)
		start := time.Now()
		actx, cancel := context.WithTimeout(ctx, time.Minute)
		l, err := c.Acquire(actx, soakLock, lockclient.AcquireOptions{RequestID: id})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				rec.refused(start, refusalReason(err))
				_ = ctxtime.Sleep(ctx, 20*time.Millisecond)
			}
			continue
		}
		rec.waited(start, time.Now())
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: soakData}}
		if _, err := l.Operation(id).Commit(ctx, cm, func() error { cm.Data = map[string]string{"writer": id}; return nil }); err != nil && ctx.Err() == nil {
			rec.writeFailed(shorten(err.Error(), 160))
		}
		// The last release outlives ctx, so that no honest grant is left held.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		rec.released(l.Fence(), time.Now(), false)
		if err := l.Release(rctx); err != nil {
			rec.writeFailed("release: " + shorten(err.Error(), 160))
		}
		cancel()
	}
}

// refusalReason names why an honest Acquire did not return HELD.
func refusalReason(err error) string {
	switch {
	case errors.Is(err, lockclient.ErrRequestIDTaken):
		return "requestID taken by another owner's LockGrant"
	case errors.Is(err, context.DeadlineExceeded):
		return "no grant within a minute"
	case errors.Is(err, lockclient.ErrDenied):
		return "denied"
	}
	return shorten(err.Error(), 120)
}

// shorten makes a message printable: runs of one character longer than 8
// become "ü×128", and the result is cut to n bytes.
func shorten(s string, n int) string {
	s = squeeze(strings.ToValidUTF8(s, "?"))
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

func squeeze(s string) string {
	var b strings.Builder
	rs := []rune(s)
	for i := 0; i < len(rs); {
		j := i
		for j < len(rs) && rs[j] == rs[i] {
			j++
		}
		if j-i > 8 {
			fmt.Fprintf(&b, "%c×%d", rs[i], j-i)
		} else {
			b.WriteString(string(rs[i:j]))
		}
		i = j
	}
	return b.String()
}

// observeEntries follows the FencedResources of ns (as cluster-admin) and
// calls f with each change in order, until ctx ends.
func (e *env) observeEntries(ctx context.Context, ns string, f func(*locksv1.FencedResource)) error {
	var list locksv1.FencedResourceList
	if err := e.admin.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return err
	}
	for i := range list.Items {
		f(&list.Items[i])
	}
	rv := list.ResourceVersion
	go func() {
		for ctx.Err() == nil {
			w, err := e.admin.Watch(ctx, &locksv1.FencedResourceList{}, client.InNamespace(ns),
				&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
			if err != nil {
				_ = ctxtime.Sleep(ctx, 100*time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				fr, ok := ev.Object.(*locksv1.FencedResource)
				if !ok {
					break
				}
				rv = fr.ResourceVersion
				if ev.Type != watch.Bookmark && ev.Type != watch.Deleted {
					f(fr)
				}
			}
			w.Stop()
		}
	}()
	return nil
}
