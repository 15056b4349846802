// Package demo plays the stale-owner story (docs/contract.md) on the
// embedded control plane, with the real operator, the real webhook and two
// workers using pkg/lockclient:
//
//  1. worker-a acquires a 2 s lease on the invoice batch (fence 1) and commits
//     segment 1 of its settlement;
//  2. worker-a stalls in the middle of segment 2 (a stop-the-world pause: its
//     process makes no progress and none of its requests leave) for longer than
//     the lease;
//  3. the issuer, on its own clock, expires worker-a's grant; worker-b, queued,
//     takes over with fence 2 and commits its result;
//  4. worker-a resumes: its write still carries fence 1 and is refused with
//     STALE_OWNER; worker-b's data survives;
//  5. the same incident on an invoices row of a real PostgreSQL (a
//     FencedResource naming it as a store; the operator publishes the
//     grants): worker-a pauses just before sending its next segment, and the
//     database itself refuses it with STALE_OWNER; worker-b's row survives.
//
// Run prints the timeline, the final object and the Events, and fails unless
// every expected verdict was observed. cmd/demo (make demo) and test/demo run it.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/internal/operator"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

const (
	namespace  = "billing"
	resource   = "invoice-batch-2026-07-19"
	resourceID = "invoice-batch/2026-07-19"
	leaseTTL   = 2 * time.Second
	// pauseFor is how long worker-a stalls: well past its lease.
	pauseFor = 3 * leaseTTL
)

// Main starts the embedded control plane and the operator, plays the story
// and stops everything.
func Main(ctx context.Context, out io.Writer) (err error) {
	start := time.Now()
	fmt.Fprintln(out, "Starting the embedded control plane (etcd, kube-apiserver, kube-controller-manager) and the fencekeeper operator…")
	cp, err := localcp.Start(ctx, localcp.Options{ControllerManager: true})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, cp.Stop()) }()
	op, err := cp.RunOperator(ctx, operator.Options{})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, op.Stop()) }()
	fmt.Fprintf(out, "Ready in %.1fs: the operator issues grants and its webhooks are installed.\n\n", time.Since(start).Seconds())
	return Run(ctx, out, cp)
}

// Run plays the story on a running control plane and operator.
func Run(ctx context.Context, out io.Writer, cp *localcp.ControlPlane) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	admin, err := cp.AdminClient()
	if err != nil {
		return err
	}
	s := &story{out: out, tl: &timeline{out: out, start: time.Now()}}
	if err := s.protect(ctx, admin); err != nil {
		return err
	}
	a, pauseA, err := newWorker(ctx, cp, "worker-a")
	if err != nil {
		return err
	}
	b, _, err := newWorker(ctx, cp, "worker-b")
	if err != nil {
		return err
	}

	// 1. worker-a takes the lock and commits segment 1.
	lockA, err := a.Acquire(ctx, resource, lockclient.AcquireOptions{OnStateChange: s.tl.stateLogger("worker-a")})
	if err != nil {
		return fmt.Errorf("worker-a acquire: %w", err)
	}
	defer lockA.Orphan()
	opA, cm := s.firstSegment(ctx, lockA)

	// worker-b asks for the same batch and queues behind worker-a.
	bHeld := s.acquireInBackground(ctx, b)

	// 2. worker-a stalls in the middle of segment 2, right after its guard
	// said HELD: the read of the object is the first request held back.
	pauseA.arm(pauseFor)
	s.tl.log("worker-a", "stalls", "mid-commit of segment 2 for %s (lease %s): none of its requests leave", pauseFor, leaseTTL)
	aDone := make(chan committed, 1)
	go func() {
		r, err := opA.Commit(ctx, cm.DeepCopy(), func() error {
			cm.Data["invoices-0101-0200"] = "settled by worker-a"
			return nil
		})
		aDone <- committed{r, err}
	}()

	// 3. The issuer expires worker-a; worker-b holds fence 2 and writes.
	got := <-bHeld
	if got.err != nil {
		return fmt.Errorf("worker-b acquire: %w", got.err)
	}
	lockB := got.lock
	defer lockB.Orphan()
	bData := s.takeOver(ctx, lockA, lockB)

	// 4. worker-a resumes; its write carries fence 1.
	s.staleOwnerResumes(lockA, <-aDone)

	if err := lockB.Release(ctx); err != nil {
		return fmt.Errorf("worker-b release: %w", err)
	}
	s.tl.log("worker-b", "released", "")

	if err := s.outcome(ctx, admin, bData); err != nil {
		return err
	}
	if err := s.playDatabase(ctx, admin, workers{a: a, b: b, pauseA: pauseA}); err != nil {
		return err
	}
	return s.exp.report(out)
}

// story is what the steps of Run share: where the story is told and the
// expectations it checks.
type story struct {
	out io.Writer
	tl  *timeline
	exp expectations
}

// acquired is the outcome of a worker's Acquire.
type acquired struct {
	lock *lockclient.Lock
	err  error
}

// committed is the outcome of a worker's Commit.
type committed struct {
	receipt fence.Receipt
	err     error
}

// protect creates the namespace and the FencedResource protecting the batch.
func (s *story) protect(ctx context.Context, admin client.Client) error {
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return err
	}
	fr := &locksv1.FencedResource{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: resource},
		Spec: locksv1.FencedResourceSpec{
			ResourceID: resourceID, LeaseDurationSeconds: int32(leaseTTL / time.Second), Enforcement: locksv1.EnforcementEnforce,
			Target: &locksv1.ObjectTarget{APIVersion: "v1", Kind: "ConfigMap", Name: resource},
		},
	}
	if err := admin.Create(ctx, fr); err != nil {
		return err
	}
	s.tl.log("platform", "protect", "FencedResource %s: ConfigMap %s, lease %s, Enforce", resource, resource, leaseTTL)
	return nil
}

// firstSegment checks worker-a holds fence 1 and commits segment 1 of its
// settlement; it returns the operation and the ConfigMap it wrote.
func (s *story) firstSegment(ctx context.Context, lockA *lockclient.Lock) (*lockclient.Operation, *corev1.ConfigMap) {
	s.tl.log("worker-a", "acquired", "fence=%d", lockA.Fence())
	s.exp.check("worker-a holds fence 1", lockA.Fence() == 1, "fence %d", lockA.Fence())
	opA := lockA.Operation("settle-batch-by-worker-a")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: resource}}
	r, err := opA.Commit(ctx, cm, func() error {
		cm.Data = map[string]string{"status": "settling", "invoices-0001-0100": "settled by worker-a"}
		return nil
	})
	s.tl.write("worker-a", lockA.Fence(), r.Segment, err)
	s.exp.check("worker-a segment 1 accepted", err == nil, "%v", err)
	return opA, cm
}

// acquireInBackground has worker-b ask for the batch; the lock arrives on
// the channel once worker-b holds it.
func (s *story) acquireInBackground(ctx context.Context, b *lockclient.Client) <-chan acquired {
	bHeld := make(chan acquired, 1)
	go func() {
		l, err := b.Acquire(ctx, resource, lockclient.AcquireOptions{OnStateChange: s.tl.stateLogger("worker-b")})
		bHeld <- acquired{l, err}
	}()
	return bHeld
}

// takeOver checks worker-b holds the next fence and commits its result; it
// returns the data worker-b wrote.
func (s *story) takeOver(ctx context.Context, lockA, lockB *lockclient.Lock) map[string]string {
	s.tl.log("worker-b", "acquired", "fence=%d after the issuer expired worker-a's grant", lockB.Fence())
	s.exp.check("worker-b holds fence 2 (= worker-a's + 1)", lockB.Fence() == lockA.Fence()+1, "fence %d", lockB.Fence())
	opB := lockB.Operation("settle-batch-by-worker-b")
	cmB := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: resource}}
	bData := map[string]string{"status": "settled", "invoices-0001-0100": "settled by worker-b", "invoices-0101-0200": "settled by worker-b"}
	r, err := opB.Commit(ctx, cmB, func() error {
		cmB.Data = map[string]string{}
		for k, v := range bData {
			cmB.Data[k] = v
		}
		return nil
	})
	s.tl.write("worker-b", lockB.Fence(), r.Segment, err)
	s.exp.check("worker-b segment 1 accepted", err == nil, "%v", err)
	return bData
}

// staleOwnerResumes checks worker-a's resumed write was refused with
// STALE_OWNER, its client ends in EXPIRED and its guard refuses new effects.
func (s *story) staleOwnerResumes(lockA *lockclient.Lock, resumed committed) {
	s.tl.write("worker-a", lockA.Fence(), resumed.receipt.Segment, resumed.err)
	s.exp.check("worker-a's resumed write refused with STALE_OWNER", errors.Is(resumed.err, lockclient.ErrStaleOwner), "got %v", resumed.err)
	select {
	case <-lockA.Done():
	case <-time.After(10 * time.Second):
	}
	s.exp.check("worker-a's client ends in EXPIRED", lockA.State() == lockclient.StateExpired, "state %s", lockA.State())
	guard := lockA.Guard()
	s.tl.log("worker-a", "guard", "%v: worker-a starts no new effects", guard)
	s.exp.check("worker-a's guard refuses new effects", errors.Is(guard, lockclient.ErrExpired), "guard %v", guard)
}

// outcome checks the final object holds worker-b's data and fence state,
// and prints it, its receipt log and the Events.
func (s *story) outcome(ctx context.Context, admin client.Client, bData map[string]string) error {
	final := &corev1.ConfigMap{}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: namespace, Name: resource}, final); err != nil {
		return err
	}
	s.exp.check("the final object holds worker-b's data", equal(final.Data, bData), "data %v", final.Data)
	st, err := fence.StateOf(final.Annotations[fence.AnnotationFence], final.Annotations[fence.AnnotationReceipts])
	if err != nil {
		return err
	}
	s.exp.check("the object's fence state is worker-b's (fence 2, segment 1)", st.HighestFence == 2 && st.LastSegment == 1, "fence %d segment %d", st.HighestFence, st.LastSegment)
	fmt.Fprintf(s.out, "\nFinal ConfigMap %s/%s (fence %d, segment %d):\n", namespace, resource, st.HighestFence, st.LastSegment)
	for _, k := range sortedKeys(final.Data) {
		fmt.Fprintf(s.out, "  %-20s %s\n", k, final.Data[k])
	}
	fmt.Fprintln(s.out, "Receipt log:")
	for _, rc := range st.Receipts {
		fmt.Fprintf(s.out, "  fence %d segment %d %-28s %s\n", rc.Fence, rc.Segment, rc.Operation, rc.Receipt)
	}
	return printEvents(ctx, s.out, admin, &s.exp)
}

// newWorker makes a worker user and its client; the worker can be paused.
func newWorker(ctx context.Context, cp *localcp.ControlPlane, name string) (*lockclient.Client, *pause, error) {
	u, err := cp.AddUser(name, localcp.WorkersGroup)
	if err != nil {
		return nil, nil, err
	}
	cfg := rest.CopyConfig(u.Config())
	p := &pause{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return p.wrap(rt) })
	c, err := lockclient.NewForConfig(ctx, cfg, namespace)
	return c, p, err
}

// wrap holds back the worker's API requests while it is paused; the next GET
// of a ConfigMap triggers an armed pause (the ConfigMap story's stall).
func (p *pause) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		p.hold(req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/configmaps/"))
		return rt.RoundTrip(req)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// timeline prints what happened, when, to whom.
type timeline struct {
	mu    sync.Mutex
	out   io.Writer
	start time.Time
}

func (t *timeline) log(who, what, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.out, "  +%5.2fs  %-9s %-10s %s\n", time.Since(t.start).Seconds(), who, what, fmt.Sprintf(format, args...))
}

// write logs a fenced write's verdict.
func (t *timeline) write(who string, fenceToken, segment int64, err error) {
	verdict := string(fence.Accepted)
	if d, ok := lockclient.AsDenial(err); ok {
		verdict = d.Message
	} else if err != nil {
		verdict = err.Error()
	}
	if segment == 0 {
		t.log(who, "write", "fence=%d → %s", fenceToken, verdict)
		return
	}
	t.log(who, "write", "fence=%d segment=%d → %s", fenceToken, segment, verdict)
}

// stateLogger logs the client's state changes, without the routine
// HELD ⇄ RENEWING of every renewal.
func (t *timeline) stateLogger(who string) func(lockclient.State) {
	var last lockclient.State
	return func(s lockclient.State) {
		routine := s == lockclient.StateRenewing || (s == lockclient.StateHeld && last == lockclient.StateRenewing)
		last = s
		if !routine {
			t.log(who, "state", "%s", s)
		}
	}
}

// expectations collects the story's checks.
type expectations struct {
	failed []string
	passed []string
}

func (e *expectations) check(what string, ok bool, format string, args ...any) {
	if ok {
		e.passed = append(e.passed, what)
		return
	}
	e.failed = append(e.failed, what+": "+fmt.Sprintf(format, args...))
}

func (e *expectations) report(out io.Writer) error {
	fmt.Fprintln(out, "\nExpected:")
	for _, p := range e.passed {
		fmt.Fprintf(out, "  ok    %s\n", p)
	}
	for _, f := range e.failed {
		fmt.Fprintf(out, "  FAIL  %s\n", f)
	}
	if len(e.failed) > 0 {
		return fmt.Errorf("%d of %d expectations failed", len(e.failed), len(e.failed)+len(e.passed))
	}
	fmt.Fprintln(out, "\nThe stale owner's writes were refused, at the acceptance point and by the database; worker-b's results survived.")
	return nil
}

// printEvents prints the namespace's Events in order and checks the webhook
// recorded the stale owner's denial.
func printEvents(ctx context.Context, out io.Writer, admin client.Client, exp *expectations) error {
	var events corev1.EventList
	if err := admin.List(ctx, &events, client.InNamespace(namespace)); err != nil {
		return err
	}
	sort.SliceStable(events.Items, func(i, j int) bool { return eventTime(events.Items[i]).Before(eventTime(events.Items[j])) })
	fmt.Fprintln(out, "\nEvents:")
	stale := false
	for _, e := range events.Items {
		fmt.Fprintf(out, "  %-8s %-14s %s/%s: %s\n", e.Type, e.Reason, strings.ToLower(e.InvolvedObject.Kind), e.InvolvedObject.Name, e.Message)
		// The reason is CamelCase; the note starts with the verdict code.
		stale = stale || (e.Reason == locksv1.EventReasonWriteDenied && strings.HasPrefix(e.Message, string(fence.StaleOwner)+":"))
	}
	exp.check("an Event records the STALE_OWNER denial", stale, "no such Event among %d", len(events.Items))
	return nil
}

func eventTime(e corev1.Event) time.Time {
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	if !e.LastTimestamp.IsZero() {
		return e.LastTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
