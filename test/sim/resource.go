package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"strconv"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/webhooks"
)

// AcceptFunc is an admission handler: the acceptance point of protected writes.
type AcceptFunc func(context.Context, admission.Request) admission.Response

// resource is the in-memory API server of the protected ConfigMap. Like the
// real one, it checks the resourceVersion precondition, calls the validating
// webhook for objects that match its objectSelector (old or new object
// labelled protected) with the stored object as the old object, and writes
// only what the webhook allowed — one atomic step, as the apiserver runs
// admission inside its compare-and-swap.
type resource struct {
	w          *world
	stored     map[string]any // JSON form; nil while the object does not exist
	storedJSON []byte         // its encoding, as the webhook receives it
	rv         int64
	accept     AcceptFunc
	uid        int
}

// observation is what the webhook's StatusRecorder queues for the FencedResource status.
type observation struct {
	highest    int64
	regression string
}

func newResource(w *world) *resource {
	reader := apiReader{w.reg}
	v := &webhooks.ProtectedObjectValidator{
		Reader:   reader,
		Index:    reader,
		Bundle:   &webhooks.TrustBundleSource{Reader: reader, Key: types.NamespacedName{Namespace: locksv1.DefaultNamespace, Name: locksv1.TrustBundleConfigMap}},
		Clock:    w.clock,
		Recorder: discardEvents{},
		// Never started: the recorder only queues here, and the simulator
		// delivers the same observations itself (see observe), on its schedule.
		Status: webhooks.NewStatusRecorder(nil, nil),
	}
	s := &resource{w: w, accept: v.Handle}
	if w.cfg.Acceptance != nil {
		s.accept = w.cfg.Acceptance(s.accept)
	}
	return s
}

// serve answers a read or a write of the protected object.
func (s *resource) serve(req *request) *reply {
	rp := &reply{req: req}
	if req.kind == reqGetObject {
		if s.stored != nil {
			rp.object = runtime.DeepCopyJSON(s.stored)
		}
		return rp
	}
	old := s.stored
	switch {
	case req.create && old != nil:
		rp.status = replyAlreadyExists
	case !req.create && old == nil:
		rp.status = replyNotFound
	case !req.create && req.rv != "" && req.rv != strconv.FormatInt(s.rv, 10):
		rp.status = replyConflict
	}
	if rp.status != replyOK { // refused before admission
		s.w.res.countRefusal(rp.status, req.fault)
		return rp
	}
	obj := runtime.DeepCopyJSON(req.object)
	allowed := true
	if isProtected(old) || isProtected(obj) { // the webhook's objectSelector
		resp := s.admit(req.user, old, obj)
		rp.verdict, rp.message = verdictOf(resp)
		allowed = resp.Allowed
		s.w.res.countVerdict(rp.verdict, req.fault)
		s.observe(old, rp.verdict)
	}
	mutation := old == nil || !sameObject(old, obj)
	s.w.oracle.judgeWrite(req, old, obj, allowed && mutation, rp.verdict)
	if !allowed {
		rp.status = replyDenied
		if s.w.cfg.Trace {
			s.w.tracef("object: %s by %s DENIED %s", s.w.describeWrite(req.object), req.user, rp.message)
		}
		return rp
	}
	if mutation {
		s.rv++
		setRV(obj, strconv.FormatInt(s.rv, 10))
		s.stored, s.storedJSON = obj, mustJSON(obj)
		if s.w.cfg.Trace {
			s.w.tracef("object: %s by %s %s", s.w.describeWrite(req.object), req.user, rp.verdict)
		}
	}
	return rp
}

// admit sends the write to the acceptance point as the apiserver would.
func (s *resource) admit(user string, old, obj map[string]any) admission.Response {
	s.uid++
	op := admissionv1.Update
	var oldRaw []byte
	if old == nil {
		op = admissionv1.Create
	} else {
		oldRaw = s.storedJSON
	}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       types.UID(fmt.Sprintf("sim-%d", s.uid)),
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		Name:      objectName,
		Namespace: namespace,
		Operation: op,
		UserInfo:  authenticationv1.UserInfo{Username: user},
		Object:    runtime.RawExtension{Raw: mustJSON(obj)},
		OldObject: runtime.RawExtension{Raw: oldRaw},
	}}
	return s.accept(context.Background(), req)
}

// observe mirrors what the webhook queues for the FencedResource status after
// a decision: the highest fence the stored object holds, and a regression.
func (s *resource) observe(old map[string]any, v fence.Verdict) {
	o := observation{highest: s.w.fenceOf(old)}
	if v == fence.FenceRegression {
		o.regression = "the registry went backwards"
	}
	if o.regression != "" || o.highest > s.w.reg.fr.Status.HighestObservedFence {
		s.w.observations = append(s.w.observations, o)
	}
}

// verdictOf reads the verdict code the admission message starts with.
func verdictOf(resp admission.Response) (fence.Verdict, string) {
	msg := ""
	if resp.Result != nil {
		msg = resp.Result.Message
	}
	code, _, ok := strings.Cut(msg, ":")
	if !ok || code == "" || strings.ToUpper(code) != code {
		return "ERRORED", msg
	}
	return fence.Verdict(code), msg
}

func isProtected(obj map[string]any) bool {
	return obj != nil && labels(obj)[fence.LabelProtected] == "true"
}

// sameObject: an update that changes nothing but server-managed metadata.
func sameObject(a, b map[string]any) bool {
	strip := func(o map[string]any) map[string]any {
		c := maps.Clone(o)
		md := maps.Clone(o["metadata"].(map[string]any))
		delete(md, "resourceVersion")
		c["metadata"] = md
		return c
	}
	return reflect.DeepEqual(strip(a), strip(b))
}

// The object helpers work on the JSON form, as the webhook sees objects.

func newObject() map[string]any {
	return map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": objectName, "namespace": namespace},
	}
}

func metadata(obj map[string]any) map[string]any {
	md, _ := obj["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
		obj["metadata"] = md
	}
	return md
}

func stringMap(obj map[string]any, key string) map[string]string {
	out := map[string]string{}
	if m, ok := metadata(obj)[key].(map[string]any); ok {
		for k, v := range m {
			out[k], _ = v.(string)
		}
	}
	return out
}

func setStringMap(obj map[string]any, key string, m map[string]string) {
	if len(m) == 0 {
		delete(metadata(obj), key)
		return
	}
	j := make(map[string]any, len(m))
	for k, v := range m {
		j[k] = v
	}
	metadata(obj)[key] = j
}

func annotations(obj map[string]any) map[string]string { return stringMap(obj, "annotations") }
func labels(obj map[string]any) map[string]string      { return stringMap(obj, "labels") }

func resourceVersion(obj map[string]any) string {
	s, _ := metadata(obj)["resourceVersion"].(string)
	return s
}
func setRV(obj map[string]any, rv string) {
	if rv == "" {
		delete(metadata(obj), "resourceVersion")
		return
	}
	metadata(obj)["resourceVersion"] = rv
}

func setData(obj map[string]any, data map[string]string) {
	j := make(map[string]any, len(data))
	for k, v := range data {
		j[k] = v
	}
	obj["data"] = j
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// describeWrite summarizes a write for traces: its fence, segment and operation.
func (w *world) describeWrite(obj map[string]any) string {
	raw := annotations(obj)[fence.AnnotationFence]
	if raw == "" {
		return "write without fence annotation"
	}
	if len(raw) > fence.MaxFenceAnnotationBytes {
		return fmt.Sprintf("write with a %d-byte fence annotation", len(raw))
	}
	e, err := w.readEnvelope(raw)
	if err != nil {
		return "write with a malformed fence annotation"
	}
	return fmt.Sprintf("write fence %d seg %d op %s grant %s", e.grant.FenceToken, e.Segment, e.Operation, short(e.digest))
}

// discardEvents is the webhook's event recorder; events are not simulated.
type discardEvents struct{}

var _ events.EventRecorder = discardEvents{}

func (discardEvents) Eventf(runtime.Object, runtime.Object, string, string, string, string, ...any) {}
