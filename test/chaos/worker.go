package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/fencectl"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// Event is one line of a worker's log: what it sent and what came back, in
// wall-clock nanoseconds (all processes share the host's clock). The checker
// pairs "call" and "return" lines by ID; a call without a return (the worker
// was killed) is an unknown outcome.
type Event struct {
	ID       string `json:"id"`
	Worker   string `json:"w"`
	Kind     string `json:"k"` // acquire, call, return, read, resolve, stale, replay
	Resource string `json:"res,omitempty"`
	Object   string `json:"obj,omitempty"` // Kind/name
	// The write's register value: grant (its requestID), fence, segment.
	RequestID string `json:"req,omitempty"`
	Fence     int64  `json:"fence,omitempty"`
	Segment   int64  `json:"seg,omitempty"`
	At        int64  `json:"at"`
	// Outcome: ok, denied, rejected (definitively refused), unknown; for
	// resolve: applied, absent, unresolved; for read: ok or absent.
	Outcome string `json:"out,omitempty"`
	Detail  string `json:"detail,omitempty"`
	// Sent: when an adversary write left (At is when its answer came).
	Sent int64 `json:"sent,omitempty"`
	// Payload: a store commit's digest of its row.
	Payload string `json:"payload,omitempty"`
}

// eventLog appends events to a file, one write per line (nothing buffered:
// a SIGKILL loses no answered event).
type eventLog struct {
	mu sync.Mutex
	f  *os.File
	w  string
	n  int
}

func (l *eventLog) emit(e Event) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.ID == "" {
		l.n++
		e.ID = fmt.Sprintf("%s/%d/%d", l.w, os.Getpid(), l.n)
	}
	e.Worker, e.At = l.w, time.Now().UnixNano()
	b, _ := json.Marshal(e)
	_, _ = l.f.Write(append(b, '\n'))
	return e.ID
}

// WorkerOptions configure one worker process.
type WorkerOptions struct {
	Name, Kubeconfig, Namespace, Events string
	Resources                           []string // FencedResource names; "wd-*" protect Widgets, the rest ConfigMaps
	Seed                                uint64
	Adversary                           bool
	// StoreDSN is the workers' role's DSN of the PostgreSQL store every
	// resource names ("": no store commits).
	StoreDSN string
}

// RunWorker claims resources with pkg/lockclient exactly as users do, and
// writes segmented operations, until stop ends; it then finishes the claim
// in hand (and resolves what it left unknown) before returning, as a worker
// shutting down gracefully does. The adversary also writes
// with its own released grants and replays envelopes it saw, after a newer
// fence wrote the object: every such write must be denied.
func RunWorker(stop context.Context, o WorkerOptions) error {
	// Claims run on their own deadlines, not on stop: a stop must not turn
	// a write in flight into an unknown outcome.
	ctx := context.Background()
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.Timeout = 10 * time.Second
	f, err := os.OpenFile(o.Events, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	w := &worker{o: o, log: &eventLog{f: f, w: o.Name}, rnd: rand.New(rand.NewPCG(o.Seed, uint64(os.Getpid())))}
	for stop.Err() == nil {
		if w.lc, err = lockclient.NewForConfig(stop, cfg, o.Namespace); err == nil {
			break
		}
		_ = ctxtime.Sleep(stop, 500*time.Millisecond) // the API server may be cut off
	}
	if stop.Err() != nil {
		return nil
	}
	if w.kube, err = client.New(cfg, client.Options{Scheme: locksv1.Scheme}); err != nil {
		return err
	}
	if o.StoreDSN != "" {
		pc, err := pgxpool.ParseConfig(o.StoreDSN)
		if err != nil {
			return err
		}
		pc.MaxConns = 4
		if w.db, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return err
		}
		defer w.db.Close()
	}
	for iter := 0; stop.Err() == nil; iter++ {
		w.claim(ctx, iter)
	}
	return nil
}

type worker struct {
	o    WorkerOptions
	log  *eventLog
	rnd  *rand.Rand
	lc   *lockclient.Client
	kube client.Client
	db   *pgxpool.Pool // the store; nil without one
	// The adversary's material: its ended grants and envelopes it read.
	oldGrants    []oldGrant
	oldEnvelopes []oldEnvelope
}

type oldGrant struct {
	lg  locksv1.LockGrant
	res string
	// The grant as the store knows it, its store operation and the
	// segments of it acknowledged.
	g         grant.Grant
	proof     string
	storeOp   string
	storeSegs int64
}

type oldEnvelope struct {
	annotation string
	fence      int64
	res        string
}

func isWidget(res string) bool { return strings.HasPrefix(res, "wd-") }

// object is an empty protected object of resource res.
func object(res string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	if isWidget(res) {
		u.SetAPIVersion("example.com/v1")
		u.SetKind("Widget")
	} else {
		u.SetAPIVersion("v1")
		u.SetKind("ConfigMap")
	}
	u.SetName(res)
	return u
}

func setValue(u *unstructured.Unstructured, key, val string) error {
	if u.GetKind() == "Widget" {
		return unstructured.SetNestedField(u.Object, val, "spec", "data", key)
	}
	return unstructured.SetNestedField(u.Object, val, "data", key)
}

// claim is one acquire, 1-3 segments, a read, maybe adversary writes, release.
func (w *worker) claim(ctx context.Context, iter int) {
	res := w.o.Resources[w.rnd.IntN(len(w.o.Resources))]
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	reqID := fmt.Sprintf("%s-%d-%d", w.o.Name, iter, time.Now().UnixNano()%1_000_000)
	lock, err := w.lc.Acquire(actx, res, lockclient.AcquireOptions{RequestID: reqID})
	if err != nil {
		w.log.emit(Event{Kind: "acquire", Resource: res, RequestID: reqID, Outcome: "failed", Detail: err.Error()})
		_ = ctxtime.Sleep(ctx, 200*time.Millisecond)
		return
	}
	defer lock.Orphan() // a lock whose release failed is left to expire
	w.log.emit(Event{Kind: "acquire", Resource: res, RequestID: reqID, Fence: lock.Fence(), Outcome: "ok", Detail: lock.Name()})
	op := lock.Operation(fmt.Sprintf("op-%d", iter))
	segments := 1 + w.rnd.IntN(3)
	var acked int64
	for seg := 1; seg <= segments; seg++ {
		if !w.write(actx, lock, op, res, reqID, acked+1, fmt.Sprintf("%s-%d-%d", w.o.Name, iter, seg)) {
			break
		}
		acked++
	}
	storeOp := "store-" + reqID
	storeSegs := w.storeCommits(actx, lock, res, reqID, storeOp)
	w.read(actx, res)
	if w.o.Adversary {
		w.attack(actx)
	}
	// Hold a moment (up to 400 ms) before releasing.
	_ = ctxtime.Sleep(ctx, time.Duration(w.rnd.IntN(400))*time.Millisecond)
	_ = lock.Release(actx)
	if w.o.Adversary && acked+storeSegs > 0 {
		g, proof := lock.Grant()
		w.oldGrants = append(w.oldGrants, oldGrant{lg: *lock.LockGrant(), res: res, g: g, proof: proof, storeOp: storeOp, storeSegs: storeSegs})
		// Strike while the grant is freshest: once the next holder wrote,
		// a webhook with a stale view of the registry would still take it.
		_ = ctxtime.Sleep(ctx, 300*time.Millisecond)
		w.attack(actx)
	}
}

// write commits one segment; true if acknowledged.
func (w *worker) write(ctx context.Context, lock *lockclient.Lock, op *lockclient.Operation, res, reqID string, seg int64, key string) bool {
	obj := object(res)
	obj.SetNamespace(w.o.Namespace)
	kind := obj.GetKind()
	id := w.log.emit(Event{Kind: "call", Resource: res, Object: kind + "/" + res, RequestID: reqID, Fence: lock.Fence(), Segment: seg})
	rcpt, err := op.Commit(ctx, obj, func() error { return setValue(obj, key, reqID) })
	ret := Event{ID: id, Kind: "return", Resource: res, Object: kind + "/" + res, RequestID: reqID, Fence: lock.Fence(), Segment: seg}
	switch d, denied := lockclient.AsDenial(err); {
	case err == nil:
		ret.Outcome, ret.Fence, ret.Segment = "ok", rcpt.Fence, rcpt.Segment
	case denied:
		ret.Outcome, ret.Detail = "denied", string(d.Verdict)
	case errors.Is(err, lockclient.ErrMutationUnknown):
		ret.Outcome, ret.Detail = "unknown", err.Error()
	default:
		// The lock client says nothing was written (refused before sending,
		// or definitively by the API server); the checker holds it to that.
		ret.Outcome, ret.Detail = "rejected", err.Error()
	}
	w.log.emit(ret)
	if unknown := (*lockclient.UnknownOutcomeError)(nil); errors.As(err, &unknown) {
		w.resolve(op, res, id, unknown.Sent)
	}
	return err == nil
}

// resolve decides an unknown write from the object as it is now, as the
// library's Operation.Resolve does, for up to 30 s (the partition may last,
// and a write still in flight decides nothing until the object moves on).
// Unresolved is left to the escalation the lock client recorded on the
// LockGrant.
func (w *worker) resolve(op *lockclient.Operation, res, id string, sent lockclient.Sent) {
	deadline := time.Now().Add(30 * time.Second)
	ctx := context.Background() // outlives the claim's deadline, bounded here
	for time.Now().Before(deadline) {
		obj := object(res)
		obj.SetNamespace(w.o.Namespace)
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, _, err := op.Resolve(rctx, obj, sent)
		cancel()
		out := ""
		switch {
		case err != nil, r == lockclient.InFlight:
		case r == lockclient.Applied, r == lockclient.AppliedOtherPayload: // the payload is the client's digest; (fence, segment, operation) name the write
			out = "applied"
		case r == lockclient.ProvenAbsent:
			out = "absent"
		default:
			out = "unresolved"
		}
		if out != "" {
			w.log.emit(Event{ID: id + "/resolve", Kind: "resolve", Resource: res, Outcome: out, Detail: id})
			return
		}
		_ = ctxtime.Sleep(ctx, 500*time.Millisecond)
	}
	w.log.emit(Event{ID: id + "/resolve", Kind: "resolve", Resource: res, Outcome: "unresolved", Detail: id})
}

// read is a linearizable GET of the object: the register value it holds.
func (w *worker) read(ctx context.Context, res string) {
	obj := object(res)
	id := w.log.emit(Event{Kind: "call", Resource: res, Object: obj.GetKind() + "/" + res, Detail: "read"})
	err := w.kube.Get(ctx, client.ObjectKey{Namespace: w.o.Namespace, Name: res}, obj)
	ret := Event{ID: id, Kind: "read", Resource: res, Object: obj.GetKind() + "/" + res}
	switch {
	case apierrors.IsNotFound(err):
		ret.Outcome = "absent"
	case err != nil:
		ret.Outcome = "unknown" // a read that failed says nothing
	default:
		ret.Outcome = "ok"
		ann := obj.GetAnnotations()[fence.AnnotationFence]
		if e, ok := parseEnvelope(ann); ok {
			ret.RequestID, ret.Fence, ret.Segment = e.Grant.RequestID, e.Grant.FenceToken, e.Segment
			if w.o.Adversary {
				w.oldEnvelopes = append(w.oldEnvelopes, oldEnvelope{annotation: ann, fence: e.Grant.FenceToken, res: res})
			}
		}
	}
	w.log.emit(ret)
}

// attack writes with an ended grant of its own, and replays an envelope it
// read, each as soon as the registry (a linearizable GET) shows a higher
// fence issued for the resource: from then on the write is stale by any
// definition, even before the new holder has written the object.
func (w *worker) attack(ctx context.Context) {
	if len(w.oldGrants) > 0 {
		g := w.oldGrants[len(w.oldGrants)-1]
		if w.rnd.IntN(2) == 0 {
			g = w.oldGrants[w.rnd.IntN(len(w.oldGrants))]
		}
		w.storeAttack(ctx, g)
		if g.lg.Status.Grant != nil && w.waitSuperseded(ctx, g.res, g.lg.Status.Grant.FenceToken) {
			obj := object(g.res)
			obj.SetNamespace(w.o.Namespace)
			sent := time.Now().UnixNano()
			rcpt, err := fencectl.WriteUnguarded(ctx, w.kube, &g.lg, obj, "stale", "", func() error { return setValue(obj, "stale", "must not land") })
			w.log.emit(Event{Kind: "stale", Resource: g.res, RequestID: g.lg.Spec.RequestID, Fence: g.lg.Status.Grant.FenceToken, Segment: rcpt.Segment,
				Sent: sent, Outcome: outcome(err), Detail: errText(err)})
		}
	}
	if len(w.oldEnvelopes) > 0 {
		e := w.oldEnvelopes[w.rnd.IntN(len(w.oldEnvelopes))]
		if !w.waitSuperseded(ctx, e.res, e.fence) {
			return
		}
		obj := object(e.res)
		if err := w.kube.Get(ctx, client.ObjectKey{Namespace: w.o.Namespace, Name: e.res}, obj); err != nil {
			return
		}
		ann := obj.GetAnnotations()
		ann[fence.AnnotationFence] = e.annotation
		obj.SetAnnotations(ann)
		_ = setValue(obj, "replayed", "must not land")
		err := w.kube.Update(ctx, obj)
		w.log.emit(Event{Kind: "replay", Resource: e.res, Fence: e.fence, Outcome: outcome(err), Detail: errText(err)})
	}
}

// waitSuperseded polls the registry for up to a second until it shows a
// fence above f issued for res.
func (w *worker) waitSuperseded(ctx context.Context, res string, f int64) bool {
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		var fr locksv1.FencedResource
		if err := w.kube.Get(ctx, client.ObjectKey{Namespace: w.o.Namespace, Name: res}, &fr); err == nil && fr.Status.FenceToken > f {
			return true
		}
		_ = ctxtime.Sleep(ctx, 20*time.Millisecond)
	}
	return false
}

// outcome of an adversary write: only "ok" (a violation) and "denied" (by
// the webhook) are judged; anything else refused it otherwise.
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	if _, denied := lockclient.AsDenial(err); denied {
		return "denied"
	}
	return "refused"
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// envelope is the part of the fence annotation the checker reads, decoded
// here rather than with pkg/fence so that the checker does not trust the
// code it checks.
type envelope struct {
	Grant struct {
		Resource   string `json:"resource"`
		RequestID  string `json:"requestID"`
		FenceToken int64  `json:"fenceToken"`
	} `json:"grant"`
	Segment int64  `json:"segment"`
	Intent  string `json:"intent"`
}

func parseEnvelope(s string) (envelope, bool) {
	var e envelope
	if s == "" || json.Unmarshal([]byte(s), &e) != nil || e.Grant.FenceToken == 0 {
		return envelope{}, false
	}
	return e, true
}
