package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// The handoff floor: fencekeeper's release handoff with nothing but the
// requests and watch hops its design needs, on the floor's copies of the
// CRDs (floor.go), with objects of real size:
//
//	holder: merge PATCH spec.release of its LockGrant
//	→ watch hop to a minimal issuer (a raw watch of the LockGrants, no
//	  informer, no work queue, no reads) → it signs the waiter's grant and
//	  CASes the registry status (holder record, recently ended, fence+1)
//	→ watch hop to the waiter, which follows the registry.
//
// Two custom-resource writes and two hops, against the raw handoff's two
// Lease writes and one hop. What fencekeeper's handoff costs above this is
// the operator's own work (informer, queue, reconcile); if this floor is
// itself over a target's ratio to the raw handoff, the target cannot be met
// by this design on this machine.

// floorIssuer is the minimal issuer of one floor registry object: it is its
// only writer, so it decides from what it last wrote.
type floorIssuer struct {
	dyn    dynamic.Interface
	ns     string
	signer *grant.Signer
	tmpl   locksv1.Holder

	mu     sync.Mutex
	fr     *unstructured.Unstructured // the registry as last written
	st     locksv1.FencedResourceStatus
	queue  []floorRequest
	queued chan string  // names of LockGrants queued (or granted at once); nil: not told
	phases *phaseWriter // nil: no LockGrant status (floorphase.go)
	err    error
	dead   chan struct{} // closed when the issuer stopped (err says why)
}

type floorRequest struct {
	name, uid, owner string
}

// startFloorIssuer creates the floor registry object (the template's status,
// without holder and queue) and starts following its LockGrants; phases, if
// not nil, writes the status of each LockGrant it ends.
func startFloorIssuer(ctx context.Context, dyn dynamic.Interface, ns, name string, template *locksv1.FencedResource, notify bool, phases *phaseWriter) (*floorIssuer, error) {
	signer, err := grant.GenerateSigner(rand.Reader)
	if err != nil {
		return nil, err
	}
	created, st, err := createFloorRegistry(ctx, dyn, ns, name, template)
	if err != nil {
		return nil, err
	}
	f := &floorIssuer{dyn: dyn, ns: ns, signer: signer, fr: created, st: *st, phases: phases,
		tmpl: locksv1.Holder{TTLSeconds: int64(template.Spec.LeaseDurationSeconds), OperationRoot: floorOperationRoot}}
	if notify {
		f.queued = make(chan string, 16)
	}
	// Only this registry object's LockGrants (floorResourceLabel): another
	// floor's traffic in the namespace is not this issuer's work.
	w, err := dyn.Resource(floorLG).Namespace(ns).Watch(ctx, metav1.ListOptions{LabelSelector: floorResourceLabel + "=" + name})
	if err != nil {
		return nil, err
	}
	f.dead = make(chan struct{})
	go func() {
		defer w.Stop()
		defer close(f.dead)
		defer func() {
			f.mu.Lock()
			if f.err == nil {
				f.err = fmt.Errorf("floor issuer of %s: its LockGrant watch ended", name)
			}
			f.mu.Unlock()
		}()
		for ev := range w.ResultChan() {
			lg, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			if res, _, _ := unstructured.NestedString(lg.Object, "spec", "resource"); res != name {
				continue
			}
			if err := f.observe(ctx, ev.Type, lg); err != nil {
				f.mu.Lock()
				f.err = err
				f.mu.Unlock()
				return
			}
		}
	}()
	return f, nil
}

// observe queues a new request (granting it at once when the lock is free)
// and hands the lock to the next in line when the holder releases.
func (f *floorIssuer) observe(ctx context.Context, typ watch.EventType, lg *unstructured.Unstructured) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if typ == watch.Added {
		owner, _, _ := unstructured.NestedString(lg.Object, "spec", "owner")
		f.queue = append(f.queue, floorRequest{name: lg.GetName(), uid: string(lg.GetUID()), owner: owner})
		if f.st.Holder == nil {
			if err := f.handOff(ctx); err != nil {
				return err
			}
		}
		if f.queued != nil { // nil: nobody waits to hear (the contended floor)
			f.queued <- lg.GetName()
		}
		return nil
	}
	released, _, _ := unstructured.NestedBool(lg.Object, "spec", "release")
	h := f.st.Holder
	if !released || h == nil || h.GrantName != lg.GetName() {
		return nil
	}
	recordFloorRelease(&f.st, h.GrantUID)
	f.st.Holder = nil
	if err := f.handOff(ctx); err != nil {
		return err
	}
	return f.phases.ended(ctx, h.GrantName)
}

// handOff issues the head of the queue (signed, fence+1) by one CAS.
func (f *floorIssuer) handOff(ctx context.Context) error {
	if len(f.queue) == 0 {
		return f.cas(ctx)
	}
	next := f.queue[0]
	f.queue = f.queue[1:]
	h := f.tmpl
	h.GrantName, h.GrantUID, h.Owner, h.RequestID, h.Lease = next.name, next.uid, next.owner, next.name, "lease-"+next.name
	f.st.FenceToken++
	h.FenceToken, h.IssuerEpoch, h.BackendRevision = f.st.FenceToken, f.st.IssuerEpoch, f.fr.GetResourceVersion()
	now := time.Now().UTC()
	h.IssuedAt, h.ExpiresAt = now.Format(time.RFC3339Nano), metav1.NewMicroTime(now.Add(time.Duration(h.TTLSeconds)*time.Second))
	var err error
	if h.Digest, h.Proof, err = f.signer.Sign(h.Grant(f.fr.GetNamespace() + "/" + f.fr.GetName())); err != nil {
		return err
	}
	f.st.Holder = &h
	return f.cas(ctx)
}

// cas writes the registry status with the resourceVersion last written.
func (f *floorIssuer) cas(ctx context.Context) error {
	written, err := writeFloorStatus(ctx, f.dyn, f.fr, &f.st)
	if err != nil {
		return err
	}
	f.fr = written
	return nil
}

// mirrorHeld writes status (a real LockGrant's, after fencekeeper's
// handoffs) to the holder's LockGrant, as fencekeeper's issuer mirrors Held
// shortly after a grant: the LockGrant the next release patches then has
// fencekeeper's size and field managers. Not timed.
func (f *floorIssuer) mirrorHeld(ctx context.Context, name string, status *locksv1.LockGrantStatus) error {
	lgs := f.dyn.Resource(floorLG).Namespace(f.ns)
	lg, err := lgs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(status)
	if err != nil {
		return err
	}
	lg.Object["status"] = st
	_, err = lgs.UpdateStatus(ctx, lg, metav1.UpdateOptions{})
	return err
}

func (f *floorIssuer) resourceVersion() (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fr.GetResourceVersion(), f.err
}

// floorWorker is a client of the handoff floor with its own identity.
type floorWorker struct {
	dyn   dynamic.Interface
	owner string
}

// request creates a LockGrant on the floor registry.
func (w floorWorker) request(ctx context.Context, ns, resource, name string) error {
	_, err := createFloorGrant(ctx, w.dyn, ns, resource, name, w.owner)
	return err
}

// waitHolder follows the registry from rv until name holds it; watching is
// closed once the watch is established. It returns the fence.
func (w floorWorker) waitHolder(ctx context.Context, ns, resource, name, rv string, watching chan<- struct{}) (int64, time.Time, error) {
	wt, err := w.dyn.Resource(floorFR).Namespace(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=" + resource, ResourceVersion: rv})
	if err != nil {
		close(watching) // the caller goes on, and finds the error
		return 0, time.Time{}, err
	}
	defer wt.Stop()
	close(watching)
	for ev := range wt.ResultChan() {
		fr, ok := ev.Object.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		if holder, _, _ := unstructured.NestedString(fr.Object, "status", "holder", "grantName"); holder == name {
			fence, _, _ := unstructured.NestedInt64(fr.Object, "status", "holder", "fenceToken")
			return fence, time.Now(), nil
		}
	}
	return 0, time.Time{}, fmt.Errorf("floor registry watch of %s ended: %w", resource, ctx.Err())
}

// floorHandoffs measures the handoff floor on one registry object whose
// status copies the FencedResource template (a real one, after fencekeeper's
// handoffs): holder and waiter alternate between two workers, as in
// releaseHandoffs. answered collects when each release PATCH was answered.
func (e *env) floorHandoffs(ctx context.Context, ns, resource, template string, warmup, n int, answered *[]time.Duration) ([]time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h, err := e.newFloorHandoff(ctx, ns, resource, template)
	if err != nil {
		return nil, err
	}
	if err := h.grant(ctx, 0); err != nil {
		return nil, err
	}
	var out []time.Duration
	for i := 1; i <= warmup+n; i++ {
		took, released, err := h.sample(ctx, i)
		if err != nil {
			return nil, err
		}
		if i > warmup {
			out = append(out, took)
			*answered = append(*answered, released)
		}
	}
	return out, nil
}

// floorHandoff is one registry object of the handoff floor, its issuer and
// two workers; request i is made by worker i%2.
type floorHandoff struct {
	ns, resource string
	ws           [2]floorWorker
	iss          *floorIssuer
	held         *locksv1.LockGrantStatus // mirrored onto each new holder
	holder       string
	fence        int64
}

func (e *env) newFloorHandoff(ctx context.Context, ns, resource, template string) (*floorHandoff, error) {
	if err := e.installFloor(ctx); err != nil {
		return nil, err
	}
	var tmpl locksv1.FencedResource
	if err := e.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: template}, &tmpl); err != nil {
		return nil, err
	}
	held, err := grantedStatusOf(ctx, e.admin, ns, template, "", locksv1.PhaseHeld)
	if err != nil {
		return nil, err
	}
	if err := e.observeFloor(ctx, ns); err != nil {
		return nil, err
	}
	h := &floorHandoff{ns: ns, resource: resource, held: held}
	var dyns [3]dynamic.Interface
	var owners [3]string
	for i := range dyns {
		rc, owner, err := e.user("floor", localcp.WorkersGroup)
		if err != nil {
			return nil, err
		}
		if dyns[i], err = dynamic.NewForConfig(rc); err != nil {
			return nil, err
		}
		owners[i] = owner
	}
	h.ws = [2]floorWorker{{dyn: dyns[0], owner: owners[0]}, {dyn: dyns[1], owner: owners[1]}}
	if h.iss, err = startFloorIssuer(ctx, dyns[2], ns, resource, &tmpl, true, nil); err != nil {
		return nil, err
	}
	return h, nil
}

// request makes request i and waits until the floor issuer queued it (or
// granted it, when the lock was free).
func (h *floorHandoff) request(ctx context.Context, i int) (string, error) {
	name := fmt.Sprintf("%s-%d", h.resource, i)
	if err := h.ws[i%2].request(ctx, h.ns, h.resource, name); err != nil {
		return "", err
	}
	select {
	case got := <-h.iss.queued:
		if got != name {
			return "", fmt.Errorf("floor issuer queued %s, expected %s", got, name)
		}
		return name, nil
	case <-time.After(30 * time.Second):
		_, err := h.iss.resourceVersion()
		return "", fmt.Errorf("floor issuer did not see %s within 30s (%v)", name, err)
	}
}

// grant makes request i on a free lock: it holds at once.
func (h *floorHandoff) grant(ctx context.Context, i int) error {
	name, err := h.request(ctx, i)
	if err != nil {
		return err
	}
	h.holder = name
	return h.iss.mirrorHeld(ctx, name, h.held)
}

// sample queues request i behind the holder, releases the holder and times
// the handoff to request i; released is when the release PATCH was answered.
func (h *floorHandoff) sample(ctx context.Context, i int) (took, released time.Duration, err error) {
	name, err := h.request(ctx, i)
	if err != nil {
		return 0, 0, err
	}
	rv, err := h.iss.resourceVersion()
	if err != nil {
		return 0, 0, err
	}
	type res struct {
		fence int64
		at    time.Time
		err   error
	}
	watching := make(chan struct{})
	ch := make(chan res, 1)
	go func() {
		f, at, err := h.ws[i%2].waitHolder(ctx, h.ns, h.resource, name, rv, watching)
		ch <- res{f, at, err}
	}()
	<-watching
	t0 := time.Now()
	if err := releaseFloorGrant(ctx, h.ws[(i+1)%2].dyn, h.ns, h.holder); err != nil {
		return 0, 0, err
	}
	released = time.Since(t0)
	var r res
	select {
	case r = <-ch:
	case <-time.After(30 * time.Second):
		_, err := h.iss.resourceVersion()
		return 0, 0, fmt.Errorf("floor handoff %d: the waiter did not hold within 30s of the release (floor issuer: %v)", i, err)
	}
	if r.err != nil {
		return 0, 0, r.err
	}
	if h.fence != 0 && r.fence != h.fence+1 {
		return 0, 0, fmt.Errorf("floor handoff %d: fence %d after %d", i, r.fence, h.fence)
	}
	h.holder, h.fence = name, r.fence
	return r.at.Sub(t0), released, h.iss.mirrorHeld(ctx, name, h.held)
}

// grantedStatusOf is the status of one of resource's LockGrants that carries
// a grant, as its issuer mirrored it (in phase from, unless from is empty),
// with the phase set to phase.
func grantedStatusOf(ctx context.Context, kube client.Client, ns, resource string, from, phase locksv1.LockGrantPhase) (*locksv1.LockGrantStatus, error) {
	var list locksv1.LockGrantList
	if err := kube.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	for _, lg := range list.Items {
		if lg.Spec.Resource == resource && lg.Status.Grant != nil && (from == "" || lg.Status.Phase == from) {
			st := lg.Status.DeepCopy()
			st.Phase = phase
			return st, nil
		}
	}
	return nil, fmt.Errorf("no LockGrant of %s carries a grant to copy (phase %q)", resource, from)
}

// observeFloor watches the floor's registry objects and LockGrants in ns
// from the bench process for as long as ctx lives, decoding every event, as
// followPhases and followFences watch fencekeeper's during its handoffs: the
// floor then carries the same measurement load.
func (e *env) observeFloor(ctx context.Context, ns string) error {
	dyn, err := dynamic.NewForConfig(e.cp.Admin)
	if err != nil {
		return err
	}
	for _, gvr := range []schema.GroupVersionResource{floorFR, floorLG} {
		w, err := dyn.Resource(gvr).Namespace(ns).Watch(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		go func() {
			defer w.Stop()
			for range w.ResultChan() { // decoded by the watch; nothing more to do
			}
		}()
	}
	return nil
}
