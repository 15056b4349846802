package lockclient

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// watchingClient hands out the watches the test drives and counts them.
type watchingClient struct {
	client.WithWatch
	mu      sync.Mutex
	watches []*watch.FakeWatcher
	refuse  error
	opened  chan *watch.FakeWatcher
}

func (c *watchingClient) Watch(ctx context.Context, _ client.ObjectList, _ ...client.ListOption) (watch.Interface, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refuse != nil {
		return nil, c.refuse
	}
	w := watch.NewFakeWithChanSize(8, false)
	c.watches = append(c.watches, w)
	go func() {
		<-ctx.Done()
		w.Stop()
	}()
	c.opened <- w
	return w, nil
}

func (c *watchingClient) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.watches)
}

func newWatchingClient() (*watchingClient, *Client) {
	wc := &watchingClient{WithWatch: fake.NewClientBuilder().WithScheme(locksv1.Scheme).Build(), opened: make(chan *watch.FakeWatcher, 8)}
	return wc, New(wc, "billing", "worker-a")
}

func holding(uid string) *locksv1.FencedResource {
	fr := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "batch"}}
	if uid != "" {
		fr.Status.Holder = &locksv1.Holder{GrantUID: uid}
	}
	return fr
}

func receive(t *testing.T, w *holderWait) *locksv1.FencedResource {
	t.Helper()
	select {
	case fr := <-w.held:
		return fr
	case <-w.lost:
		t.Fatal("the feed was lost")
	case <-time.After(5 * time.Second):
		t.Fatal("no holder record delivered")
	}
	return nil
}

func quiet(t *testing.T, w *holderWait) {
	t.Helper()
	select {
	case fr := <-w.held:
		t.Fatalf("delivered a record naming %s", fr.Status.Holder.GrantUID)
	case <-w.lost:
		t.Fatal("the feed was lost")
	case <-time.After(50 * time.Millisecond):
	}
}

// Waiters on one resource share one watch; each is woken only by a holder
// record naming its own LockGrant, and none is skipped for a later state.
func TestFeedSharesOneWatch(t *testing.T) {
	wc, c := newWatchingClient()
	a, leaveA := c.awaitHolder("batch", "uid-a")
	defer leaveA()
	b, leaveB := c.awaitHolder("batch", "uid-b")
	defer leaveB()
	w := <-wc.opened
	w.Add(holding(""))
	w.Modify(holding("uid-a"))
	w.Modify(holding("uid-b")) // a's record is already replaced: a must still get its own
	if fr := receive(t, a); fr.Status.Holder.GrantUID != "uid-a" {
		t.Fatalf("a got %s", fr.Status.Holder.GrantUID)
	}
	if fr := receive(t, b); fr.Status.Holder.GrantUID != "uid-b" {
		t.Fatalf("b got %s", fr.Status.Holder.GrantUID)
	}
	other, leaveOther := c.awaitHolder("batch", "uid-c")
	defer leaveOther()
	quiet(t, other)
	if n := wc.count(); n != 1 {
		t.Fatalf("%d watches for one resource", n)
	}
}

// A waiter that joins after the record naming it arrived gets it at once.
func TestFeedLateWaiter(t *testing.T) {
	wc, c := newWatchingClient()
	first, leave := c.awaitHolder("batch", "uid-a")
	w := <-wc.opened
	w.Modify(holding("uid-b"))
	quiet(t, first)
	late, leaveLate := c.awaitHolder("batch", "uid-b")
	defer leaveLate()
	leave()
	if fr := receive(t, late); fr.Status.Holder.GrantUID != "uid-b" {
		t.Fatalf("late waiter got %s", fr.Status.Holder.GrantUID)
	}
}

// The watch outlives its waiters by feedLinger, then closes; the next
// request opens a new one.
func TestFeedLingersThenCloses(t *testing.T) {
	defer func(d time.Duration) { feedLinger = d }(feedLinger)
	feedLinger = 100 * time.Millisecond
	wc, c := newWatchingClient()
	_, leave := c.awaitHolder("batch", "uid-a")
	w := <-wc.opened
	leave()
	_, leave = c.awaitHolder("batch", "uid-b") // within the linger: same watch
	leave()
	if n := wc.count(); n != 1 {
		t.Fatalf("%d watches within the linger", n)
	}
	select {
	case _, open := <-w.ResultChan():
		if open {
			t.Fatal("an event nobody sent")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch stayed open after the linger")
	}
	waitFor(t, func() bool { return feedCount(c) == 0 })
	_, leave = c.awaitHolder("batch", "uid-c")
	defer leave()
	<-wc.opened
	if n := wc.count(); n != 2 {
		t.Fatalf("%d watches after the linger, want 2", n)
	}
}

// When the API server ends a watch, the feed watches again and its waiters
// keep waiting; when it refuses one, they are told (and follow their
// LockGrant alone), and the next request tries again.
func TestFeedRewatchesAndReportsLoss(t *testing.T) {
	wc, c := newWatchingClient()
	a, leave := c.awaitHolder("batch", "uid-a")
	defer leave()
	w := <-wc.opened
	w.Stop() // the server closed it
	w2 := <-wc.opened
	w2.Add(holding("uid-a"))
	receive(t, a)

	wc.mu.Lock()
	wc.refuse = errors.New("forbidden")
	wc.mu.Unlock()
	w2.Stop()
	select {
	case <-a.lost:
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not told the registry cannot be watched")
	}
	waitFor(t, func() bool { return feedCount(c) == 0 })
	b, leaveB := c.awaitHolder("batch", "uid-b")
	defer leaveB()
	select {
	case <-b.lost:
	case <-time.After(5 * time.Second):
		t.Fatal("the next request did not try (and fail) to watch again")
	}
}

func feedCount(c *Client) int {
	c.registry.mu.Lock()
	defer c.registry.mu.Unlock()
	return len(c.registry.feeds)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met in 5 s")
}

// A record delivered just before the watch was lost is not thrown away
// (select would pick either ready case at random).
func TestFeedWaitPrefersADeliveredRecord(t *testing.T) {
	for i := 0; i < 100; i++ {
		w := &holderWait{uid: "uid-a", held: make(chan *locksv1.FencedResource, 1), lost: make(chan struct{})}
		w.held <- holding("uid-a")
		close(w.lost)
		if fr := w.wait(context.Background()); fr == nil {
			t.Fatalf("round %d: the delivered record was dropped for the loss", i)
		}
	}
	w := &holderWait{uid: "uid-a", held: make(chan *locksv1.FencedResource, 1), lost: make(chan struct{})}
	close(w.lost)
	if fr := w.wait(context.Background()); fr != nil {
		t.Fatal("a record out of nothing")
	}
}

// A release's wait on the same watch is woken by the registry's record of its
// grant's end, not by the holder record, and shares the watch with acquires.
func TestFeedDeliversTheEndRecord(t *testing.T) {
	wc, c := newWatchingClient()
	ending, leaveEnding := c.awaitEnd("batch", "uid-a")
	defer leaveEnding()
	next, leaveNext := c.awaitHolder("batch", "uid-b")
	defer leaveNext()
	w := <-wc.opened
	w.Modify(holding("uid-a"))
	quiet(t, ending)
	ended := holding("uid-b")
	ended.Status.RecentlyEnded = []locksv1.EndedGrant{{GrantUID: "uid-z", Phase: locksv1.PhaseExpired}, {GrantUID: "uid-a", Phase: locksv1.PhaseReleased}}
	w.Modify(ended)
	if fr := receive(t, ending); fr.Status.RecentlyEnded[1].GrantUID != "uid-a" {
		t.Fatalf("the end wait got %+v", fr.Status.RecentlyEnded)
	}
	if e, ok := endRecord(ended, "uid-a"); !ok || e.Phase != locksv1.PhaseReleased {
		t.Fatalf("endRecord %+v %v", e, ok)
	}
	receive(t, next)
	if n := wc.count(); n != 1 {
		t.Fatalf("%d watches for one resource", n)
	}
}
