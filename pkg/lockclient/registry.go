package lockclient

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// feedLinger is how long a registry watch stays open after its last waiter
// left, so that a worker acquiring the same resource again soon (a loop of
// short critical sections) opens no new watch: opening one costs the API
// server about as much as a small write. It is short because a Client has no
// Close: a watch left behind by a worker that is done holds a connection the
// API server waits for when it shuts down.
var feedLinger = 5 * time.Second

// registryFeeds shares one watch of a FencedResource among the Acquire calls
// of one Client that wait on it (one registry watch per client and resource).
type registryFeeds struct {
	mu    sync.Mutex
	feeds map[string]*registryFeed
}

// registryFeed is the watch of one FencedResource. Its fields are guarded by
// registryFeeds.mu.
type registryFeed struct {
	resource string
	waiters  map[*holderWait]struct{}
	last     *locksv1.FencedResource // the newest state the watch delivered
	linger   *time.Timer             // running while nobody waits
	cancel   context.CancelFunc
}

// holderWait is one request waiting for the holder record to name its
// LockGrant (or, with end, for the record of its grant's end). Every state
// the watch delivers is checked, so a record that names it is never skipped
// for a newer one.
type holderWait struct {
	uid  types.UID
	end  bool                         // wait for recentlyEnded to name uid, not the holder record
	held chan *locksv1.FencedResource // the first state naming uid (buffer 1)
	lost chan struct{}                // closed when the registry cannot be watched
}

// matches reports whether fr has the record w waits for.
func (w *holderWait) matches(fr *locksv1.FencedResource) bool {
	if w.end {
		_, ok := endRecord(fr, w.uid)
		return ok
	}
	return namesGrant(fr, w.uid)
}

// wait returns the state naming the request once delivered; nil when the
// registry cannot be watched or ctx ends. A state delivered before the
// watch was lost still counts.
func (w *holderWait) wait(ctx context.Context) *locksv1.FencedResource {
	select {
	case fr := <-w.held:
		return fr
	case <-w.lost:
		select {
		case fr := <-w.held:
			return fr
		default:
			return nil
		}
	case <-ctx.Done():
		return nil
	}
}

// awaitHolder registers a wait for the holder record naming uid at resource,
// starting the resource's watch unless one is open, and returns the wait and
// the function that ends it (call it once, whatever the outcome).
func (c *Client) awaitHolder(resource string, uid types.UID) (*holderWait, func()) {
	return c.await(resource, &holderWait{uid: uid})
}

// awaitEnd registers a wait for the registry's record of the end of uid's
// grant (status.recentlyEnded), as awaitHolder does for its holder record.
func (c *Client) awaitEnd(resource string, uid types.UID) (*holderWait, func()) {
	return c.await(resource, &holderWait{uid: uid, end: true})
}

func (c *Client) await(resource string, w *holderWait) (*holderWait, func()) {
	w.held, w.lost = make(chan *locksv1.FencedResource, 1), make(chan struct{})
	r := &c.registry
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.feeds[resource]
	if f == nil {
		ctx, cancel := context.WithCancel(context.Background())
		f = &registryFeed{resource: resource, waiters: map[*holderWait]struct{}{}, cancel: cancel}
		if r.feeds == nil {
			r.feeds = map[string]*registryFeed{}
		}
		r.feeds[resource] = f
		go c.watchRegistry(ctx, f)
	}
	if f.linger != nil {
		f.linger.Stop() // if it fired already, retire sees this waiter and keeps the feed
		f.linger = nil
	}
	f.waiters[w] = struct{}{}
	if f.last != nil && w.matches(f.last) {
		w.held <- f.last
	}
	return w, func() { c.leaveFeed(f, w) }
}

// leaveFeed ends a wait; the feed's watch lingers for feedLinger after its
// last waiter left.
func (c *Client) leaveFeed(f *registryFeed, w *holderWait) {
	r := &c.registry
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(f.waiters, w)
	if len(f.waiters) == 0 && r.feeds[f.resource] == f && f.linger == nil {
		f.linger = time.AfterFunc(feedLinger, func() { c.retireFeed(f) })
	}
}

// retireFeed closes a feed nobody waited on for feedLinger.
func (c *Client) retireFeed(f *registryFeed) {
	r := &c.registry
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(f.waiters) == 0 && r.feeds[f.resource] == f {
		delete(r.feeds, f.resource)
		f.cancel()
	}
}

// watchRegistry follows one FencedResource until ctx ends or it cannot be
// watched. A watch without a resourceVersion starts with the registry as it
// is now, so no read comes before it, and each later watch (the API server
// ends them after a while) again starts from the current state: a waiter
// misses no holder record that is still current.
func (c *Client) watchRegistry(ctx context.Context, f *registryFeed) {
	defer c.dropFeed(f)
	for ctx.Err() == nil {
		w, err := c.kube.Watch(ctx, &locksv1.FencedResourceList{}, client.InNamespace(c.namespace),
			client.MatchingFields{"metadata.name": f.resource})
		if err != nil {
			return // no access (or no answer): waiters follow their LockGrant alone
		}
		for ev := range w.ResultChan() {
			fr, ok := ev.Object.(*locksv1.FencedResource)
			if !ok || ev.Type == watch.Error {
				break
			}
			c.deliver(f, fr)
		}
		w.Stop()
	}
}

// deliver hands fr to every waiter whose record it has.
func (c *Client) deliver(f *registryFeed, fr *locksv1.FencedResource) {
	r := &c.registry
	r.mu.Lock()
	defer r.mu.Unlock()
	f.last = fr
	for w := range f.waiters {
		if w.matches(fr) {
			select {
			case w.held <- fr:
			default: // it has one already
			}
		}
	}
}

// dropFeed removes a feed whose watch ended and tells its waiters; the next
// Acquire of the resource starts a new one.
func (c *Client) dropFeed(f *registryFeed) {
	r := &c.registry
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.feeds[f.resource] == f {
		delete(r.feeds, f.resource)
	}
	f.cancel()
	if f.linger != nil {
		f.linger.Stop()
	}
	for w := range f.waiters {
		close(w.lost)
	}
	f.waiters = map[*holderWait]struct{}{}
}

// namesGrant reports whether fr's holder record names the LockGrant uid.
func namesGrant(fr *locksv1.FencedResource, uid types.UID) bool {
	h := fr.Status.Holder
	return h != nil && uid != "" && h.GrantUID == string(uid)
}

// endRecord is the registry's record of the end of uid's grant, if it has one.
func endRecord(fr *locksv1.FencedResource, uid types.UID) (locksv1.EndedGrant, bool) {
	for _, e := range fr.Status.RecentlyEnded {
		if uid != "" && e.GrantUID == string(uid) {
			return e, true
		}
	}
	return locksv1.EndedGrant{}, false
}
