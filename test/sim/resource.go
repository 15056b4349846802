package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

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
// real one, it checks the resourceVersion and UID preconditions, calls the
// validating webhook through the two entries of its configuration
// (docs/security.md, "What is protected") with the stored object as the old
// object, and writes or deletes only what the webhook allowed — one atomic
// step, as the apiserver runs admission inside its compare-and-swap.
type resource struct {
	w          *world
	v          *webhooks.ProtectedObjectValidator
	stored     map[string]any // JSON form; nil while the object does not exist
	storedJSON []byte         // its encoding, as the webhook receives it
	rv         int64
	accept     AcceptFunc
	uid        int
	objects    int // numbers the UIDs of created objects
	created    int // incarnations stored
	// enrolled: the namespace carries fencekeeper.dev/enrolled=true. The
	// FencedResource webhook labels it before it admits the entry, so it is
	// true for as long as the entry exists: the whole schedule.
	enrolled bool
	// late are writes admitted and not yet applied (see request.commitAfter).
	late []*lateCommit
}

// lateCommit is a write the acceptance point admitted whose etcd
// transaction is applied only at at, if the object is still at the version
// it was admitted against (for a create: still absent).
type lateCommit struct {
	req     *request
	obj     map[string]any
	verdict fence.Verdict
	at      time.Time
	rv      int64 // the stored version when admitted
	// created: how many incarnations the object had when admitted. A
	// create lands only into the absence it was admitted against (see
	// security.md, "Known limits": one delayed past another incarnation's
	// create and delete is not modelled).
	created int
	// The oracle's judgement at admission.
	env      *oracleEnvelope
	class    authClass
	admitted acceptance
}

// observation is what the webhook's StatusRecorder queues for the FencedResource status.
type observation struct {
	highest    int64
	regression string
}

func newResource(w *world) *resource {
	reader := apiReader{w.reg}
	v := &webhooks.ProtectedObjectValidator{
		Reader:    reader,
		Index:     indexReader{reader},
		Namespace: locksv1.DefaultNamespace,
		Writer:    statusWriter{r: w.reg},
		Bundle:    &webhooks.TrustBundleSource{Reader: reader, Key: types.NamespacedName{Namespace: locksv1.DefaultNamespace, Name: locksv1.TrustBundleConfigMap}},
		Clock:     w.clock,
		Recorder:  discardEvents{},
	}
	s := &resource{w: w, v: v, accept: v.Handle, enrolled: true}
	if w.cfg.Acceptance != nil {
		s.accept = w.cfg.Acceptance(s.accept)
	}
	return s
}

// routed is the webhook configuration's matching: its rules must route the
// object's kind and the operation (apiServerRoutes); then vprotected sees
// labelled objects (old or new), vprotected-enrolled the unlabelled ones in
// enrolled namespaces.
func (s *resource) routed(op admissionv1.Operation, old, obj map[string]any) bool {
	return apiServerRoutes(s.w.webhooks, s.w.kind, op) && (isProtected(old) || isProtected(obj) || s.enrolled)
}

// serve answers a read, a write or a delete of the protected object.
func (s *resource) serve(req *request) *reply {
	rp := &reply{req: req}
	switch req.kind {
	case reqGetObject:
		s.serveGet(rp)
		return rp
	case reqDeleteObject:
		return s.serveDelete(req, rp)
	}
	return s.serveWrite(req, rp)
}

// serveGet answers a read: the stored object, or else the registry's record
// of its deletion.
func (s *resource) serveGet(rp *reply) {
	if s.stored != nil {
		rp.object = runtime.DeepCopyJSON(s.stored)
	} else if dt := s.w.reg.fr.Status.DeletedTarget; dt != nil {
		rp.deleted = dt.DeepCopy()
	}
}

// serveWrite answers a create or an update: refused before admission, or
// admitted or denied by the webhook, then stored now or, admitted with
// commitAfter, by etcd later.
func (s *resource) serveWrite(req *request, rp *reply) *reply {
	old := s.stored
	if rp.status = s.writePrecondition(req, old); rp.status != replyOK { // refused before admission
		s.w.res.countRefusal(rp.status, req.fault)
		return rp
	}
	obj := runtime.DeepCopyJSON(req.object)
	if old == nil {
		s.objects++
		metadata(obj)["uid"] = fmt.Sprintf("cm-uid-%d", s.objects)
	} else {
		metadata(obj)["uid"] = uidOf(old)
	}
	allowed := s.admitWrite(req, rp, old, obj)
	mutation := old == nil || !sameObject(old, obj)
	if allowed && mutation && req.commitAfter > 0 && (req.create || req.rv != "") {
		s.commitLater(req, rp, old, obj)
		return rp
	}
	s.w.oracle.judgeWrite(req, old, obj, allowed && mutation, rp.verdict)
	if !allowed {
		rp.status = replyDenied
		if s.w.cfg.Trace {
			s.w.tracef("object: %s by %s DENIED %s", s.w.describeWrite(req.object), req.user, rp.message)
		}
		return rp
	}
	if mutation {
		s.store(req, rp, old, obj)
	}
	rp.rv = strconv.FormatInt(s.rv, 10)
	return rp
}

// writePrecondition is the API server's answer to a write before admission:
// replyOK, or why it refuses the write against the stored object old.
func (s *resource) writePrecondition(req *request, old map[string]any) replyStatus {
	switch {
	case req.create && old != nil:
		return replyAlreadyExists
	case !req.create && old == nil:
		return replyNotFound
	case !req.create && req.rv != "" && req.rv != strconv.FormatInt(s.rv, 10):
		return replyConflict
	case !req.create && uidOf(req.object) != "" && uidOf(req.object) != uidOf(old):
		return replyConflict // the body names another incarnation of the object
	}
	return replyOK
}

// admitWrite has the webhook decide the write of obj over old, when the
// webhook configuration routes it there, and records its verdict in rp; it
// returns whether the write is allowed.
func (s *resource) admitWrite(req *request, rp *reply, old, obj map[string]any) bool {
	op := admissionv1.Update
	if old == nil {
		op = admissionv1.Create
	}
	if !s.routed(op, old, obj) {
		return true
	}
	resp := s.admit(op, req.user, req.pod, obj)
	rp.verdict, rp.message = verdictOf(resp)
	s.w.res.countVerdict(rp.verdict, req.fault)
	return resp.Allowed
}

// commitLater queues an admitted write that etcd applies later (its answer
// is lost: dropReply).
func (s *resource) commitLater(req *request, rp *reply, old, obj map[string]any) {
	env, class, _ := s.w.oracle.judgeAttempt(req, old, obj)
	s.late = append(s.late, &lateCommit{req: req, obj: obj, verdict: rp.verdict, at: s.w.now.Add(req.commitAfter), rv: s.rv, created: s.created,
		env: env, class: class, admitted: s.w.oracle.acceptanceNow()})
	s.w.tracef("object: %s by %s admitted (%s); etcd applies it at +%s", s.w.describeWrite(req.object), req.user, rp.verdict,
		s.w.now.Add(req.commitAfter).Sub(simStart).Truncate(time.Millisecond))
}

// store stores obj, the allowed write's new object over old, at the next
// resource version.
func (s *resource) store(req *request, rp *reply, old, obj map[string]any) {
	if old == nil {
		s.created++
	}
	s.rv++
	setRV(obj, strconv.FormatInt(s.rv, 10))
	s.stored, s.storedJSON = obj, mustJSON(obj)
	if s.w.cfg.Trace {
		s.w.tracef("object: %s by %s %s", s.w.describeWrite(req.object), req.user, rp.verdict)
	}
}

// applyLate applies late commit i, or fails it (nobody hears of either)
// when the object moved since its admission.
func (s *resource) applyLate(i int) {
	lc := s.late[i]
	s.late = slices.Delete(s.late, i, i+1)
	if (lc.req.create && (s.stored != nil || s.created != lc.created)) || (!lc.req.create && (s.stored == nil || s.rv != lc.rv)) {
		s.w.res.LateCommitsFailed++
		s.w.tracef("object: the late write #%d fails: the object moved since its admission", lc.req.id)
		return
	}
	s.w.res.LateCommitsLanded++
	if lc.req.create {
		s.created++
	}
	s.w.oracle.judgeCommitted(lc.req, s.stored, lc.obj, lc.verdict, lc.env, lc.class, lc.admitted)
	s.rv++
	setRV(lc.obj, strconv.FormatInt(s.rv, 10))
	s.stored, s.storedJSON = lc.obj, mustJSON(lc.obj)
	s.w.tracef("object: the late write #%d lands: %s", lc.req.id, s.w.describeWrite(lc.obj))
}

// nextLate is when the next late commit is due (zero: none).
func (s *resource) nextLate() time.Time {
	var next time.Time
	for _, lc := range s.late {
		if next.IsZero() || lc.at.Before(next) {
			next = lc.at
		}
	}
	return next
}

// serveDelete deletes the object if the preconditions hold and the webhook
// allows it (the stored object is the admission request's old object).
func (s *resource) serveDelete(req *request, rp *reply) *reply {
	old := s.stored
	switch {
	case old == nil:
		rp.status = replyNotFound
	case req.rv != "" && req.rv != strconv.FormatInt(s.rv, 10):
		rp.status = replyConflict
	}
	if rp.status != replyOK {
		s.w.res.countRefusal(rp.status, req.fault)
		return rp
	}
	allowed := true
	if s.routed(admissionv1.Delete, old, nil) {
		resp := s.admit(admissionv1.Delete, req.user, req.pod, nil)
		rp.verdict, rp.message = verdictOf(resp)
		s.w.res.countVerdict(rp.verdict, req.fault)
		allowed = resp.Allowed
	}
	s.w.oracle.judgeDelete(req, allowed, rp.verdict)
	if !allowed {
		rp.status = replyDenied
		s.w.tracef("object: delete by %s DENIED %s", req.user, rp.message)
		return rp
	}
	s.rv++
	s.stored, s.storedJSON = nil, nil
	s.w.tracef("object: deleted by %s (%s)", req.user, rp.verdict)
	s.w.adv.targetDeleted()
	return rp
}

// admit sends the request to the acceptance point as the apiserver would,
// and passes on what the webhook queued for the FencedResource status.
func (s *resource) admit(op admissionv1.Operation, user, pod string, obj map[string]any) admission.Response {
	s.uid++
	var objRaw []byte
	if obj != nil {
		objRaw = mustJSON(obj)
	}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       types.UID(fmt.Sprintf("sim-%d", s.uid)),
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		Name:      objectName,
		Namespace: namespace,
		Operation: op,
		UserInfo:  userInfo(user, pod),
		Object:    runtime.RawExtension{Raw: objRaw},
		OldObject: runtime.RawExtension{Raw: s.storedJSON},
	}}
	// A fresh recorder per decision: what it queued is this decision's
	// observation, delivered to the registry on the simulator's schedule.
	s.v.Status = webhooks.NewStatusRecorder(nil, nil)
	resp := s.accept(context.Background(), req)
	if o, ok := queuedObservation(s.v.Status); ok {
		s.w.observations = append(s.w.observations, o)
	}
	return resp
}

// queuedObservation reads what the real webhook queued on its status
// recorder (the recorder is never started here; its queue is unexported, so
// it is read by reflection — read only).
func queuedObservation(rec *webhooks.StatusRecorder) (observation, bool) {
	pending := reflect.ValueOf(rec).Elem().FieldByName("pending")
	for _, k := range pending.MapKeys() {
		o := pending.MapIndex(k).Elem()
		return observation{highest: o.FieldByName("highestFence").Int(), regression: o.FieldByName("regression").String()}, true
	}
	return observation{}, false
}

// verdictOf reads a denial's verdict from the status details (as the client
// library does) and an allowed write's from the code its message starts with.
func verdictOf(resp admission.Response) (fence.Verdict, string) {
	msg := ""
	if resp.Result != nil {
		msg = resp.Result.Message
	}
	if !resp.Allowed && resp.Result != nil && resp.Result.Details != nil {
		for _, c := range resp.Result.Details.Causes {
			if c.Type == fence.CauseVerdict {
				return fence.Verdict(c.Message), msg
			}
		}
	}
	switch {
	case resp.Allowed && strings.HasPrefix(msg, "not protected"):
		return verdictNotProtected, msg
	case resp.Allowed && strings.HasPrefix(msg, "namespace teardown"):
		return verdictTeardown, msg
	}
	code, _, ok := strings.Cut(msg, ":")
	if !ok || code == "" || strings.ToUpper(code) != code {
		return "ERRORED", msg
	}
	return fence.Verdict(code), msg
}

// The webhook's verdict labels of writes it lets through without fence.DecideWrite.
const (
	verdictNotProtected fence.Verdict = "NOT_PROTECTED"
	verdictTeardown     fence.Verdict = "NAMESPACE_TEARDOWN"
)

func uidOf(obj map[string]any) string {
	u, _ := metadata(obj)["uid"].(string)
	return u
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

// userInfo is what the API server puts in an admission request for user,
// sending from pod ("" for none) with a bound service-account token.
func userInfo(user, pod string) authenticationv1.UserInfo {
	u := authenticationv1.UserInfo{Username: user}
	if pod != "" {
		u.Extra = map[string]authenticationv1.ExtraValue{locksv1.PodUIDExtra: {pod}}
	}
	return u
}
