package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	testingclock "k8s.io/utils/clock/testing"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// Names and timings of the simulated system.
const (
	namespace    = "billing"
	resourceName = "invoice-batch"            // the FencedResource
	resourceID   = "invoice-batch/2026-07-19" // its spec.resourceID
	objectName   = "invoice-batch-result"     // the protected ConfigMap
	leaseSeconds = 10
	lease        = leaseSeconds * time.Second
	renewEvery   = lease / 3 // the client library's default
	// requestTimeout is how long a client waits for any answer.
	requestTimeout = time.Second
	pollEvery      = 300 * time.Millisecond
	// snapshotEvery is how often the registry's backend is backed up; a
	// restore fault goes back to one of the last few backups.
	snapshotEvery = 3 * time.Second
	// maxMainPhase bounds the faulty part of a schedule in virtual time.
	maxMainPhase = 5 * time.Minute
	// livenessBound is how long a correct owner may take, once the faults stop,
	// to acquire the lock and commit its operation.
	livenessBound = 10 * time.Minute
	// maxSteps stops a runaway schedule (it then fails liveness).
	maxSteps = 200_000
)

// simStart is the virtual clock's reading when a schedule starts.
var simStart = time.Date(2026, 7, 19, 10, 0, 0, 0, time.UTC)

// requestKind is what a message asks of a server.
type requestKind int

const (
	reqCreateGrant  requestKind = iota // create a LockGrant (acquire)
	reqGetGrant                        // read a LockGrant (poll, query, confirm)
	reqRenew                           // bump spec.renewals
	reqRelease                         // set spec.release
	reqGetObject                       // read the protected object
	reqWriteObject                     // create or update the protected object
	reqDeleteObject                    // delete the protected object
	// The store path (store.go).
	reqStoreView    // fencekeeper.published and resource_state
	reqStoreBegin   // begin a transaction with begin_segment
	reqStoreCommit  // COMMIT it
	reqStoreResolve // resolve a lost COMMIT from the receipts
	reqPublish      // the operator's publication
)

func (k requestKind) String() string {
	return [...]string{"create LockGrant", "get LockGrant", "renew", "release", "get object", "write object", "delete object",
		"read store", "begin_segment", "COMMIT", "resolve COMMIT", "publish"}[k]
}

// request is one message from a client to a server. Everything a server needs
// is in it; the client-side fields say what the client will do with the answer.
type request struct {
	id   int64
	from *worker // nil: the adversary sent it
	user string  // the authenticated identity of the sender
	pod  string  // the pod its bound token names ("" for none)
	kind requestKind

	grantName string                // LockGrant requests
	spec      locksv1.LockGrantSpec // reqCreateGrant
	renewals  int64                 // reqRenew: the spec.renewals to write

	object map[string]any // reqWriteObject: the object to store (JSON form)
	rv     string         // reqWriteObject, reqDeleteObject: resourceVersion precondition ("" = unconditional)
	create bool           // reqWriteObject: a create rather than an update

	receipt fence.Receipt // a worker's write: the receipt it expects
	fault   Fault         // the fault that produced or changed it
	// rebuild, for an adversary's write, rebuilds it onto the object as it
	// is when the write arrives (see adversary.craft).
	rebuild *craftSpec
	// deleteAfter: a worker's delete-intent segment; once it is applied the
	// worker deletes the object at the resourceVersion it wrote.
	deleteAfter bool

	notBefore   time.Time // a delayed message is not delivered before this
	dropRequest bool      // lost on the way: never processed
	dropReply   bool      // processed, but the answer is lost
	// commitAfter: a write the API server admits at once and etcd applies
	// this long after (slow, or cut off), if the object has not moved on;
	// its answer is lost (with dropReply).
	commitAfter time.Duration
	sentAt      time.Time
	historyOp   int // index in the history, -1 when not recorded

	// The store path: the grant whose publication a worker reads, the
	// envelope a transaction begins with, the transaction a COMMIT or a
	// resolution is about, and a publication.
	storeDigest string
	storeRaw    string
	storeTx     int64
	storeEnv    fence.Envelope
	pub         *publication
	// deposed: a deposed leader's late publication (publisher.leaderLost);
	// twice: a publication the store applies twice in a row.
	deposed, twice bool
}

// replyStatus is the server's answer.
type replyStatus int

const (
	replyOK replyStatus = iota
	replyNotFound
	replyConflict
	replyAlreadyExists
	replyDenied // the admission webhook denied the write
)

func (s replyStatus) String() string {
	return [...]string{"ok", "NotFound", "Conflict", "AlreadyExists", "denied"}[s]
}

type reply struct {
	req     *request
	status  replyStatus
	verdict fence.Verdict // object writes that reached the webhook
	message string
	grant   *locksv1.LockGrant // LockGrant requests
	object  map[string]any     // reqGetObject: the stored object, nil when absent
	// deleted is the FencedResource's status.deletedTarget, read with an
	// absent object (the client library's segmentAfterDelete).
	deleted *locksv1.DeletedTarget
	rv      string // a write's new resourceVersion
	served  int64  // the tick at which the server processed the request
	store   *storeAnswer
}

// world is one schedule.
type world struct {
	cfg   Config
	rng   *rand.Rand
	now   time.Time
	clock *testingclock.FakeClock
	// tick orders every event; the history checker uses it as time.
	tick int64
	step int

	reg      *registry
	obj      *resource
	workers  []*worker
	probe    *worker // the correct owner of the liveness check
	adv      *adversary
	oracle   *oracle
	hist     *history
	faults   faultPlan
	requests []*request
	replies  []*reply
	// observations are the webhook's status observations on their way to the
	// FencedResource status (the webhook's StatusRecorder runs beside admission).
	observations []observation

	quiet      bool // the faults stopped; the liveness check runs
	quietSince time.Time
	nextID     int64
	// indexLagUntil: until then the webhook's target index does not know the
	// FencedResource (it was just created; the informer lags).
	indexLagUntil time.Time
	// terminating: the namespace is being deleted (the teardown at the end).
	terminating bool
	// webhooks is the installation's webhook configuration; kind is the
	// protected object's resource (configmaps, or gadgets when uncovered).
	webhooks  *admissionregistrationv1.ValidatingWebhookConfiguration
	kind      schema.GroupVersionResource
	uncovered bool
	// twin: how a co-tenant's second entry for the object races this one
	// (twinNone: it does not).
	twin twinPlan
	// entryRefused: the FencedResource webhook refused the schedule's entry,
	// which ends the schedule.
	entryRefused bool
	// The store path, in a store schedule (storeSchedule); nil otherwise.
	store       *pgStore
	pub         *publisher
	storeOracle *storeOracle
	storePlan   storeFaultPlan
	res         *Result
	actions     []action
	envelopes   map[string]parsedEnvelope // see readEnvelope
}

type actionKind int

const (
	actDeliverRequest actionKind = iota
	actDeliverReply
	actWorker
	actTimeout
	actObservation
	actFault
	actLateCommit
	actPublish
	actStoreFault
)

type action struct {
	kind actionKind
	i    int
}

func newWorld(seed uint64, cfg Config) *world {
	w := &world{cfg: cfg, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), now: simStart,
		envelopes: map[string]parsedEnvelope{}, webhooks: installedWebhooks(), kind: configMapsGVR, uncovered: uncoveredKindSchedule(seed, cfg),
		twin: twinSchedule(seed, cfg)}
	w.clock = testingclock.NewFakeClock(w.now)
	w.res = &Result{Seed: seed}
	w.res.Counters.init()
	w.hist = newHistory()
	w.oracle = newOracle(w)
	w.reg = newRegistry(w)
	w.obj = newResource(w)
	w.adv = newAdversary(w)
	w.faults = newFaultPlan(w.rng, cfg.Faults, cfg.Suppress)
	n := 2 + w.rng.IntN(2)
	for i := range n {
		w.workers = append(w.workers, newWorker(w, fmt.Sprintf("worker-%d", i+1), 1+w.rng.IntN(2), 1+w.rng.IntN(3)))
	}
	w.tracef("schedule seed %d: %d workers; faults enabled: %s", seed, n, w.faults)
	if storeSchedule(seed, cfg) {
		w.store, w.pub, w.storeOracle = newStore(w), newPublisher(w), newStoreOracle(w)
		w.storePlan = newStoreFaultPlan(w)
		w.res.StoreSchedules++
		w.tracef("the FencedResource names a PostgreSQL store; store faults enabled: %v", w.storePlan.enabled)
	}
	w.register()
	switch {
	case w.faults.planned(FaultPlantedOwnForgery):
		w.adv.startIndexLag(FaultPlantedOwnForgery)
	case w.faults.planned(FaultIndexLag):
		w.adv.startIndexLag(FaultIndexLag)
	}
	return w
}

// run plays the schedule to its end and judges it.
func (w *world) run() *Result {
	for !w.done() {
		w.step++
		if w.step > maxSteps {
			w.oracle.violation(vLiveness, "the schedule did not finish within %d steps", maxSteps)
			break
		}
		if !w.quiet && w.mainPhaseOver() {
			w.startQuietPhase()
		}
		w.stepOnce()
		if w.cfg.StopAtFirstViolation && len(w.res.Violations) > 0 {
			break
		}
	}
	if w.faults.planned(FaultNamespaceTeardown) && !w.entryRefused && !(w.cfg.StopAtFirstViolation && len(w.res.Violations) > 0) {
		w.teardown()
	}
	w.finish()
	return w.res
}

func (w *world) done() bool {
	if w.entryRefused {
		return true
	}
	if !w.quiet {
		return false
	}
	// Done when the probe committed and every unknown outcome is settled.
	settled := !slices.ContainsFunc(w.workers, func(k *worker) bool {
		return k.unknown != nil || len(k.inFlight) > 0 || k.settleThen != nil || k.storeUnsettled()
	})
	if w.probe.finishedAll() && settled {
		if w.probe.abandoned > 0 {
			w.oracle.violation(vLiveness, "a correct owner (%s) gave its operation up after %d acquisitions", w.probe.name, maxTriesPerJob)
		}
		return true
	}
	if w.now.Sub(w.quietSince) > livenessBound {
		if !w.probe.finishedAll() {
			w.oracle.violation(vLiveness, "a correct owner (%s) did not commit its operation within %s of the faults stopping (%s)",
				w.probe.name, livenessBound, w.probe.describe())
		}
		return true // unsettled outcomes are counted by finish
	}
	return false
}

// mainPhaseOver: every worker finished its jobs, or the faulty phase ran long enough.
func (w *world) mainPhaseOver() bool {
	if w.now.Sub(simStart) > maxMainPhase {
		return true
	}
	for _, k := range w.workers {
		if !k.finishedAll() {
			return false
		}
	}
	return true
}

// startQuietPhase stops the faults, lets the operator repair what needs a
// human (a fence regression, a revoked issuer epoch), and starts a correct
// owner whose operation must commit: the liveness check.
func (w *world) startQuietPhase() {
	w.quiet, w.quietSince = true, w.now
	w.tracef("faults stop; %s starts the liveness check", "probe")
	for _, k := range w.workers {
		k.armed = armedFaults{}
	}
	w.reg.heal()
	jobs := 1
	if w.store != nil {
		jobs = 2 // one at the object, then one at the store
	}
	w.probe = newWorker(w, "probe", jobs, 2)
	w.workers = append(w.workers, w.probe)
}

// stepOnce performs one scheduling decision.
func (w *world) stepOnce() {
	acts := w.actions[:0]
	for i, r := range w.requests {
		if !r.notBefore.After(w.now) {
			acts = append(acts, action{actDeliverRequest, i})
		}
	}
	for i, rp := range w.replies {
		if rp.req.from == nil || !rp.req.from.paused() {
			acts = append(acts, action{actDeliverReply, i})
		}
	}
	for i, k := range w.workers {
		switch {
		case k.timedOut():
			acts = append(acts, action{actTimeout, i})
		case k.ready():
			acts = append(acts, action{actWorker, i})
		}
	}
	if len(w.observations) > 0 {
		acts = append(acts, action{actObservation, 0})
	}
	for i, lc := range w.obj.late {
		if !lc.at.After(w.now) {
			acts = append(acts, action{actLateCommit, i})
		}
	}
	if !w.quiet && w.faults.due(w.rng) {
		acts = append(acts, action{actFault, 0})
	}
	if w.store != nil {
		if w.pub.ready() {
			acts = append(acts, action{actPublish, 0})
		}
		if !w.quiet && w.storePlan.due(w) {
			acts = append(acts, action{actStoreFault, 0})
		}
	}
	w.actions = acts
	// Time passes while messages are in flight: a short tick competes with
	// every other action; when nothing else can happen, the clock jumps.
	if len(acts) == 0 {
		w.jump()
		return
	}
	if w.rng.IntN(len(acts)+3) == 0 {
		w.advance(time.Duration(1+w.rng.IntN(200)) * time.Millisecond)
		return
	}
	a := acts[w.rng.IntN(len(acts))]
	switch a.kind {
	case actDeliverRequest:
		r := w.requests[a.i]
		w.requests = slices.Delete(w.requests, a.i, a.i+1)
		w.deliverRequest(r)
	case actDeliverReply:
		rp := w.replies[a.i]
		w.replies = slices.Delete(w.replies, a.i, a.i+1)
		w.deliverReply(rp)
	case actWorker:
		w.workers[a.i].act()
	case actTimeout:
		w.workers[a.i].timeout()
	case actObservation:
		o := w.observations[0]
		w.observations = w.observations[1:]
		w.reg.record(o)
	case actFault:
		w.adv.inject()
	case actLateCommit:
		w.tick++
		w.obj.applyLate(a.i)
	case actPublish:
		w.pub.run()
	case actStoreFault:
		w.adv.injectStore()
	}
}

// jump advances the clock to the next moment something can happen.
func (w *world) jump() {
	next := time.Time{}
	consider := func(t time.Time) {
		if t.After(w.now) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for _, r := range w.requests {
		consider(r.notBefore)
	}
	for _, k := range w.workers {
		consider(k.nextEvent())
	}
	consider(w.reg.nextEvent())
	consider(w.obj.nextLate())
	if w.store != nil {
		consider(w.store.nextEvent())
		consider(w.pub.nextEvent())
	}
	if next.IsZero() {
		// Nothing is scheduled: the system is at rest. Let a second pass.
		next = w.now.Add(time.Second)
	}
	w.advance(next.Sub(w.now))
}

func (w *world) advance(d time.Duration) {
	w.now = w.now.Add(d)
	w.clock.SetTime(w.now)
	w.reg.clockAdvanced()
	if w.store != nil {
		w.store.clockAdvanced()
		w.pub.tick()
	}
}

// send puts a request on the network.
func (w *world) send(r *request) {
	w.nextID++
	r.id, r.sentAt, r.historyOp = w.nextID, w.now, -1
	w.tick++
	if r.kind == reqGetObject || r.kind == reqWriteObject || r.kind == reqDeleteObject {
		r.historyOp = w.hist.call(w, r, w.tick)
	}
	w.requests = append(w.requests, r)
}

func (w *world) deliverRequest(r *request) {
	if r.dropRequest {
		w.tracef("  lost: %s's %s (#%d) never arrives", r.user, r.kind, r.id)
		return
	}
	w.tick++
	if r.rebuild != nil {
		w.adv.rebuild(r)
	}
	var rp *reply
	switch r.kind {
	case reqGetObject, reqWriteObject, reqDeleteObject:
		rp = w.obj.serve(r)
	case reqStoreView, reqStoreBegin, reqStoreCommit, reqStoreResolve, reqPublish:
		if rp = w.store.serve(r); rp == nil {
			return // it waits for the row lock, or the store is down
		}
	default:
		rp = w.reg.serve(r)
	}
	rp.served = w.tick
	if r.dropReply {
		w.tracef("  lost: the answer to %s's %s (#%d: %s)", r.user, r.kind, r.id, rp.summary())
		return
	}
	w.replies = append(w.replies, rp)
}

func (w *world) deliverReply(rp *reply) {
	w.tick++
	if rp.req.historyOp >= 0 {
		w.hist.ret(w, rp, w.tick)
	}
	if rp.req.from == nil {
		if rp.req.kind == reqPublish {
			w.pub.onReply(rp)
			return
		}
		w.adv.onReply(rp)
		return
	}
	rp.req.from.onReply(rp)
}

// teardown ends the schedule by deleting the namespace: it terminates, the
// namespace controller deletes what it holds (the webhook lets it, audited),
// and the entry goes with it. Someone else's delete riding the teardown is
// still judged by the DELETE rule.
func (w *world) teardown() {
	if w.obj.stored == nil {
		return
	}
	w.terminating = true
	w.res.Faults[FaultNamespaceTeardown]++
	w.tracef("FAULT %s: namespace %s terminates", FaultNamespaceTeardown, namespace)
	for _, user := range []string{strangerUser, locksv1.NamespaceControllerUsername} {
		w.tick++
		rp := w.obj.serve(&request{kind: reqDeleteObject, user: user, fault: FaultNamespaceTeardown, historyOp: -1})
		w.tracef("teardown: delete by %s: %s", user, rp.summary())
	}
	if w.obj.stored != nil {
		w.oracle.violation(vLiveness, "the namespace controller could not delete the target while the namespace terminates")
	}
}

// finish runs the end-of-schedule checks.
func (w *world) finish() {
	for _, k := range w.workers {
		if k.unknown != nil {
			w.res.UnknownUnsettled++
		}
		w.res.UnknownUnsettled += int64(len(k.inFlight))
		if k.storeUnsettled() {
			w.res.StoreUnknownUnsettled++
		}
	}
	if w.store != nil {
		w.storeOracle.checkDurable("at the end,")
	}
	w.hist.check(w)
	w.res.Steps = int64(w.step)
	w.res.VirtualTime = w.now.Sub(simStart)
	w.res.Schedules = 1
}

// tracef records one line of the schedule's trace (only when tracing).
func (w *world) tracef(format string, args ...any) {
	if !w.cfg.Trace {
		return
	}
	w.res.Trace = append(w.res.Trace, fmt.Sprintf("%9s #%-5d %s", "+"+w.now.Sub(simStart).Truncate(time.Millisecond).String(), w.step, fmt.Sprintf(format, args...)))
}

func (rp *reply) summary() string {
	switch {
	case rp.status == replyDenied:
		return rp.message
	case rp.verdict != "":
		return string(rp.verdict)
	case rp.store != nil && rp.store.verdict != "":
		return string(rp.store.verdict)
	}
	return rp.status.String()
}

// short abbreviates a digest for traces.
func short(s string) string {
	s = strings.TrimPrefix(s, "sha256:")
	if len(s) > 8 {
		return s[:8]
	}
	return s
}
