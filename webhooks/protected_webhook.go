package webhooks

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// ProtectedPath is where the acceptance webhook is served.
const ProtectedPath = "/validate-fencekeeper-protected"

// The generated registration covers ConfigMaps; custom-resource kinds are added
// to the same webhook's rules by configuration (see docs/protecting-objects.md).
// +kubebuilder:webhook:path=/validate-fencekeeper-protected,mutating=false,failurePolicy=fail,sideEffects=NoneOnDryRun,groups="",resources=configmaps,verbs=create;update;delete,versions=v1,name=vprotected.fencekeeper.dev,admissionReviewVersions=v1,timeoutSeconds=5,patch=`{"objectSelector":{"matchLabels":{"fencekeeper.dev/protected":"true"}},"namespaceSelector":{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"NotIn","values":["fencekeeper-system"]}]}}`

// +kubebuilder:rbac:groups=locks.fencekeeper.dev,resources=fencedresources/status,verbs=get;update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// ProtectedObjectValidator is the acceptance point for protected objects of
// any kind. It gathers the inputs of fence.Decide — the caller from userInfo,
// the stored state from the old object, the new content's digest, the trust
// bundle and a linearizable read of the FencedResource — and applies the
// FencedResource's enforcement mode to the verdict.
type ProtectedObjectValidator struct {
	// Reader must not be a cache: the registry read has to be linearizable.
	Reader   client.Reader
	Bundle   *TrustBundleSource
	Clock    clock.Clock
	Recorder events.EventRecorder
	Status   *StatusRecorder
}

// SetupProtectedWebhook registers the acceptance webhook and its status recorder.
func SetupProtectedWebhook(mgr ctrl.Manager, namespace string, clk clock.Clock) (*ProtectedObjectValidator, error) {
	status := NewStatusRecorder(mgr.GetClient(), mgr.GetAPIReader())
	if err := mgr.Add(status); err != nil {
		return nil, err
	}
	v := &ProtectedObjectValidator{
		Reader:   mgr.GetAPIReader(),
		Bundle:   &TrustBundleSource{Reader: mgr.GetClient(), Key: types.NamespacedName{Namespace: namespace, Name: locksv1.TrustBundleConfigMap}},
		Clock:    clk,
		Recorder: mgr.GetEventRecorder("fencekeeper-webhook"),
		Status:   status,
	}
	mgr.GetWebhookServer().Register(ProtectedPath, &webhook.Admission{Handler: v})
	return v, nil
}

// Handle decides one admission request.
func (v *ProtectedObjectValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	defer func() { decisionLatency.WithLabelValues(string(req.Operation)).Observe(time.Since(start).Seconds()) }()

	oldObj, newObj, err := decodeObjects(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	subject := newObj
	if subject == nil {
		subject = oldObj
	}
	// The binding to a registry entry is the stored object's, so that changing
	// or removing the annotation is judged against the entry it leaves.
	binding := subject.GetAnnotations()[fence.AnnotationResource]
	rebound := ""
	if oldObj != nil {
		if b := oldObj.GetAnnotations()[fence.AnnotationResource]; b != "" {
			if newObj != nil && newObj.GetAnnotations()[fence.AnnotationResource] != b {
				rebound = b
			}
			binding = b
		}
	}
	fr, reg, err := v.registry(ctx, req.Namespace, binding, subject)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	bundle, err := v.Bundle.Get(ctx)
	if err != nil {
		return admission.Errored(http.StatusServiceUnavailable, err)
	}

	if rebound != "" && newObj != nil {
		// The binding to a registry entry is part of what the fence protects.
		return v.respond(ctx, req, fr, subject, fence.State{}, fence.Decision{Verdict: fence.WrongResource,
			Message: fmt.Sprintf("WRONG_RESOURCE: the %s annotation cannot change (it names %s)", fence.AnnotationResource, rebound)})
	}
	attempt := fence.Attempt{User: req.UserInfo.Username, Delete: req.Operation == admissionv1.Delete}
	st := storedState(oldObj, fr, bundle)
	if newObj != nil {
		attempt.Changed = oldObj == nil || changed(oldObj, newObj)
		attempt.Fence = newObj.GetAnnotations()[fence.AnnotationFence]
		if attempt.Payload, err = fence.PayloadDigest(fence.ObjectPayload(newObj.Object)); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("digest of the new content: %w", err))
		}
	}
	d := fence.Decide(st, attempt, reg, bundle)
	if d.Verdict == fence.Accepted && newObj != nil {
		d = checkReceiptLog(d, st, newObj)
	}
	return v.respond(ctx, req, fr, subject, st, d)
}

// registry reads the FencedResource with a GET to the API server (a quorum
// read, never the informer cache) and checks that its target names the object.
func (v *ProtectedObjectValidator) registry(ctx context.Context, ns, name string, obj *unstructured.Unstructured) (*locksv1.FencedResource, fence.Registry, error) {
	reg := fence.Registry{Now: v.Clock.Now()}
	if name == "" {
		reg.Missing = fmt.Sprintf("the protected object has no %s annotation naming its FencedResource", fence.AnnotationResource)
		return nil, reg, nil
	}
	var fr locksv1.FencedResource
	if err := v.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &fr); err != nil {
		if apierrors.IsNotFound(err) {
			reg.Missing = fmt.Sprintf("FencedResource %s/%s named by %s does not exist", ns, name, fence.AnnotationResource)
			return nil, reg, nil
		}
		return nil, reg, fmt.Errorf("read FencedResource %s/%s: %w", ns, name, err)
	}
	t := fr.Spec.Target
	if t == nil || t.APIVersion != obj.GetAPIVersion() || t.Kind != obj.GetKind() || t.Name != obj.GetName() {
		// Not this object's entry: its mode and records do not apply (fail closed).
		reg.Missing = fmt.Sprintf("FencedResource %s/%s does not name this %s %q as its target", ns, name, obj.GetKind(), obj.GetName())
		return nil, reg, nil
	}
	reg.Found, reg.ResourceID, reg.Generation = true, fr.Spec.ResourceID, fr.Generation
	if h := fr.Status.Holder; h != nil {
		reg.Holder = &fence.Holder{Digest: h.Digest, Owner: h.Owner, Lease: h.Lease, RequestID: h.RequestID, Fence: h.FenceToken, ExpiresAt: h.ExpiresAt.Time}
	}
	return &fr, reg, nil
}

// storedState is the fence state the object holds. It is trusted only if its
// grant verifies: an annotation planted while the entry was in Shadow mode, or
// mangled by hand, counts for nothing. It never falls below the highest fence
// the registry saw at the target, so deleting and re-creating the object, or a
// planted state, cannot let an older fence in.
func storedState(oldObj *unstructured.Unstructured, fr *locksv1.FencedResource, bundle *grant.TrustBundle) fence.State {
	var st fence.State
	if oldObj != nil {
		ann := oldObj.GetAnnotations()
		parsed, err := fence.StateOf(ann[fence.AnnotationFence], ann[fence.AnnotationReceipts])
		if err == nil && parsed.Accepted != "" {
			e, _ := fence.ParseEnvelope(parsed.Accepted)
			if bundle.Verify(e.Grant, e.Grant.Digest(), e.Proof) != nil {
				parsed = fence.State{}
			}
		}
		if err == nil {
			st = parsed
		}
	}
	if fr != nil && fr.Status.HighestObservedFence > st.HighestFence {
		st = fence.State{HighestFence: fr.Status.HighestObservedFence}
	}
	return st
}

// respond applies the enforcement mode, records the decision and answers.
func (v *ProtectedObjectValidator) respond(ctx context.Context, req admission.Request, fr *locksv1.FencedResource, obj *unstructured.Unstructured, stored fence.State, d fence.Decision) admission.Response {
	mode := locksv1.EnforcementEnforce // no registry entry: fail closed
	if fr != nil && fr.Spec.Enforcement != "" {
		mode = fr.Spec.Enforcement
	}
	allowed := d.Verdict.Allowed() || mode == locksv1.EnforcementShadow
	decisions.WithLabelValues(string(d.Verdict), string(mode), fmt.Sprint(allowed)).Inc()
	if fr != nil && !dryRun(req) {
		v.observe(req, fr, d, stored)
	}
	switch {
	case d.Verdict.Allowed():
		return admission.Allowed(d.Message)
	case mode == locksv1.EnforcementShadow:
		return admission.Allowed("").WithWarnings("fencekeeper: would deny: " + d.Message)
	}
	if fr != nil && !dryRun(req) {
		v.Recorder.Eventf(fr, nil, corev1.EventTypeWarning, string(d.Verdict), "Deny",
			"%s of %s %s by %s denied: %s", strings.ToLower(string(req.Operation)), obj.GetKind(), obj.GetName(), req.UserInfo.Username, d.Message)
	}
	return admission.Denied(d.Message)
}

// observe queues what the registry should know: the highest fence the target
// holds, regressions, and quarantined attempts.
// The highest fence is taken from the stored object, never from a write not
// yet committed (it may still fail), so highestObservedFence never overstates.
func (v *ProtectedObjectValidator) observe(req admission.Request, fr *locksv1.FencedResource, d fence.Decision, stored fence.State) {
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
		v.Recorder.Eventf(fr, nil, corev1.EventTypeWarning, string(fence.Quarantined), "Quarantine", "%s", d.Message)
		v.Status.observe(key, func(o *observation) { o.quarantine = append(o.quarantine, rec) })
	case highest > fr.Status.HighestObservedFence:
		v.Status.observe(key, func(o *observation) { o.highestFence = max(o.highestFence, highest) })
	}
}

// checkReceiptLog requires the written receipt log to be the stored log plus
// the accepted segment, so the business change and its receipt are one write.
func checkReceiptLog(d fence.Decision, stored fence.State, newObj *unstructured.Unstructured) fence.Decision {
	got, err := fence.ParseReceipts(newObj.GetAnnotations()[fence.AnnotationReceipts])
	want := d.State.Receipts
	if err == nil && reflect.DeepEqual(append([]fence.Receipt{}, got...), append([]fence.Receipt{}, want...)) {
		return d
	}
	detail := "it differs"
	if err != nil {
		detail = err.Error()
	}
	return fence.Decision{Verdict: fence.ReceiptLogMismatch, State: stored, Envelope: d.Envelope, Message: fmt.Sprintf(
		"RECEIPT_LOG_MISMATCH: the %s annotation must be the stored log plus this segment's receipt %s (newest %d kept); %s",
		fence.AnnotationReceipts, d.Receipt, fence.MaxReceipts, detail)}
}

// changed reports whether an update changes anything but server-managed metadata.
func changed(oldObj, newObj *unstructured.Unstructured) bool {
	a, b := comparable(oldObj), comparable(newObj)
	if newObj.GetDeletionTimestamp() != nil && len(newObj.GetFinalizers()) < len(oldObj.GetFinalizers()) {
		// Finishing a deletion (a controller dropping its finalizer) needs no
		// fence: the deletion itself was fenced.
		delete(a["metadata"].(map[string]any), "finalizers")
		delete(b["metadata"].(map[string]any), "finalizers")
	}
	return !reflect.DeepEqual(a, b)
}

func comparable(u *unstructured.Unstructured) map[string]any {
	c := u.DeepCopy().Object
	if md, ok := c["metadata"].(map[string]any); ok {
		for _, k := range []string{"resourceVersion", "generation", "managedFields", "uid", "creationTimestamp", "selfLink"} {
			delete(md, k)
		}
	}
	delete(c, "status") // written through the status subresource, not intercepted here
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
