package controllers

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// recordingWrites is a grantWriter's write function that records the
// LockGrants written, in order, and can hold one back until released.
type recordingWrites struct {
	mu      sync.Mutex
	written []string
	hold    map[string]chan struct{}
	held    chan string // the held writes, as they start
	fail    map[string]error
}

func (r *recordingWrites) write(_ context.Context, g grantWrites) error {
	r.mu.Lock()
	gate, err := r.hold[g.lg.Name], r.fail[g.lg.Name]
	r.mu.Unlock()
	if gate != nil {
		r.held <- g.lg.Name
		<-gate
	}
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.written = append(r.written, g.lg.Name)
	r.mu.Unlock()
	return nil
}

func (r *recordingWrites) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.written)
}

func writesTo(names ...string) []grantWrites {
	out := make([]grantWrites, len(names))
	for i, n := range names {
		lg := &locksv1.LockGrant{}
		lg.Name = n
		out[i] = grantWrites{lg: lg, writes: []grantWrite{{removesFinalizer: true}}}
	}
	return out
}

func numbered(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return out
}

func startWriter(w *grantWriter) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Start(ctx); close(done) }()
	return func() { cancel(); <-done }
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A plan's ends land before its holder, the holder before any bookkeeping,
// and a long bookkeeping is written a turn at a time, so another resource's
// writes are not held up behind it.
func TestGrantWriterOrdersAndTakesTurns(t *testing.T) {
	rec := &recordingWrites{}
	w := newGrantWriter(1, &issuerRequeue{}, rec.write)
	busy, quiet := types.NamespacedName{Namespace: "ns", Name: "busy"}, types.NamespacedName{Namespace: "ns", Name: "quiet"}
	waiters := numbered("w", bookkeepingPerPass+4)
	w.submit(busy, grantPlan{ends: writesTo("old", "short"), holder: writesTo("new"), bookkeeping: writesTo(waiters...)})
	w.submit(quiet, grantPlan{bookkeeping: writesTo("q")})
	if got := w.endsBehind(busy); got != 2 {
		t.Fatalf("endsBehind %d before any write, want 2", got)
	}
	defer startWriter(w)()
	waitFor(t, "every write", func() bool { return len(rec.got()) == 2+1+len(waiters)+1 })

	got := rec.got()
	at := func(name string) int { return slices.Index(got, name) }
	if at("new") < at("old") || at("new") < at("short") {
		t.Fatalf("written %v: the new holder before an ended grant", got)
	}
	for _, n := range waiters {
		if at(n) < at("new") {
			t.Fatalf("written %v: bookkeeping %s before the holder", got, n)
		}
	}
	if at("q") > at(waiters[len(waiters)-1]) || at("q") < at(waiters[0]) {
		t.Fatalf("written %v: the quiet resource's write should come between the busy one's two turns", got)
	}
	if got := w.endsBehind(busy); got != 0 {
		t.Fatalf("endsBehind %d after the writes, want 0", got)
	}
}

// A newer plan replaces one not yet started (each plan holds every write still
// needed); the one in progress finishes first.
func TestGrantWriterNewerPlanReplacesWaitingOne(t *testing.T) {
	gate := make(chan struct{})
	rec := &recordingWrites{hold: map[string]chan struct{}{"first": gate}, held: make(chan string, 1)}
	w := newGrantWriter(2, &issuerRequeue{}, rec.write)
	key := types.NamespacedName{Namespace: "ns", Name: "lock"}
	w.submit(key, grantPlan{ends: writesTo("first")})
	defer startWriter(w)()
	<-rec.held
	rec.mu.Lock()
	delete(rec.hold, "first") // only its first write waits
	rec.mu.Unlock()
	w.submit(key, grantPlan{holder: writesTo("stale")})
	w.submit(key, grantPlan{ends: writesTo("first", "second"), holder: writesTo("third")})
	if got := w.endsBehind(key); got != 2 {
		t.Fatalf("endsBehind %d, want the newest plan's 2", got)
	}
	close(gate)
	waitFor(t, "the newest plan", func() bool { return len(rec.got()) == 4 })
	time.Sleep(20 * time.Millisecond)
	if got := rec.got(); slices.Contains(got, "stale") || got[0] != "first" || got[3] != "third" {
		t.Fatalf("written %v, want first, then the newest plan (first, second, third), never the replaced one", got)
	}
}

// A write that meets a conflict stops its plan (nothing after it is written)
// and asks the issuer to decide again.
func TestGrantWriterConflictAsksForANewDecision(t *testing.T) {
	conflict := apierrors.NewConflict(schema.GroupResource{Resource: "lockgrants"}, "old", fmt.Errorf("changed"))
	rec := &recordingWrites{fail: map[string]error{"old": conflict}}
	requeue := &issuerRequeue{}
	w := newGrantWriter(1, requeue, rec.write)
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	if err := requeue.source().Start(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: "ns", Name: "lock"}
	w.submit(key, grantPlan{ends: writesTo("old"), holder: writesTo("new"), bookkeeping: writesTo("waiter")})
	defer startWriter(w)()
	waitFor(t, "the issuer to be asked again", func() bool { return q.Len() == 1 })
	if req, _ := q.Get(); req.NamespacedName != key {
		t.Fatalf("asked for %v, want %v", req, key)
	}
	if got := rec.got(); len(got) != 0 {
		t.Fatalf("written %v after the conflict, want nothing: the new holder must wait for the ended grant", got)
	}
	if got := w.endsBehind(key); got != 0 {
		t.Fatalf("endsBehind %d, want 0: the new decision plans the ends again", got)
	}
}
