package sim

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/issuer"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// issuerKey is the registry's signing key. Every schedule uses the same one;
// a Signer is safe for concurrent use.
var issuerKey = sync.OnceValue(func() *grant.Signer {
	s, err := grant.NewSigner("fencekeeper-sim", bytes.Repeat([]byte{0x5e}, 32))
	if err != nil {
		panic(err)
	}
	return s
})

// registry is the in-memory API server of the lock objects — the
// FencedResource, its LockGrants, the trust bundle — and the issuer that
// decides with the issuer's real decision (issuer.Decide) whenever something changed,
// as the reconciler does on a watch event or its requeue.
type registry struct {
	w  *world
	fr locksv1.FencedResource
	// frUnstored: fr is admitted but not stored yet (only while register
	// runs); twin: a second entry for the object, stored when admitted.
	frUnstored bool
	twin       *locksv1.FencedResource
	// claims are the target-claim Leases, by name.
	claims map[string]*coordinationv1.Lease
	// indexBehind: the webhook's cache does not know the stored entries yet.
	indexBehind bool

	grants []locksv1.LockGrant
	rv     int64 // the backend's revision counter
	uids   int

	signer       *grant.Signer
	epoch        int64     // the issuer's epoch
	takeoverAt   time.Time // when it began
	revokedBelow int64     // trust bundle revokedBelowEpoch
	bundleRV     int64
	bundleData   map[string]string

	requeueAt    time.Time // the reconciler's RequeueAfter
	outageUntil  time.Time // no leader until then; a new epoch takes over after
	operatorDue  time.Time // when the human operator answers a FenceRegression condition
	snapshots    []snapshot
	lastSnapshot time.Time
	holder       string // digest of the holder after the last decision
	// staleGrants is the issuer's LockGrant cache until cacheLagUntil
	// (FaultIssuerCacheLag): LockGrants it holds are seen as they were.
	staleGrants []locksv1.LockGrant
	// seen is what the issuer's last committed decision deferred from the
	// registry queue (issuer.QueueDelay); a new leader starts without it.
	seen issuer.Arrivals
	// confirming are the arrivals a decision held back for reads outside
	// it (issuer.Decision.Confirm), read at confirmAt, in the chain
	// confirmSince: a release or an arrival may come in between.
	confirming    []*locksv1.LockGrant
	confirmAt     time.Time
	confirmSince  string
	cacheLagUntil time.Time
	// mirrorLost: that many of the next committed decisions lose their
	// LockGrant writes (FaultMirrorLost).
	mirrorLost int
	// restores counts the backups restored so far.
	restores int
}

// snapshot is a backup of the registry's backend (and the oracle's view of
// it, so that the oracle follows a restore exactly as the backend does).
type snapshot struct {
	at     time.Time
	fr     *locksv1.FencedResource
	grants []locksv1.LockGrant
	oracle oracleRegistry
}

func newRegistry(w *world) *registry {
	r := &registry{w: w, signer: issuerKey(), epoch: 1, takeoverAt: w.now, lastSnapshot: w.now, claims: map[string]*coordinationv1.Lease{}}
	r.fr = locksv1.FencedResource{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: resourceName, UID: "fr-uid", Generation: 1},
		Spec: locksv1.FencedResourceSpec{
			ResourceID:           resourceID,
			Target:               &locksv1.ObjectTarget{APIVersion: "v1", Kind: "ConfigMap", Name: objectName},
			LeaseDurationSeconds: leaseSeconds,
			Enforcement:          locksv1.EnforcementEnforce,
		},
	}
	r.frWritten()
	r.bundleChanged()
	return r
}

func (r *registry) revision() string {
	r.rv++
	return strconv.FormatInt(r.rv, 10)
}

func (r *registry) frWritten() { r.fr.ResourceVersion = r.revision() }

func (r *registry) bundleChanged() {
	r.revision()
	r.bundleRV = r.rv
	r.bundleData = grant.NewTrustBundle(r.revokedBelow, r.signer).Data()
}

func (r *registry) find(name string) *locksv1.LockGrant {
	for i := range r.grants {
		if r.grants[i].Name == name {
			return &r.grants[i]
		}
	}
	return nil
}

// serve answers a client's LockGrant request.
func (r *registry) serve(req *request) *reply {
	rp := &reply{req: req}
	switch req.kind {
	case reqCreateGrant:
		name := locksv1.LockGrantName(req.spec.Resource, req.spec.Owner, req.spec.RequestID)
		if r.find(name) != nil {
			rp.status = replyAlreadyExists
			break
		}
		r.uids++
		r.grants = append(r.grants, locksv1.LockGrant{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(fmt.Sprintf("lg-%d", r.uids)),
				ResourceVersion: r.revision(), CreationTimestamp: metav1.NewTime(r.w.now.Truncate(time.Second))},
			Spec: req.spec,
		})
		r.w.tracef("registry: LockGrant %s created for %s", name, req.user)
		r.reconcile()
		rp.grant = r.find(name).DeepCopy()
	case reqGetGrant:
		if lg := r.find(req.grantName); lg != nil {
			rp.grant = lg.DeepCopy()
		} else {
			rp.status = replyNotFound
		}
	case reqRenew, reqRelease:
		lg := r.find(req.grantName)
		if lg == nil {
			rp.status = replyNotFound
			break
		}
		switch {
		case req.kind == reqRenew && req.renewals > lg.Spec.Renewals: // spec.renewals may only grow
			lg.Spec.Renewals = req.renewals
		case req.kind == reqRelease && !lg.Spec.Release:
			lg.Spec.Release = true
		default:
			rp.grant = lg.DeepCopy()
			return rp // nothing to change
		}
		lg.ResourceVersion = r.revision()
		r.w.tracef("registry: %s %s (renewals %d, release %t)", req.kind, lg.Name, lg.Spec.Renewals, lg.Spec.Release)
		r.reconcile()
		if lg = r.find(req.grantName); lg != nil {
			rp.grant = lg.DeepCopy()
		}
	}
	return rp
}

// reconcile is one run of the issuer: the real planner decides, and its
// decision is written as the reconciler writes it (status first, then the
// LockGrant statuses in the planner's order).
func (r *registry) reconcile() {
	if !r.outageUntil.IsZero() {
		return // no leader: nothing is decided until the next epoch takes over
	}
	w := r.w
	w.oracle.issuerRuns(r)
	res, err := issuer.DecideConfirmed(&issuer.Input{
		Resource: &r.fr, Grants: r.issuerCache(), Now: w.now,
		Epoch: r.epoch, TakeoverAt: r.takeoverAt, RevokedBelow: r.revokedBelow, Signer: r.signer,
		Seen: r.seen, SeenNow: w.now, ConfirmLater: true, CreationVersion: creationVersion,
	}, r.readAroundCache)
	r.seen = issuer.Arrivals{}
	if err != nil {
		w.oracle.violation(vSimulator, "the planner failed: %v", err)
		return
	}
	if res.Superseded {
		return
	}
	from := r.fr.ResourceVersion
	if res.StatusChanged {
		r.fr.Status = res.Status
		r.frWritten()
	}
	r.seen = res.Deferred.Committed(from, r.fr.ResourceVersion)
	r.confirmLater(res)
	lost := r.mirrorLost > 0 && res.StatusChanged
	if lost {
		r.mirrorLost--
		r.seen = issuer.Arrivals{} // its memory died with it
		w.tracef("registry: the issuer died after its CAS; %d LockGrant status write(s) lost", len(res.GrantStatus))
		res.GrantStatus, res.RemoveFinalizer = nil, nil
	}
	for _, u := range res.GrantStatus {
		if lg := r.find(u.Name); lg != nil {
			lg.Status = u.Status
			lg.ResourceVersion = r.revision()
		}
	}
	for _, name := range res.RemoveFinalizer {
		if lg := r.find(name); lg != nil {
			lg.Finalizers = slices.DeleteFunc(lg.Finalizers, func(f string) bool { return f == locksv1.GrantFinalizer })
		}
	}
	r.requeueAt = time.Time{}
	switch {
	case lost: // it restarts at once, and its first decision rebuilds the mirror
		r.requeueAt = w.now.Add(time.Millisecond)
	case res.RequeueAfter > 0:
		r.requeueAt = w.now.Add(res.RequeueAfter)
	}
	w.oracle.decided(r)
	digest := ""
	if h := r.fr.Status.Holder; h != nil {
		digest = h.Digest
	}
	if digest != r.holder {
		if h := r.fr.Status.Holder; h != nil {
			w.tracef("registry: fence %d issued to %s (LockGrant %s, grant %s, epoch %d, expires +%s)", h.FenceToken, h.Owner, h.GrantName,
				short(h.Digest), h.IssuerEpoch, h.ExpiresAt.Sub(simStart).Truncate(time.Millisecond))
			w.res.GrantsIssued++
		} else {
			w.tracef("registry: no holder (fence token %d)", r.fr.Status.FenceToken)
		}
		r.holder = digest
	}
}

// creationVersion orders the LockGrants as their creations' versions do:
// their UIDs count creations (lg-N), and the issuer's watch receives each
// LockGrant created before it first sees it.
func creationVersion(uid types.UID) (uint64, bool) {
	n, err := strconv.ParseUint(strings.TrimPrefix(string(uid), "lg-"), 10, 64)
	return n, err == nil
}

// issuerCache is the issuer's view of the LockGrants: the API server's,
// except while FaultIssuerCacheLag holds older copies (of LockGrants since
// deleted too); like the operator's cache index, only the active ones
// (issuer.Active), plus the holder read around the cache when the index
// does not show it (controllers' gather).
func (r *registry) issuerCache() []locksv1.LockGrant {
	view := slices.Clone(r.grants)
	if !r.cacheLagUntil.IsZero() {
		view = slices.Clone(r.staleGrants)
		for _, lg := range r.grants {
			if !slices.ContainsFunc(view, func(s locksv1.LockGrant) bool { return s.UID == lg.UID }) {
				view = append(view, lg)
			}
		}
	}
	view = slices.DeleteFunc(view, func(lg locksv1.LockGrant) bool { return !issuer.Active(&lg) })
	if h := r.fr.Status.Holder; h != nil && !slices.ContainsFunc(view, func(lg locksv1.LockGrant) bool { return string(lg.UID) == h.GrantUID }) {
		if lg := r.find(h.GrantName); lg != nil && string(lg.UID) == h.GrantUID {
			view = append(view, *lg)
		}
	}
	return view
}

// issuerSees is the LockGrant named name as the issuer sees it, or nil.
func (r *registry) issuerSees(name string) *locksv1.LockGrant {
	view := r.issuerCache()
	if i := slices.IndexFunc(view, func(lg locksv1.LockGrant) bool { return lg.Name == name }); i >= 0 {
		return &view[i]
	}
	return nil
}

// confirmReadDelay is how long the issuer's reads confirming held-back
// arrivals take: long enough for a release or another arrival to come first.
const confirmReadDelay = 3 * time.Millisecond

// confirmLater starts the reads of the arrivals res held back, as the
// reconciler does outside its pass (controllers' confirmLater); arrivals
// held back while reads are under way are read with them.
func (r *registry) confirmLater(res issuer.Decision) {
	if len(res.Confirm) == 0 {
		return
	}
	if r.confirmAt.IsZero() {
		r.confirmAt, r.confirmSince = r.w.now.Add(confirmReadDelay), res.Deferred.Since
	} else if r.confirmSince != res.Deferred.Since {
		return // reads of another chain are under way; these are asked for again
	}
	for _, name := range res.Confirm {
		if lg := r.issuerSees(name); lg != nil && !slices.ContainsFunc(r.confirming, func(c *locksv1.LockGrant) bool { return c.UID == lg.UID }) {
			r.confirming = append(r.confirming, lg.DeepCopy())
		}
	}
}

// confirm completes the reads confirmLater started: the arrivals the API
// server shows never granted are confirmed in the chain they were asked in,
// and the issuer decides again.
func (r *registry) confirm() {
	ask, since := r.confirming, r.confirmSince
	r.confirming, r.confirmAt, r.confirmSince = nil, time.Time{}, ""
	fresh, _ := r.readAroundCache(ask)
	var never []types.UID
	for i, c := range ask {
		if fresh[i] != nil && issuer.NeverGranted(c, fresh[i]) {
			never = append(never, c.UID)
		}
	}
	r.seen = r.seen.Confirm(since, never)
	r.reconcile()
}

// readAroundCache is the issuer's uncached read of LockGrants (the
// reconciler reads them at once; here one after another, in order).
func (r *registry) readAroundCache(cached []*locksv1.LockGrant) ([]*locksv1.LockGrant, error) {
	out := make([]*locksv1.LockGrant, len(cached))
	for i, c := range cached {
		lg := r.find(c.Name)
		if lg == nil {
			continue
		}
		if !r.cacheLagUntil.IsZero() && lg.ResourceVersion != c.ResourceVersion {
			r.w.res.StaleGrantsRead++
			r.w.tracef("registry: the issuer's cache shows %s at resourceVersion %s, the API server %s", c.Name, c.ResourceVersion, lg.ResourceVersion)
		}
		out[i] = lg.DeepCopy()
	}
	return out, nil
}

// clockAdvanced runs what the passing of time triggers: a new leader after an
// outage, the reconciler's requeue, the operator, the periodic backup.
func (r *registry) clockAdvanced() {
	now := r.w.now
	if !r.outageUntil.IsZero() && !now.Before(r.outageUntil) {
		r.takeOver()
	}
	if !r.cacheLagUntil.IsZero() && !now.Before(r.cacheLagUntil) {
		// The cache catches up; its watch events reconcile.
		r.cacheLagUntil, r.staleGrants = time.Time{}, nil
		r.reconcile()
	}
	if !r.confirmAt.IsZero() && !now.Before(r.confirmAt) {
		r.confirm()
	}
	if !r.requeueAt.IsZero() && !now.Before(r.requeueAt) {
		r.reconcile()
	}
	if !r.operatorDue.IsZero() && !now.Before(r.operatorDue) {
		r.operatorDue = time.Time{}
		r.raiseFloorToObserved()
	}
	if now.Sub(r.lastSnapshot) >= snapshotEvery {
		r.takeSnapshot()
	}
}

func (r *registry) nextEvent() time.Time {
	next := time.Time{}
	for _, t := range []time.Time{r.requeueAt, r.confirmAt, r.outageUntil, r.operatorDue, r.cacheLagUntil} {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	return next
}

// takeOver starts a new issuer epoch (a new leader), above any revoked one.
func (r *registry) takeOver() {
	r.outageUntil = time.Time{}
	r.epoch = max(r.epoch+1, r.revokedBelow)
	r.takeoverAt = r.w.now
	r.seen = issuer.Arrivals{}
	r.confirming, r.confirmAt = nil, time.Time{} // the old leader's reads died with it
	r.w.tracef("registry: issuer epoch %d takes over", r.epoch)
	r.reconcile()
}

// outage stops the issuer for d; then a new epoch takes over.
func (r *registry) outage(d time.Duration) {
	if r.outageUntil.IsZero() {
		r.outageUntil = r.w.now.Add(d)
		if r.w.pub != nil {
			r.w.pub.leaderLost()
		}
	}
}

// revokeEpoch revokes every grant of the current issuer epoch through the
// trust bundle, as an operator rotating a compromised issuer does; the next
// leader then issues under a new epoch.
func (r *registry) revokeEpoch(d time.Duration) {
	r.revokedBelow = r.epoch + 1
	r.bundleChanged()
	r.w.tracef("registry: trust bundle revokedBelowEpoch=%d", r.revokedBelow)
	r.reconcile()
	r.outage(d)
}

// changeSpec applies a spec change (the generation grows).
func (r *registry) changeSpec(change func(*locksv1.FencedResourceSpec)) {
	change(&r.fr.Spec)
	r.fr.Generation++
	r.frWritten()
	r.reconcile()
}

// record is the webhook's StatusRecorder writing an observation (a
// compare-and-swap on the FencedResource status).
func (r *registry) record(o observation) {
	st := &r.fr.Status
	changed := false
	if o.highest > st.HighestObservedFence {
		r.w.oracle.observedRecorded(o.highest)
		st.HighestObservedFence, changed = o.highest, true
	}
	if o.regression != "" {
		changed = meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: locksv1.ConditionFenceRegression,
			Status: metav1.ConditionTrue, Reason: locksv1.ReasonRegressionFound, Message: o.regression, ObservedGeneration: r.fr.Generation}) || changed
	}
	if !changed {
		return
	}
	r.w.tracef("registry: webhook observation recorded (highestObservedFence %d%s)", st.HighestObservedFence, map[bool]string{true: ", FenceRegression"}[o.regression != ""])
	r.frWritten()
	r.reconcile()
	if meta.IsStatusConditionTrue(r.fr.Status.Conditions, locksv1.ConditionFenceRegression) &&
		r.fr.Spec.FenceFloor < r.fr.Status.HighestObservedFence && r.operatorDue.IsZero() {
		r.operatorDue = r.w.now.Add(time.Duration(1+r.w.rng.IntN(5)) * time.Second)
	}
}

// raiseFloorToObserved is the documented recovery from a fence regression:
// the operator raises spec.fenceFloor to the highest fence seen at the target.
func (r *registry) raiseFloorToObserved() {
	if floor := r.fr.Status.HighestObservedFence; floor > r.fr.Spec.FenceFloor {
		r.w.tracef("operator: spec.fenceFloor %d -> %d (FenceRegression)", r.fr.Spec.FenceFloor, floor)
		r.changeSpec(func(s *locksv1.FencedResourceSpec) { s.FenceFloor = floor })
	}
}

// heal ends an issuer outage at once: the faults have stopped.
func (r *registry) heal() {
	if !r.outageUntil.IsZero() || r.epoch < r.revokedBelow {
		r.takeOver()
	}
}

func (r *registry) takeSnapshot() {
	s := snapshot{at: r.w.now, fr: r.fr.DeepCopy(), oracle: r.w.oracle.reg.clone()}
	for i := range r.grants {
		s.grants = append(s.grants, *r.grants[i].DeepCopy())
	}
	r.snapshots = append(r.snapshots, s)
	if len(r.snapshots) > 4 {
		r.snapshots = r.snapshots[1:]
	}
	r.lastSnapshot = r.w.now
}

// restore puts an old backup back: the FencedResource (fence token, holder,
// spec) and the LockGrants go back in time; the issuer process, the trust
// bundle and the protected object do not.
func (r *registry) restore(s snapshot) {
	r.restores++
	r.fr = *s.fr.DeepCopy()
	r.frWritten()
	r.grants = r.grants[:0:0]
	for i := range s.grants {
		lg := *s.grants[i].DeepCopy()
		lg.ResourceVersion = r.revision()
		r.grants = append(r.grants, lg)
	}
	r.w.oracle.restored(s.oracle)
	if r.w.storeOracle != nil {
		r.w.storeOracle.registryRestored(r.fr.Status.FenceToken)
	}
	r.holder = ""
	if h := r.fr.Status.Holder; h != nil {
		r.holder = h.Digest
	}
	r.w.tracef("registry: backup of +%s restored (fence token %d, holder %s)", s.at.Sub(simStart).Truncate(time.Millisecond),
		r.fr.Status.FenceToken, holderName(r.fr.Status.Holder))
	r.reconcile()
}

func holderName(h *locksv1.Holder) string {
	if h == nil {
		return "none"
	}
	return fmt.Sprintf("%s@fence %d", h.Owner, h.FenceToken)
}

// apiReader serves the webhook's reads: the FencedResource (its linearizable
// GET) and the trust-bundle ConfigMap.
type apiReader struct{ r *registry }

var _ client.Reader = apiReader{}

func (a apiReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	switch o := obj.(type) {
	case *locksv1.FencedResource:
		if fr := a.r.storedEntry(key); fr != nil {
			fr.DeepCopyInto(o)
			return nil
		}
	case *coordinationv1.Lease:
		if c := a.r.claim(key); c != nil {
			c.DeepCopyInto(o)
			return nil
		}
	case *corev1.Namespace:
		// The webhook reads the namespace to recognise a teardown.
		if key.Name == namespace {
			*o = corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: map[string]string{locksv1.LabelEnrolledNamespace: "true"}}}
			if a.r.w.terminating {
				o.DeletionTimestamp = &metav1.Time{Time: a.r.w.now}
			}
			return nil
		}
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		if key.Name == a.r.w.webhooks.Name {
			a.r.w.webhooks.DeepCopyInto(o)
			return nil
		}
	case *corev1.ConfigMap:
		if key.Namespace == locksv1.DefaultNamespace && key.Name == locksv1.TrustBundleConfigMap {
			*o = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
				ResourceVersion: strconv.FormatInt(a.r.bundleRV, 10)}, Data: a.r.bundleData}
			return nil
		}
	}
	return apierrors.NewNotFound(schema.GroupResource{}, key.Name)
}

// List is the API server's (linearizable) list: the one FencedResource,
// whatever the selector (the webhook checks every candidate's target with a
// Get; the simulated object is always its target).
func (a apiReader) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	l, ok := list.(*locksv1.FencedResourceList)
	if !ok {
		return fmt.Errorf("the simulated API server lists only FencedResources")
	}
	l.Items = nil
	for _, fr := range a.r.storedEntries() {
		l.Items = append(l.Items, *fr.DeepCopy())
	}
	return nil
}

// storedEntry is the stored FencedResource named key, or nil.
func (r *registry) storedEntry(key client.ObjectKey) *locksv1.FencedResource {
	for _, fr := range r.storedEntries() {
		if key.Namespace == fr.Namespace && key.Name == fr.Name {
			return fr
		}
	}
	return nil
}

// claim is the target-claim Lease named key, or nil.
func (r *registry) claim(key client.ObjectKey) *coordinationv1.Lease {
	if key.Namespace != locksv1.DefaultNamespace {
		return nil
	}
	return r.claims[key.Name]
}

// storedEntries are the FencedResources the API server has stored.
func (r *registry) storedEntries() []*locksv1.FencedResource {
	var out []*locksv1.FencedResource
	if !r.frUnstored {
		out = append(out, &r.fr)
	}
	if r.twin != nil {
		out = append(out, r.twin)
	}
	return out
}

// indexReader is the webhooks' cache: its target index knows nothing while
// it lags behind the entries' creation — until indexLagUntil (the fault on
// the acceptance path, counted) or while indexBehind (entries being created).
type indexReader struct{ apiReader }

func (i indexReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	faultLag := i.r.w.now.Before(i.r.w.indexLagUntil)
	if l, ok := list.(*locksv1.FencedResourceList); ok && (faultLag || i.r.indexBehind) {
		if faultLag {
			i.r.w.res.IndexLagLookups++
		}
		l.Items = nil
		return nil
	}
	return i.apiReader.List(ctx, list, opts...)
}

// statusWriter is the webhook's client for FencedResource status: it records
// a deleted target's state (status.deletedTarget) before admitting a declared
// delete. Only Status().Update is served; the rest of client.Client is nil.
type statusWriter struct {
	client.Client
	r *registry
}

func (s statusWriter) Status() client.SubResourceWriter { return subResourceWriter(s) }

type subResourceWriter statusWriter

func (s subResourceWriter) Create(context.Context, client.Object, client.Object, ...client.SubResourceCreateOption) error {
	return fmt.Errorf("the simulated API server serves only status updates")
}

func (s subResourceWriter) Patch(context.Context, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
	return fmt.Errorf("the simulated API server serves only status updates")
}

func (s subResourceWriter) Apply(context.Context, runtime.ApplyConfiguration, ...client.SubResourceApplyOption) error {
	return fmt.Errorf("the simulated API server serves only status updates")
}

// Update is a compare-and-swap of the FencedResource's status.
func (s subResourceWriter) Update(_ context.Context, obj client.Object, _ ...client.SubResourceUpdateOption) error {
	fr, ok := obj.(*locksv1.FencedResource)
	r := s.r
	switch {
	case !ok || fr.Namespace != r.fr.Namespace || fr.Name != r.fr.Name:
		return apierrors.NewNotFound(schema.GroupResource{}, obj.GetName())
	case fr.ResourceVersion != r.fr.ResourceVersion:
		return apierrors.NewConflict(schema.GroupResource{Group: locksv1.GroupVersion.Group, Resource: "fencedresources"}, fr.Name, fmt.Errorf("resourceVersion %s is not %s", fr.ResourceVersion, r.fr.ResourceVersion))
	}
	fr.Status.DeepCopyInto(&r.fr.Status)
	r.frWritten()
	fr.ResourceVersion = r.fr.ResourceVersion
	if dt := r.fr.Status.DeletedTarget; dt != nil {
		r.w.tracef("registry: webhook records deletedTarget (fence %d segment %d grant %s)", dt.FenceToken, dt.Segment, short(dt.GrantDigest))
	}
	r.reconcile()
	return nil
}
