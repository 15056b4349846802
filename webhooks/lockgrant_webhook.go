package webhooks

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// The owner's renewals, releases and deletes skip the webhook: the owner
// needs no other authority, and the CRD's CEL rules keep the spec's
// (immutable fields, renewals only grow, release only set). That takes an
// admission round trip off every renewal and handoff. Creates, anyone else's
// changes and a change of what the owner attaches to it (labels,
// annotations, finalizers, owner references: bounded, and the
// unresolved-mutation record must be one) come here. A map or list that is
// absent, or empty, counts as empty; a DELETE has no object. So does a
// change by the owner's identity from another pod than the one a pod-bound
// LockGrant names (spec.lease "pod:<UID>", see grant.PodLease): replicas
// sharing a ServiceAccount cannot renew, release or withdraw each other's
// requests.
// +kubebuilder:webhook:path=/validate-locks-fencekeeper-dev-v1alpha1-lockgrant,mutating=false,failurePolicy=fail,sideEffects=NoneOnDryRun,groups=locks.fencekeeper.dev,resources=lockgrants,verbs=create;update;delete,versions=v1alpha1,name=vlockgrant.fencekeeper.dev,admissionReviewVersions=v1,timeoutSeconds=5,patch=`{"matchConditions":[{"name":"not-the-owners-renewal-or-release","expression":"request.operation == 'CREATE' || oldObject == null || request.userInfo.username != oldObject.spec.owner || (oldObject.spec.lease.startsWith('pod:') && !(has(request.userInfo.extra) && 'authentication.kubernetes.io/pod-uid' in request.userInfo.extra && request.userInfo.extra['authentication.kubernetes.io/pod-uid'] == [oldObject.spec.lease.substring(4)])) || (object != null && ['labels', 'annotations', 'finalizers', 'ownerReferences'].exists(f, (f in object.metadata && size(object.metadata[f]) > 0) != (f in oldObject.metadata && size(oldObject.metadata[f]) > 0) || (f in object.metadata && f in oldObject.metadata && object.metadata[f] != oldObject.metadata[f])))"}]}`

// The namespace controller's deletes are allowed only while the namespace
// terminates, which the webhook reads from the API server.
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get

// LockGrantValidator admits LockGrants: the owner is the requesting user, the
// FencedResource exists and its policy allows the request, and a name of the
// client library's form is that request's own. A LockGrant belongs to its owner: only the owner changes (metadata
// included) or deletes it, except the operator, an RBAC-authorized
// break-glass, and the namespace controller emptying a terminating namespace.
type LockGrantValidator struct {
	// Reader serves uncached reads of FencedResources, LockGrants and Namespaces.
	Reader client.Reader
	// Cache serves cached reads of FencedResources (nil: Reader serves them).
	Cache client.Reader
	// Operator is the operator's user name (it writes statuses and removes the legacy release finalizer).
	Operator string
	// BreakGlass authorizes overrides by anyone else.
	BreakGlass *BreakGlassAuthorizer
	// Recorder audits every override with an Event.
	Recorder events.EventRecorder
}

// SetupLockGrantWebhook registers the validator with the manager's webhook
// server; namespace is the operator's (its identity is that namespace's
// service account).
func SetupLockGrantWebhook(mgr ctrl.Manager, namespace string) error {
	return ctrl.NewWebhookManagedBy(mgr, &locksv1.LockGrant{}).
		WithValidator(&LockGrantValidator{
			Reader:     mgr.GetAPIReader(),
			Cache:      mgr.GetClient(),
			Operator:   locksv1.OperatorUsername(namespace),
			BreakGlass: &BreakGlassAuthorizer{Client: mgr.GetClient()},
			Recorder:   mgr.GetEventRecorder("fencekeeper-webhook"),
		}).
		Complete()
}

// ValidateCreate checks a new request against the requesting user and the registry.
func (v *LockGrantValidator) ValidateCreate(ctx context.Context, lg *locksv1.LockGrant) (admission.Warnings, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return nil, err
	}
	fr, err := v.fencedResource(ctx, types.NamespacedName{Namespace: lg.Namespace, Name: lg.Spec.Resource})
	if apierrors.IsNotFound(err) {
		return nil, invalidLockGrant(lg, field.ErrorList{field.Invalid(field.NewPath("spec", "resource"), lg.Spec.Resource,
			fmt.Sprintf("FencedResource %q does not exist in namespace %q; create it first", lg.Spec.Resource, lg.Namespace))})
	} else if err != nil {
		return nil, fmt.Errorf("read FencedResource %s/%s: %w", lg.Namespace, lg.Spec.Resource, err)
	}
	return nil, invalidLockGrant(lg, append(validateLockGrantCreate(req.UserInfo.Username, locksv1.RequestPod(req.UserInfo), lg, fr), validateAttachedMetadata(nil, lg)...))
}

// fencedResource reads a request's FencedResource from the cache, and from
// the API server when the cache does not have it (yet). A cached copy may
// lag a policy change (allowedOwners, operationCategories): that is safe,
// because the issuer checks the policy again before it issues and denies the
// request then; a FencedResource created a moment ago is not refused for
// the cache's lag.
func (v *LockGrantValidator) fencedResource(ctx context.Context, key types.NamespacedName) (*locksv1.FencedResource, error) {
	var fr locksv1.FencedResource
	if v.Cache != nil {
		err := v.Cache.Get(ctx, key, &fr)
		if err == nil {
			return &fr, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, err
		}
	}
	if err := v.Reader.Get(ctx, key, &fr); err != nil {
		return nil, err
	}
	return &fr, nil
}

// invalidLockGrant is the 422 answer for errs (nil when there are none).
func invalidLockGrant(lg *locksv1.LockGrant, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(locksv1.GroupVersion.WithKind("LockGrant").GroupKind(), lg.Name, errs)
}

// ValidateUpdate lets only the owner change the LockGrant, metadata included.
func (v *LockGrantValidator) ValidateUpdate(ctx context.Context, oldLG, newLG *locksv1.LockGrant) (admission.Warnings, error) {
	return nil, v.admitChange(ctx, oldLG, newLG)
}

// ValidateDelete lets only the owner delete the LockGrant (deleting a held
// grant releases it and hands the resource to the next waiter).
func (v *LockGrantValidator) ValidateDelete(ctx context.Context, lg *locksv1.LockGrant) (admission.Warnings, error) {
	return nil, v.admitChange(ctx, lg, nil)
}

// admitChange gathers who asks (and, only for a caller other than the owner
// or the operator, the break-glass review and the namespace's state), decides
// with authorizeLockGrant and audits overrides. newLG is nil for a delete.
func (v *LockGrantValidator) admitChange(ctx context.Context, oldLG, newLG *locksv1.LockGrant) error {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return err
	}
	call := lockGrantCall{User: req.UserInfo.Username, Pod: locksv1.RequestPod(req.UserInfo), Owner: oldLG.Spec.Owner, Lease: oldLG.Spec.Lease,
		Operator: v.Operator, Delete: newLG == nil}
	if newLG != nil {
		call.Changes = lockGrantChanges(oldLG, newLG)
	}
	var ns *corev1.Namespace
	if call.foreign() {
		if ns, err = v.gatherAuthority(ctx, req, oldLG, &call); err != nil {
			return apierrors.NewInternalError(err)
		}
	}
	via, denied := authorizeLockGrant(call)
	var errs field.ErrorList
	if newLG != nil {
		errs = validateLockGrantUpdate(via, oldLG, newLG)
	}
	op := string(req.Operation)
	switch {
	case len(denied) > 0:
		lockGrantDenied.WithLabelValues(op).Inc()
		return apierrors.NewForbidden(locksv1.GroupVersion.WithResource("lockgrants").GroupResource(), oldLG.Name, denied.ToAggregate())
	case len(errs) > 0:
		return apierrors.NewInvalid(locksv1.GroupVersion.WithKind("LockGrant").GroupKind(), oldLG.Name, errs)
	}
	if req.DryRun == nil || !*req.DryRun {
		v.audit(via, call, oldLG, ns)
	}
	return nil
}

// gatherAuthority fills what authorizeLockGrant needs about a foreign caller:
// whether the namespace terminates (asked only for the namespace controller's
// deletes) and whether the caller holds the break-glass verb.
func (v *LockGrantValidator) gatherAuthority(ctx context.Context, req admission.Request, lg *locksv1.LockGrant, call *lockGrantCall) (*corev1.Namespace, error) {
	var ns *corev1.Namespace
	if call.Delete && call.User == locksv1.NamespaceControllerUsername {
		ns = &corev1.Namespace{}
		if err := v.Reader.Get(ctx, types.NamespacedName{Name: lg.Namespace}, ns); err != nil {
			return nil, fmt.Errorf("read Namespace %s: %w", lg.Namespace, err)
		}
		call.NamespaceTerminating = ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating
		if call.NamespaceTerminating {
			return ns, nil
		}
	}
	ok, err := v.BreakGlass.Allowed(ctx, req.UserInfo, locksv1.GroupVersion.Group, "lockgrants", lg.Namespace, lg.Name)
	call.BreakGlass = ok
	return ns, err
}

// audit records an admitted override: an Event and a metric. A terminating
// namespace accepts no new Events, so a namespace deletion is recorded on the
// Namespace (its Events live in the default namespace).
func (v *LockGrantValidator) audit(via lockGrantAuthority, call lockGrantCall, lg *locksv1.LockGrant, ns *corev1.Namespace) {
	what := "delete"
	if !call.Delete {
		what = "change " + joinPaths(call.Changes) + " of"
	}
	switch via {
	case viaBreakGlass:
		lockGrantBreakGlass.WithLabelValues(opName(call.Delete)).Inc()
		v.Recorder.Eventf(lg, nil, corev1.EventTypeWarning, locksv1.EventReasonBreakGlass, opName(call.Delete),
			"break-glass: %q was admitted to %s LockGrant %s of owner %q (phase %s)", call.User, what, lg.Name, call.Owner, phaseOf(lg))
	case viaNamespaceDeletion:
		lockGrantNamespaceDeletions.Inc()
		v.Recorder.Eventf(ns, lg, corev1.EventTypeNormal, locksv1.EventReasonNamespaceDeletion, opName(call.Delete),
			"namespace %s terminates: %q was admitted to delete LockGrant %s of owner %q (phase %s)", ns.Name, call.User, lg.Name, call.Owner, phaseOf(lg))
	}
}

func opName(del bool) string {
	if del {
		return "Delete"
	}
	return "Update"
}

func phaseOf(lg *locksv1.LockGrant) string {
	if lg.Status.Phase == "" {
		return "unset"
	}
	return string(lg.Status.Phase)
}

// validateLockGrantCreate checks a new request against the requesting user
// and pod, the FencedResource's policy and the request's name.
func validateLockGrantCreate(user, pod string, lg *locksv1.LockGrant, fr *locksv1.FencedResource) field.ErrorList {
	spec := field.NewPath("spec")
	if lg.Spec.Owner != user {
		return field.ErrorList{field.Invalid(spec.Child("owner"), lg.Spec.Owner,
			fmt.Sprintf("must equal the requesting user %q: a LockGrant can only be requested for yourself (set spec.owner to %q; kubectl auth whoami prints it)", user, user))}
	}
	if msg := leaseViolation(lg.Spec.Lease, pod); msg != "" {
		return field.ErrorList{field.Invalid(spec.Child("lease"), lg.Spec.Lease, msg)}
	}
	if err := locksv1.UnsignableRequest(lg.Spec); err != nil {
		return field.ErrorList{field.Invalid(spec, "", fmt.Sprintf("no grant can be signed for this request: %v", err))}
	}
	switch reason, _ := fr.PolicyViolation(user, lg.Spec.OperationCategory); reason {
	case locksv1.ReasonOwnerNotAllowed:
		return field.ErrorList{field.Forbidden(spec.Child("owner"), fmt.Sprintf("%q is not in FencedResource %s spec.allowedOwners", user, fr.Name))}
	case locksv1.ReasonCategoryDenied:
		return field.ErrorList{field.NotSupported(spec.Child("operationCategory"), lg.Spec.OperationCategory, fr.Spec.OperationCategories)}
	}
	return validateLockGrantName(lg)
}

// validateLockGrantName keeps the library's names for their own requests.
// Any name is admitted but one of LockGrantName's form (a dash and 16 hex
// digits at the end), which must be LockGrantName of this very request:
// otherwise another owner could create, under the name an owner's client will
// use, a LockGrant that blocks that client's create (AlreadyExists).
func validateLockGrantName(lg *locksv1.LockGrant) field.ErrorList {
	spec := field.NewPath("spec")
	if strings.ContainsRune(lg.Spec.RequestID, 0) {
		// The name hashes resource, owner and requestID joined by NUL.
		return field.ErrorList{field.Invalid(spec.Child("requestID"), lg.Spec.RequestID, "must not contain the NUL character")}
	}
	want := locksv1.LockGrantName(lg.Spec.Resource, lg.Spec.Owner, lg.Spec.RequestID)
	if !locksv1.LockGrantNameForm(lg.Name) || lg.Name == want {
		return nil
	}
	return field.ErrorList{field.Invalid(field.NewPath("metadata", "name"), lg.Name, fmt.Sprintf(
		"must be %q: a name ending in a dash and 16 lowercase hex digits is reserved for the name the client library derives from "+
			"(spec.resource, spec.owner, spec.requestID), so that nobody can take the name another owner's request will have; "+
			"use that name, or any name that does not end in a dash and 16 hex digits", want))}
}

// leaseViolation says why a request from pod ("" for none) may not carry
// lease ("" when it may). A pod's request is bound to that pod, so that no
// other replica of its identity can use the grant; a request without a pod
// cannot name one.
func leaseViolation(lease, pod string) string {
	_, names := grant.LeasePod(lease)
	switch {
	case pod != "" && lease != grant.PodLease(pod):
		return fmt.Sprintf("must be %q: the request comes from pod %s (its bound service-account token says so), and a pod's grant is bound to that pod so that other replicas of its identity cannot use it (pkg/lockclient fills it in)",
			grant.PodLease(pod), pod)
	case pod == "" && names:
		return fmt.Sprintf("must not start with %q: only a request from that pod (its bound service-account token) may bind a grant to a pod, and this request carries no pod", grant.PodLeasePrefix)
	}
	return ""
}

// lockGrantAuthority is why a change or delete of a LockGrant is admitted.
type lockGrantAuthority string

const (
	viaNoChange          lockGrantAuthority = "no-change"
	viaOwner             lockGrantAuthority = "owner"
	viaOperator          lockGrantAuthority = "operator"
	viaNamespaceDeletion lockGrantAuthority = "namespace-deletion"
	viaBreakGlass        lockGrantAuthority = "break-glass"
)

// lockGrantCall is one UPDATE or DELETE of a LockGrant and what is known
// about its requester.
type lockGrantCall struct {
	// User is the requester and Pod the pod its token names ("" for none);
	// Owner and Lease are the stored spec's; Operator is the operator's user name.
	User, Pod, Owner, Lease, Operator string
	// Delete is a DELETE; otherwise Changes lists what the UPDATE changes.
	Delete  bool
	Changes []*field.Path
	// NamespaceTerminating: the LockGrant's namespace is being deleted.
	NamespaceTerminating bool
	// BreakGlass: a SubjectAccessReview allowed User the break-glass verb.
	BreakGlass bool
}

// foreign reports whether the call changes something and comes from neither
// the owner nor the operator: only then is more authority needed (and looked up).
func (c lockGrantCall) foreign() bool {
	return (c.Delete || len(c.Changes) > 0) && !c.owns() && c.User != c.Operator
}

// owns reports whether the call comes from the LockGrant's owner and, for a
// pod-bound request, from its pod.
func (c lockGrantCall) owns() bool {
	return c.User == c.Owner && grant.LeaseAdmits(c.Lease, c.Pod)
}

// authorizeLockGrant decides who may change or delete a LockGrant: its owner,
// the operator, the namespace controller deleting it from a terminating
// namespace, or a break-glass user. Anyone else gets one Forbidden error per
// changed field (for a delete, on spec.owner) naming the owner and the requester.
func authorizeLockGrant(c lockGrantCall) (lockGrantAuthority, field.ErrorList) {
	switch {
	case !c.Delete && len(c.Changes) == 0:
		return viaNoChange, nil
	case c.owns():
		return viaOwner, nil
	case c.User == c.Operator:
		return viaOperator, nil
	case c.Delete && c.User == locksv1.NamespaceControllerUsername && c.NamespaceTerminating:
		return viaNamespaceDeletion, nil
	case c.BreakGlass:
		return viaBreakGlass, nil
	}
	verb := "delete"
	if !c.Delete {
		verb = "change"
	}
	msg := fmt.Sprintf("the LockGrant belongs to %q; %q may not %s it (only its owner, the operator, or a user granted the %q verb on lockgrants may)",
		c.Owner, c.User, verb, BreakGlassVerb)
	if c.User == c.Owner {
		msg = fmt.Sprintf("%s: the LockGrant is bound to its requester's pod (lease %s); %s of %q may not %s it (only that pod, the operator, or a user granted the %q verb on lockgrants may)",
			fence.WrongOwner, c.Lease, grant.DescribePod(c.Pod), c.User, verb, BreakGlassVerb)
	}
	if c.Delete {
		return "", field.ErrorList{field.Forbidden(field.NewPath("spec", "owner"), msg)}
	}
	var errs field.ErrorList
	for _, p := range c.Changes {
		errs = append(errs, field.Forbidden(p, msg))
	}
	return "", errs
}

// lockGrantChanges lists what an UPDATE changes in metadata and spec, leaving
// out what the server keeps (resourceVersion, generation, managedFields, the
// deletion timestamp and grace period) and, on a terminating LockGrant, the
// garbage collector's removal of its own finalizers (the delete was already
// authorized; the object would otherwise never go).
func lockGrantChanges(oldLG, newLG *locksv1.LockGrant) []*field.Path {
	terminating := oldLG.DeletionTimestamp != nil
	oldM, newM := userMetadata(&oldLG.ObjectMeta, terminating), userMetadata(&newLG.ObjectMeta, terminating)
	meta, spec := field.NewPath("metadata"), field.NewPath("spec")
	var out []*field.Path
	diff := func(p *field.Path, a, b any) {
		if !equality.Semantic.DeepEqual(a, b) {
			out = append(out, p)
		}
	}
	out = append(out, changedKeys(meta.Child("labels"), oldM.Labels, newM.Labels)...)
	out = append(out, changedKeys(meta.Child("annotations"), oldM.Annotations, newM.Annotations)...)
	diff(meta.Child("finalizers"), oldM.Finalizers, newM.Finalizers)
	diff(meta.Child("ownerReferences"), oldM.OwnerReferences, newM.OwnerReferences)
	oldM.Labels, oldM.Annotations, oldM.Finalizers, oldM.OwnerReferences = nil, nil, nil, nil
	newM.Labels, newM.Annotations, newM.Finalizers, newM.OwnerReferences = nil, nil, nil, nil
	diff(meta, oldM, newM)
	diff(spec.Child("renewals"), oldLG.Spec.Renewals, newLG.Spec.Renewals)
	diff(spec.Child("release"), oldLG.Spec.Release, newLG.Spec.Release)
	oldS, newS := oldLG.Spec, newLG.Spec
	oldS.Renewals, oldS.Release, newS.Renewals, newS.Release = 0, false, 0, false
	diff(spec, oldS, newS)
	return out
}

// changedKeys names each key added, removed or changed between a and b, in
// key order, so denials and audit records say exactly which entry moved.
func changedKeys(p *field.Path, a, b map[string]string) []*field.Path {
	var keys []string
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			keys = append(keys, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	out := make([]*field.Path, len(keys))
	for i, k := range keys {
		out[i] = p.Key(k)
	}
	return out
}

// userMetadata is the metadata a client decides: server bookkeeping cleared.
func userMetadata(m *metav1.ObjectMeta, terminating bool) metav1.ObjectMeta {
	c := *m.DeepCopy()
	c.ResourceVersion, c.Generation, c.ManagedFields = "", 0, nil
	c.DeletionTimestamp, c.DeletionGracePeriodSeconds = nil, nil
	c.CreationTimestamp, c.UID, c.SelfLink = metav1.Time{}, "", "" //nolint:staticcheck // SA1019: a client may still send selfLink; it is not the client's metadata
	if terminating {
		c.Finalizers = slices.DeleteFunc(c.Finalizers, func(f string) bool {
			return f == metav1.FinalizerOrphanDependents || f == metav1.FinalizerDeleteDependents
		})
	}
	return c
}

// validateLockGrantUpdate judges an admitted update: the spec's rules
// whoever asks, and what is attached to it when the owner changed it. A
// break-glass user and the operator override ownership, audited; what they
// store is bounded in the operator's cache and an unreadable record is
// reported there, so an on-call engineer is never stopped by these checks.
func validateLockGrantUpdate(via lockGrantAuthority, oldLG, newLG *locksv1.LockGrant) field.ErrorList {
	errs := validateLockGrantSpecUpdate(oldLG, newLG)
	if via == viaOwner {
		errs = append(errs, validateAttachedMetadata(oldLG, newLG)...)
	}
	return errs
}

// validateAttachedMetadata keeps what a tenant attaches to a LockGrant within
// locksv1.MaxLockGrantMetadataBytes and its unresolved-mutation record
// readable; oldLG is nil for a create. Every operator replica caches every
// LockGrant, so without a bound one tenant's annotations grow the memory of
// all of them. A LockGrant already over the budget (stored before it existed,
// or by break-glass) may change as long as it does not grow, and the record
// is judged only when it changes: removing either is always allowed.
func validateAttachedMetadata(oldLG, newLG *locksv1.LockGrant) field.ErrorList {
	var errs field.ErrorList
	size := attachedMetadataBytes(&newLG.ObjectMeta)
	if size > locksv1.MaxLockGrantMetadataBytes && (oldLG == nil || size > attachedMetadataBytes(&oldLG.ObjectMeta)) {
		errs = append(errs, field.Invalid(field.NewPath("metadata"), fmt.Sprintf("%d bytes", size),
			fmt.Sprintf("the labels, annotations, finalizers and ownerReferences of a LockGrant may hold at most %d bytes together (keys and values); these hold %d bytes",
				locksv1.MaxLockGrantMetadataBytes, size)))
	}
	raw, ok := newLG.Annotations[locksv1.AnnotationUnresolvedMutation]
	if !ok {
		return errs
	}
	if oldLG != nil {
		if was, had := oldLG.Annotations[locksv1.AnnotationUnresolvedMutation]; had && was == raw {
			return errs
		}
	}
	if _, err := locksv1.ParseUnresolvedMutation(raw); err != nil {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "annotations").Key(locksv1.AnnotationUnresolvedMutation), field.OmitValueType{},
			fmt.Sprintf("%v; the record is the JSON object pkg/lockclient writes (object, operation, fence, segment, payload, since), at most %d bytes; remove the annotation once the write is reconciled",
				err, locksv1.MaxUnresolvedMutationBytes)))
	}
	return errs
}

// attachedMetadataBytes counts what a client attaches to an object: label
// and annotation keys and values, finalizers and owner references.
func attachedMetadataBytes(m *metav1.ObjectMeta) int {
	n := 0
	for k, v := range m.Labels {
		n += len(k) + len(v)
	}
	for k, v := range m.Annotations {
		n += len(k) + len(v)
	}
	for _, f := range m.Finalizers {
		n += len(f)
	}
	for _, r := range m.OwnerReferences {
		n += len(r.APIVersion) + len(r.Kind) + len(r.Name) + len(r.UID)
	}
	return n
}

// validateLockGrantSpecUpdate keeps the spec's rules, whoever asks: everything
// but renewals and release is immutable, renewals only grow, release cannot be
// undone. The CRD's CEL rules say the same; this holds if they are missing.
func validateLockGrantSpecUpdate(oldLG, newLG *locksv1.LockGrant) field.ErrorList {
	spec := field.NewPath("spec")
	o, n := oldLG.Spec, newLG.Spec
	var errs field.ErrorList
	for _, f := range []struct{ name, old, new string }{
		{"resource", o.Resource, n.Resource}, {"owner", o.Owner, n.Owner}, {"requestID", o.RequestID, n.RequestID},
		{"lease", o.Lease, n.Lease}, {"operationRoot", o.OperationRoot, n.OperationRoot},
		{"operationCategory", o.OperationCategory, n.OperationCategory},
	} {
		if f.old != f.new {
			errs = append(errs, field.Invalid(spec.Child(f.name), f.new, fmt.Sprintf("is immutable (was %q)", f.old)))
		}
	}
	if n.Renewals < o.Renewals {
		errs = append(errs, field.Invalid(spec.Child("renewals"), n.Renewals, fmt.Sprintf("may only grow (was %d)", o.Renewals)))
	}
	if o.Release && !n.Release {
		errs = append(errs, field.Invalid(spec.Child("release"), n.Release, "cannot be undone once true"))
	}
	return errs
}

func joinPaths(ps []*field.Path) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}
