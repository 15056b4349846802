package webhooks

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// ProtectedPath is where the acceptance webhook is served (its home is
// api/v1alpha1, so the kubectl plugin need not import this package).
const ProtectedPath = locksv1.ProtectedWebhookPath

// Two entries of the configuration call the acceptance webhook (see
// docs/security.md, "What is protected"). vprotected sees every labelled
// object of a protected kind in any namespace; vprotected-enrolled sees the
// unlabelled ones, only in namespaces that hold FencedResources (the operator
// labels them). Between them every write to a target reaches the webhook,
// whatever the target's labels, while writes in namespaces without
// FencedResources never depend on fencekeeper. The generated rules cover
// ConfigMaps; an installation adds its custom kinds with every subresource.
// +kubebuilder:webhook:path=/validate-fencekeeper-protected,mutating=false,failurePolicy=fail,sideEffects=NoneOnDryRun,groups="",resources=configmaps,verbs=create;update;delete,versions=v1,name=vprotected.fencekeeper.dev,admissionReviewVersions=v1,timeoutSeconds=5,patch=`{"objectSelector":{"matchLabels":{"fencekeeper.dev/protected":"true"}},"namespaceSelector":{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"NotIn","values":["fencekeeper-system","kube-public","kube-system"]}]}}`
// +kubebuilder:webhook:path=/validate-fencekeeper-protected,mutating=false,failurePolicy=fail,sideEffects=NoneOnDryRun,groups="",resources=configmaps,verbs=create;update;delete,versions=v1,name=vprotected-enrolled.fencekeeper.dev,admissionReviewVersions=v1,timeoutSeconds=5,patch=`{"objectSelector":{"matchExpressions":[{"key":"fencekeeper.dev/protected","operator":"NotIn","values":["true"]}]},"namespaceSelector":{"matchExpressions":[{"key":"fencekeeper.dev/enrolled","operator":"In","values":["true"]},{"key":"kubernetes.io/metadata.name","operator":"NotIn","values":["fencekeeper-system","kube-public","kube-system"]}]}}`

// +kubebuilder:rbac:groups=locks.fencekeeper.dev,resources=fencedresources/status,verbs=get;update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch;patch

// ProtectedObjectValidator is the acceptance point for protected objects of
// any kind. The registry decides what is protected: it finds the
// FencedResource whose target is the object (by the object's
// fencekeeper.dev/resource annotation or the cache's target index, then
// always a linearizable GET), gathers the inputs of fence.Decide — the caller
// from userInfo, the trusted stored state, the new content's digest, the
// trust bundle — and applies the entry's enforcement mode to the verdict.
type ProtectedObjectValidator struct {
	// Reader must not be a cache: the registry read has to be linearizable.
	Reader client.Reader
	// Index is the cache with FencedResources indexed by target. It only
	// nominates entries (each is then read through Reader); an object it does
	// not know and that names no entry itself is nobody's target.
	Index client.Reader
	// Namespace is the operator's namespace, where the target claims are
	// (see claimedEntry).
	Namespace string
	// Writer records a deleted target's fence state in the registry.
	Writer   client.Client
	Mapper   meta.RESTMapper
	Bundle   *TrustBundleSource
	Clock    clock.Clock
	Recorder events.EventRecorder
	Status   *StatusRecorder
}

// SetupProtectedWebhook registers the acceptance webhook and its status recorder.
func SetupProtectedWebhook(mgr ctrl.Manager, namespace string, clk clock.Clock) (*ProtectedObjectValidator, error) {
	if err := IndexTargets(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return nil, err
	}
	status := NewStatusRecorder(mgr.GetClient(), mgr.GetAPIReader())
	if err := mgr.Add(status); err != nil {
		return nil, err
	}
	bundle := &TrustBundleSource{Reader: mgr.GetClient(), Key: types.NamespacedName{Namespace: namespace, Name: locksv1.TrustBundleConfigMap}}
	// Each replica reports the bundle it verifies with; key rotation waits on it.
	if err := mgr.Add(&VerifierReporter{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Source: bundle,
		Namespace: namespace, Replica: ReplicaName(), Interval: 2 * time.Second}); err != nil {
		return nil, err
	}
	v := &ProtectedObjectValidator{
		Reader:    mgr.GetAPIReader(),
		Index:     mgr.GetCache(),
		Namespace: namespace,
		Writer:    mgr.GetClient(),
		Mapper:    mgr.GetRESTMapper(),
		Bundle:    bundle,
		Clock:     clk,
		Recorder:  mgr.GetEventRecorder("fencekeeper-webhook"),
		Status:    status,
	}
	mgr.GetWebhookServer().Register(ProtectedPath, &webhook.Admission{Handler: v})
	return v, nil
}

// IndexTargets indexes FencedResources by TargetKey in a cache.
func IndexTargets(ctx context.Context, indexer client.FieldIndexer) error {
	return indexer.IndexField(ctx, &locksv1.FencedResource{}, locksv1.FencedResourceTargetField, func(o client.Object) []string {
		if t := o.(*locksv1.FencedResource).Spec.Target; t != nil {
			return []string{t.Key()}
		}
		return nil
	})
}

// request is one admission request, decoded: the object it is about (for a
// subresource, the parent object), its old and new states, and the write in
// fence's terms.
type request struct {
	admission.Request
	group, kind, name string
	oldObj, newObj    *unstructured.Unstructured
	write             fence.Write
}

// Handle decides one admission request.
func (v *ProtectedObjectValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	defer func() { decisionLatency.WithLabelValues(string(req.Operation)).Observe(time.Since(start).Seconds()) }()

	r, err := v.decode(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	fr, err := v.entry(ctx, r)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if fr == nil {
		return nonTarget(r)
	}
	if teardown, err := v.namespaceTeardown(ctx, r); err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	} else if teardown {
		return v.allowTeardown(r, fr)
	}
	bundle, stored, err := v.Bundle.GetWithRetired(ctx)
	if err != nil {
		return admission.Errored(http.StatusServiceUnavailable, err)
	}
	if err := r.compareContent(); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	// Stored state accepted under a key retired since still counts; grants never do.
	d, st := fence.DecideWrite(r.write, entryOf(fr), registryOf(fr, v.Clock.Now()), fence.Trust{Grants: bundle, Stored: stored})
	if d.Verdict == fence.Accepted && r.Operation == admissionv1.Delete && !dryRun(req) {
		if err := v.rememberDeleted(ctx, fr, r.oldObj, st); err != nil {
			return admission.Errored(http.StatusServiceUnavailable, err)
		}
	}
	return v.respond(r, fr, st, d)
}

// notProtected is the verdict label of writes to objects that are nobody's target.
const notProtected = "NOT_PROTECTED"

// nonTarget answers a write to an object no FencedResource names. It is let
// through, unless it writes fence state: fence and receipt annotations are
// only ever accepted at a target, so none can be planted on an object that is
// about to become one (or that a webhook replica's cache does not yet know
// as one — the write is then refused until it does).
func nonTarget(r *request) admission.Response {
	if writes, _ := r.write.FenceStateChange(); writes {
		recordDecision(r.Namespace, string(fence.WrongResource), "", true, false)
		return denied(fence.Decision{Verdict: fence.WrongResource, Message: fmt.Sprintf("WRONG_RESOURCE: no FencedResource names %s %s as its target, and %s and %s annotations are only written to a target (if its FencedResource was just created, retry)",
			r.kind, r.name, fence.AnnotationFence, fence.AnnotationReceipts)})
	}
	decisions.WithLabelValues(notProtected, "", "true").Inc()
	return admission.Allowed("not protected: no FencedResource names this object as its target")
}

func (v *ProtectedObjectValidator) decode(req admission.Request) (*request, error) {
	oldObj, newObj, err := decodeObjects(req)
	if err != nil {
		return nil, err
	}
	r := &request{Request: req, oldObj: oldObj, newObj: newObj, group: req.Kind.Group, kind: req.Kind.Kind, name: req.Name,
		write: fence.Write{Operation: fence.Operation(req.Operation), Subresource: req.SubResource,
			User: req.UserInfo.Username, Pod: locksv1.RequestPod(req.UserInfo), Old: objectOf(oldObj), New: objectOf(newObj)}}
	if req.SubResource != "" {
		// The request's kind is the subresource's (Scale); the target is the parent.
		gvk, err := v.Mapper.KindFor(schema.GroupVersionResource{Group: req.Resource.Group, Version: req.Resource.Version, Resource: req.Resource.Resource})
		if err != nil {
			return nil, fmt.Errorf("kind of %s: %w", req.Resource.Resource, err)
		}
		r.group, r.kind = gvk.Group, gvk.Kind
	}
	if r.name == "" {
		if newObj != nil {
			r.name = newObj.GetName()
		} else {
			r.name = oldObj.GetName()
		}
	}
	return r, nil
}

// entry returns the FencedResource whose target is the object, read with a
// linearizable GET, or nil when the object is nobody's target. Candidates are
// the entries the object's old and new annotations name and the ones the
// cache's target index knows.
func (v *ProtectedObjectValidator) entry(ctx context.Context, r *request) (*locksv1.FencedResource, error) {
	key := locksv1.TargetKey(r.group, r.kind, r.name)
	names, err := v.candidates(ctx, r, key)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		var fr locksv1.FencedResource
		if err := v.Index.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: name}, &fr); err == nil && !targets(&fr, key) {
			// spec.target is immutable: a cached entry that names another
			// object cannot name this one, so its quorum read is skipped.
			continue
		}
		read := time.Now()
		err := v.Reader.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: name}, &fr)
		registryReadLatency.Observe(time.Since(read).Seconds())
		if apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("read FencedResource %s/%s: %w", r.Namespace, name, err)
		}
		if targets(&fr, key) {
			return &fr, nil
		}
	}
	return nil, nil
}

// candidates names the entries that may protect the object: those its old
// and new fencekeeper.dev/resource annotation name, those the cache indexes
// under its group, kind and name, and for a create neither knows, the entry
// its target claim names.
func (v *ProtectedObjectValidator) candidates(ctx context.Context, r *request, key string) ([]string, error) {
	var names []string
	for _, o := range []*unstructured.Unstructured{r.oldObj, r.newObj} {
		if o != nil && r.SubResource == "" {
			if n := o.GetAnnotations()[fence.AnnotationResource]; n != "" && !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	var indexed locksv1.FencedResourceList
	if err := v.Index.List(ctx, &indexed, client.InNamespace(r.Namespace), client.MatchingFields{locksv1.FencedResourceTargetField: key}); err != nil {
		return nil, fmt.Errorf("look up the FencedResource of %s: %w", key, err)
	}
	if len(indexed.Items) == 0 && len(names) == 0 && r.Operation == admissionv1.Create {
		// A create the index does not know: ask the API server, so that a
		// replica whose cache has not yet seen a new entry cannot let a
		// stranger create its target (for instance right after its holder
		// deleted it). Updates need no such read: an existing target either
		// names its entry or has never been written under a grant. One GET
		// of the target's claim, not a LIST of the namespace's entries:
		// every create in an enrolled namespace comes here, and with
		// 100,000 entries a LIST costs the API server a walk of them all.
		name, err := claimedEntry(ctx, v.Reader, v.Namespace, r.Namespace, key)
		if err != nil {
			return nil, fmt.Errorf("look up the FencedResource of %s: %w", key, err)
		}
		if name != "" {
			names = append(names, name)
		}
	}
	for _, fr := range indexed.Items {
		if !slices.Contains(names, fr.Name) {
			names = append(names, fr.Name)
		}
	}
	return names, nil
}

func targets(fr *locksv1.FencedResource, key string) bool {
	return fr.Spec.Target != nil && fr.Spec.Target.Key() == key
}

// objectOf is an object's state in fence's terms (nil for nil), its payload
// not yet digested.
func objectOf(u *unstructured.Unstructured) *fence.Object {
	if u == nil {
		return nil
	}
	return &fence.Object{Kind: u.GetKind(), Name: u.GetName(), Labels: u.GetLabels(), Annotations: u.GetAnnotations()}
}

// compareContent digests the written object's business content and says
// whether an update changes it, for a write of the object itself (a
// subresource's object is not the target's content). Only a target's writes
// get here: both cost a copy of the object.
func (r *request) compareContent() error {
	if r.SubResource != "" || r.newObj == nil {
		return nil
	}
	r.write.Changed = r.oldObj != nil && changed(r.oldObj, r.newObj)
	payload, err := fence.PayloadDigest(fence.ObjectPayload(r.newObj.Object))
	if err != nil {
		return fmt.Errorf("digest of the new content: %w", err)
	}
	r.write.New.Payload = payload
	return nil
}

// entryOf is what the acceptance point reads of a registry entry.
func entryOf(fr *locksv1.FencedResource) fence.Entry {
	e := fence.Entry{Name: fr.Name, ResourceID: fr.Spec.ResourceID, HighestObservedFence: fr.Status.HighestObservedFence}
	if dt := fr.Status.DeletedTarget; dt != nil {
		e.DeletedTarget = &fence.State{HighestFence: dt.FenceToken, Root: dt.OperationRoot, LastSegment: dt.Segment, GrantDigest: dt.GrantDigest}
	}
	return e
}

func registryOf(fr *locksv1.FencedResource, now time.Time) fence.Registry {
	reg := fence.Registry{Now: now, Found: true, ResourceID: fr.Spec.ResourceID, Generation: fr.Generation}
	if h := fr.Status.Holder; h != nil {
		reg.Holder = &fence.Holder{Digest: h.Digest, Owner: h.Owner, Lease: h.Lease, RequestID: h.RequestID, Fence: h.FenceToken, ExpiresAt: h.ExpiresAt.Time}
	}
	return reg
}

// rememberDeleted records the deleted target's fence state in the registry
// before the deletion is admitted, so its holder can create it again with the
// next segment. A deletion that then fails leaves a record nobody reads: the
// record is used only when the object does not exist.
func (v *ProtectedObjectValidator) rememberDeleted(ctx context.Context, fr *locksv1.FencedResource, oldObj *unstructured.Unstructured, st fence.State) error {
	dt := &locksv1.DeletedTarget{FenceToken: st.HighestFence, OperationRoot: st.Root, Segment: st.LastSegment,
		GrantDigest: st.GrantDigest, UID: string(oldObj.GetUID()), DeletedAt: metav1.NewTime(v.Clock.Now())}
	key := client.ObjectKeyFromObject(fr)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur locksv1.FencedResource
		if err := v.Reader.Get(ctx, key, &cur); err != nil {
			return err
		}
		cur.Status.DeletedTarget = dt
		return v.Writer.Status().Update(ctx, &cur)
	})
}

// namespaceTeardown reports whether the request is the namespace controller
// emptying a terminating namespace: its deletes are let through (audited), or
// deleting a namespace that holds an enforced target would never complete.
func (v *ProtectedObjectValidator) namespaceTeardown(ctx context.Context, r *request) (bool, error) {
	if r.Operation != admissionv1.Delete || r.UserInfo.Username != locksv1.NamespaceControllerUsername {
		return false, nil
	}
	return NamespaceTerminating(ctx, v.Reader, r.Namespace)
}

// NamespaceTerminating reads the namespace around the cache.
func NamespaceTerminating(ctx context.Context, reader client.Reader, name string) (bool, error) {
	var ns corev1.Namespace
	if err := reader.Get(ctx, types.NamespacedName{Name: name}, &ns); err != nil {
		return false, fmt.Errorf("read namespace %s: %w", name, err)
	}
	return ns.DeletionTimestamp != nil, nil
}

func (v *ProtectedObjectValidator) allowTeardown(r *request, fr *locksv1.FencedResource) admission.Response {
	teardownDeletes.Inc()
	decisions.WithLabelValues(namespaceTeardown, string(fr.Spec.Enforcement), "true").Inc()
	if !dryRun(r.Request) {
		// On the Namespace: a terminating namespace takes no new Events.
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.Namespace}}
		v.Recorder.Eventf(ns, nil, corev1.EventTypeNormal, locksv1.EventReasonNamespaceTeardown, "Delete",
			"%s %s (target of FencedResource %s) deleted by the namespace controller while the namespace terminates", r.kind, r.name, fr.Name)
	}
	return admission.Allowed("namespace teardown: the namespace controller deletes everything in a terminating namespace")
}

// namespaceTeardown is the verdict label of deletes during namespace teardown.
const namespaceTeardown = "NAMESPACE_TEARDOWN"

// respond applies the enforcement mode, records the decision and answers.
func (v *ProtectedObjectValidator) respond(r *request, fr *locksv1.FencedResource, stored fence.State, d fence.Decision) admission.Response {
	mode := fr.Spec.Enforcement
	if mode == "" {
		mode = locksv1.EnforcementShadow
	}
	if _, changes := r.write.FenceStateChange(); mode == locksv1.EnforcementShadow && !d.Verdict.Allowed() && changes {
		// Shadow lets unfenced content through, never fence state: whatever
		// the stored annotations say must have been accepted here.
		mode = locksv1.EnforcementEnforce
		d.Message += fmt.Sprintf(" (in Shadow too, the %s and %s annotations change only with an accepted segment)", fence.AnnotationFence, fence.AnnotationReceipts)
	}
	allowed := d.Verdict.Allowed() || mode == locksv1.EnforcementShadow
	recordDecision(r.Namespace, string(d.Verdict), string(mode), !d.Verdict.Allowed(), allowed)
	if !dryRun(r.Request) {
		v.observe(r, fr, d, stored)
	}
	switch {
	case d.Verdict.Allowed():
		return admission.Allowed(d.Message)
	case mode == locksv1.EnforcementShadow:
		return admission.Allowed("").WithWarnings("fencekeeper: would deny: " + d.Message)
	}
	if !dryRun(r.Request) {
		// The reason is CamelCase (the Kubernetes convention); the note
		// starts with the verdict code, as the denial's message does.
		v.Recorder.Eventf(fr, nil, corev1.EventTypeWarning, locksv1.EventReasonWriteDenied, "Deny",
			"%s (%s of %s %s by %s denied)", d.Message, strings.ToLower(string(r.Operation)), r.kind, r.name, r.UserInfo.Username)
	}
	return denied(d)
}

// denied is the admission denial of d: the message starts with the verdict,
// and the status details carry it as data (fence.CauseVerdict, and the
// original receipt of ALREADY_APPLIED as fence.CauseReceipt).
func denied(d fence.Decision) admission.Response {
	resp := admission.Denied(d.Message)
	causes := []metav1.StatusCause{{Type: fence.CauseVerdict, Message: string(d.Verdict)}}
	if d.Verdict == fence.AlreadyApplied && d.Receipt != "" {
		causes = append(causes, metav1.StatusCause{Type: fence.CauseReceipt, Message: d.Receipt})
	}
	resp.Result.Details = &metav1.StatusDetails{Causes: causes}
	return resp
}

// observe queues what the registry should know: the highest fence the target
// holds, regressions, and quarantined attempts.
// The highest fence is taken from the stored object, never from a write not
// yet committed (it may still fail), so highestObservedFence never overstates.
func (v *ProtectedObjectValidator) observe(req *request, fr *locksv1.FencedResource, d fence.Decision, stored fence.State) {
	key := types.NamespacedName{Namespace: fr.Namespace, Name: fr.Name}
	highest := stored.HighestFence
	switch {
	case d.Verdict == fence.FenceRegression:
		fenceRegressions.Inc()
		v.Status.observe(key, func(o *observation) {
			o.highestFence = max(o.highestFence, highest)
			o.regression = d.Message
		})
	case d.Verdict == fence.Quarantined && d.Envelope != nil:
		rec := locksv1.QuarantineRecord{
			Time: metav1.NewTime(v.Clock.Now()), User: req.UserInfo.Username, Fence: d.Envelope.Grant.FenceToken,
			Segment: d.Envelope.Segment, Operation: d.Envelope.Operation, Payload: d.Envelope.Payload,
		}
		for _, r := range d.State.Receipts {
			if r.Fence == rec.Fence && r.Segment == rec.Segment {
				rec.AcceptedPayload = r.Payload
			}
		}
		v.Recorder.Eventf(fr, nil, corev1.EventTypeWarning, locksv1.EventReasonWriteQuarantined, "Quarantine", "%s", d.Message)
		v.Status.observe(key, func(o *observation) { o.quarantine = append(o.quarantine, rec) })
	case highest > fr.Status.HighestObservedFence:
		v.Status.observe(key, func(o *observation) { o.highestFence = max(o.highestFence, highest) })
	}
}

// changed reports whether an update changes anything but server-managed metadata.
func changed(oldObj, newObj *unstructured.Unstructured) bool {
	a, b := withoutBookkeeping(oldObj), withoutBookkeeping(newObj)
	if newObj.GetDeletionTimestamp() != nil && len(newObj.GetFinalizers()) < len(oldObj.GetFinalizers()) {
		// Finishing a deletion (a controller dropping its finalizer) needs no
		// fence: the deletion itself was fenced.
		delete(a["metadata"].(map[string]any), "finalizers")
		delete(b["metadata"].(map[string]any), "finalizers")
	}
	return !reflect.DeepEqual(a, b)
}

func withoutBookkeeping(u *unstructured.Unstructured) map[string]any {
	c := u.DeepCopy().Object
	if md, ok := c["metadata"].(map[string]any); ok {
		for _, k := range []string{"resourceVersion", "generation", "managedFields", "uid", "creationTimestamp", "selfLink"} {
			delete(md, k)
		}
	}
	// status stays: a kind with a status subresource keeps the stored status
	// on writes of the object itself, so only a kind without one (where
	// status is ordinary content) can change it here.
	return c
}

func decodeObjects(req admission.Request) (oldObj, newObj *unstructured.Unstructured, err error) {
	dec := func(raw []byte) (*unstructured.Unstructured, error) {
		if len(raw) == 0 {
			return nil, nil
		}
		// Unstructured decoding keeps integers as int64, so payload digests of
		// large numbers stay exact.
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			return nil, err
		}
		return u, nil
	}
	if oldObj, err = dec(req.OldObject.Raw); err != nil {
		return nil, nil, fmt.Errorf("decode old object: %w", err)
	}
	if newObj, err = dec(req.Object.Raw); err != nil {
		return nil, nil, fmt.Errorf("decode new object: %w", err)
	}
	if oldObj == nil && newObj == nil {
		return nil, nil, fmt.Errorf("the admission request carries no object")
	}
	return oldObj, newObj, nil
}

func dryRun(req admission.Request) bool { return req.DryRun != nil && *req.DryRun }
