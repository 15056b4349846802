package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// The custom-resource floor: what a cycle costs the API server when it is
// nothing but the writes the design needs and the create webhook the
// contract puts in front of them (floorwebhook.go, which allows every
// request), with no operator and no reads. It runs on copies of fencekeeper's two CRDs under a group no
// controller watches, with objects of the real sizes (a signed holder record,
// sixteen recently ended grants, the registry's conditions):
//
//	create the LockGrant → CAS the registry (issue) → the client sees it on its
//	registry watch → release patch → CAS the registry (end, recorded)
//
// Four custom-resource writes per cycle, as the critical-path work counts the floor. On a
// machine whose CPU is the bottleneck, fencekeeper's cycles/s can approach
// this loop's but not pass it; if the loop itself is under a target's ratio
// to the raw Lease loop, that target cannot be met on this machine.
const floorGroup = "floor.bench.fencekeeper.dev"

var (
	floorFR = schema.GroupVersionResource{Group: floorGroup, Version: locksv1.GroupVersion.Version, Resource: "fencedresources"}
	floorLG = schema.GroupVersionResource{Group: floorGroup, Version: locksv1.GroupVersion.Version, Resource: "lockgrants"}
)

// installFloorCRDs creates fencekeeper's CRDs (from the repository at root)
// again under floorGroup, with the same schemas, validation rules and
// subresources.
func installFloorCRDs(ctx context.Context, admin *rest.Config, root string) error {
	cs, err := apiextensionsclient.NewForConfig(admin)
	if err != nil {
		return err
	}
	for _, file := range []string{"locks.fencekeeper.dev_fencedresources.yaml", "locks.fencekeeper.dev_lockgrants.yaml"} {
		raw, err := os.ReadFile(filepath.Join(root, "config", "crd", "bases", file))
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(raw, crd); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		crd.Spec.Group = floorGroup
		crd.Name = crd.Spec.Names.Plural + "." + floorGroup
		crd.Spec.Names.ShortNames = nil
		crd.Spec.Names.Categories = nil
		crd.ResourceVersion = ""
		if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create CRD %s: %w", crd.Name, err)
		}
		name := crd.Name
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, c := range got.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			return fmt.Errorf("CRD %s not established: %w", name, err)
		}
	}
	return nil
}

// installFloor installs the floor's CRDs and create webhook and lets
// workers write them, once per run (the handoff and the throughput phases
// both use them).
func (e *env) installFloor(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.floor {
		return nil
	}
	if err := installFloorCRDs(ctx, e.cp.Admin, e.cp.Root()); err != nil {
		return err
	}
	// The floor's clients are workers like the others, allowed the floor group.
	for _, obj := range []client.Object{
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "bench-floor-writer"}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{floorGroup}, Resources: []string{"fencedresources", "fencedresources/status", "lockgrants", "lockgrants/status"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch"}}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bench-floor-writer"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "bench-floor-writer"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: localcp.WorkersGroup}}},
	} {
		if err := e.admin.Create(ctx, obj); err != nil {
			return err
		}
	}
	dyn, err := dynamic.NewForConfig(e.cp.Admin)
	if err != nil {
		return err
	}
	if err := e.installFloorWebhook(e.runCtx, dyn, metav1.NamespaceDefault); err != nil {
		return err
	}
	e.floor = true
	return nil
}

// floorClient is a floor worker with its own identity whose mutating
// requests count is told of.
func (e *env) floorClient(count *countingTransport) (dynamic.Interface, string, error) {
	rc, owner, err := e.user("floor", localcp.WorkersGroup)
	if err != nil {
		return nil, "", err
	}
	rc = rest.CopyConfig(rc)
	rc.Wrap(count.wrap)
	dyn, err := dynamic.NewForConfig(rc)
	return dyn, owner, err
}

// floorTemplateOf installs the floor (once) and reads the FencedResource
// whose status the floor's registry objects copy.
func (e *env) floorTemplateOf(ctx context.Context, ns, template string) (*locksv1.FencedResource, error) {
	if err := e.installFloor(ctx); err != nil {
		return nil, err
	}
	var tmpl locksv1.FencedResource
	if err := e.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: template}, &tmpl); err != nil {
		return nil, err
	}
	return &tmpl, nil
}

// floorLoop is one client's resource in the floor run.
type floorLoop struct {
	dyn    dynamic.Interface
	ns     string
	fr     *unstructured.Unstructured // the registry as last written
	events <-chan string              // resourceVersions its watch delivered
	signed *locksv1.Holder            // a signed holder record to copy
	phases *phaseWriter               // nil: no LockGrant status (floorphase.go)
	n      int
}

// newFloorLoop creates the client's registry object (status as template has
// it, without a holder) and its watch.
func newFloorLoop(ctx context.Context, dyn dynamic.Interface, ns, name string, template *locksv1.FencedResource, signed *locksv1.Holder) (*floorLoop, error) {
	created, _, err := createFloorRegistry(ctx, dyn, ns, name, template)
	if err != nil {
		return nil, err
	}
	w, err := dyn.Resource(floorFR).Namespace(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=" + name, ResourceVersion: created.GetResourceVersion()})
	if err != nil {
		return nil, err
	}
	events := make(chan string, 16)
	go func() {
		defer w.Stop()
		defer close(events)
		for ev := range w.ResultChan() {
			if ev.Type != watch.Modified {
				continue
			}
			if obj, ok := ev.Object.(*unstructured.Unstructured); ok {
				select {
				case events <- obj.GetResourceVersion():
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return &floorLoop{dyn: dyn, ns: ns, fr: created, events: events, signed: signed}, nil
}

// cycle is one acquire/release cycle of four writes.
func (f *floorLoop) cycle(ctx context.Context) error {
	f.n++
	name := fmt.Sprintf("%s-%d", f.fr.GetName(), f.n)
	created, err := createFloorGrant(ctx, f.dyn, f.ns, f.fr.GetName(), name, f.signed.Owner)
	if err != nil {
		return err
	}
	h := *f.signed
	h.GrantName, h.GrantUID, h.RequestID = name, string(created.GetUID()), name
	if err := f.cas(ctx, func(st *locksv1.FencedResourceStatus) {
		st.FenceToken++
		h.FenceToken = st.FenceToken
		st.Holder = &h
	}); err != nil {
		return err
	}
	if err := releaseFloorGrant(ctx, f.dyn, f.ns, name); err != nil {
		return err
	}
	if err := f.cas(ctx, func(st *locksv1.FencedResourceStatus) {
		st.Holder = nil
		recordFloorRelease(st, string(created.GetUID()))
	}); err != nil {
		return err
	}
	return f.phases.ended(ctx, name)
}

// floorResourceLabel names a floor LockGrant's registry object, so that a
// floor issuer watches only its own.
const floorResourceLabel = "bench.fencekeeper.dev/floor-resource"

// floorOperationRoot is the operationRoot of every floor request.
var floorOperationRoot = "sha256:" + strings.Repeat("ab", 32)

// createFloorGrant creates the floor LockGrant name for resource, as owner.
func createFloorGrant(ctx context.Context, dyn dynamic.Interface, ns, resource, name, owner string) (*unstructured.Unstructured, error) {
	lg := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{floorResourceLabel: resource}}, Spec: locksv1.LockGrantSpec{
		Resource: resource, Owner: owner, RequestID: name, Lease: "lease-" + name, OperationRoot: floorOperationRoot}}
	u, err := toFloor(lg, "LockGrant")
	if err != nil {
		return nil, err
	}
	created, err := dyn.Resource(floorLG).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("floor LockGrant create: %w", err)
	}
	return created, nil
}

// releaseFloorGrant is the holder's release: one merge patch, as lockclient's.
func releaseFloorGrant(ctx context.Context, dyn dynamic.Interface, ns, name string) error {
	if _, err := dyn.Resource(floorLG).Namespace(ns).Patch(ctx, name, types.MergePatchType,
		[]byte(`{"spec":{"release":true}}`), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("floor release: %w", err)
	}
	return nil
}

// recordFloorRelease records a released grant in the registry status, bounded
// as the issuer bounds it (issuer.recordEnded).
func recordFloorRelease(st *locksv1.FencedResourceStatus, uid string) {
	st.RecentlyEnded = append(st.RecentlyEnded, locksv1.EndedGrant{GrantUID: uid, Phase: locksv1.PhaseReleased, Reason: locksv1.ReasonReleased})
	if over := len(st.RecentlyEnded) - locksv1.MaxRecentlyEnded; over > 0 {
		st.RecentlyEnded = st.RecentlyEnded[over:]
	}
}

// cas writes the registry status with its last resourceVersion as the
// precondition, then waits for its own watch to deliver the write.
func (f *floorLoop) cas(ctx context.Context, change func(*locksv1.FencedResourceStatus)) error {
	var st locksv1.FencedResourceStatus
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(f.fr.Object["status"].(map[string]any), &st); err != nil {
		return err
	}
	change(&st)
	written, err := writeFloorStatus(ctx, f.dyn, f.fr, &st)
	if err != nil {
		return err
	}
	f.fr = written
	for {
		select {
		case rv, ok := <-f.events:
			if !ok {
				return fmt.Errorf("floor registry watch of %s closed", f.fr.GetName())
			}
			if rv == written.GetResourceVersion() {
				return nil
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// createFloorRegistry creates a floor registry object named name with
// template's spec and status (without holder and queue), and returns it and
// its status.
func createFloorRegistry(ctx context.Context, dyn dynamic.Interface, ns, name string, template *locksv1.FencedResource) (*unstructured.Unstructured, *locksv1.FencedResourceStatus, error) {
	fr := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: template.Spec}
	fr.Spec.ResourceID = ns + "/" + name
	u, err := toFloor(fr, "FencedResource")
	if err != nil {
		return nil, nil, err
	}
	created, err := dyn.Resource(floorFR).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("create floor FencedResource: %w", err)
	}
	st := template.Status.DeepCopy()
	st.Holder, st.Queue = nil, nil
	written, err := writeFloorStatus(ctx, dyn, created, st)
	return written, st, err
}

// writeFloorStatus CASes st onto the floor registry object fr (its
// resourceVersion is the precondition) and returns what was written.
func writeFloorStatus(ctx context.Context, dyn dynamic.Interface, fr *unstructured.Unstructured, st *locksv1.FencedResourceStatus) (*unstructured.Unstructured, error) {
	status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(st)
	if err != nil {
		return nil, err
	}
	next := fr.DeepCopy()
	next.Object["status"] = status
	written, err := dyn.Resource(floorFR).Namespace(fr.GetNamespace()).UpdateStatus(ctx, next, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("floor registry CAS: %w", err)
	}
	return written, nil
}

// toFloor converts one of fencekeeper's objects into the floor group's.
func toFloor(obj runtime.Object, kind string) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(floorGroup + "/" + locksv1.GroupVersion.Version)
	u.SetKind(kind)
	delete(u.Object, "status")
	return u, nil
}

// floorTemplate is the registry status to copy (a real one, read back after
// fencekeeper's own run) and a holder record signed as the issuer signs.
func floorTemplate(fr *locksv1.FencedResource, owner string) (*locksv1.Holder, error) {
	signer, err := grant.GenerateSigner(rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	id := strings.Repeat("0", 16)
	h := &locksv1.Holder{GrantName: "template", GrantUID: "00000000-0000-0000-0000-000000000000", Owner: owner,
		Lease: "lease-" + id, RequestID: id, FenceToken: fr.Status.FenceToken + 1,
		OperationRoot: floorOperationRoot, IssuerEpoch: fr.Status.IssuerEpoch, PolicyGeneration: fr.Generation,
		BackendRevision: fr.ResourceVersion, TTLSeconds: int64(fr.Spec.LeaseDurationSeconds), IssuedAt: now.Format(time.RFC3339Nano),
		ExpiresAt: metav1.NewMicroTime(now.Add(time.Minute))}
	h.Digest, h.Proof, err = signer.Sign(h.Grant(fr.Spec.ResourceID))
	return h, err
}
