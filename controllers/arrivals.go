package controllers

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/fencekeeper/fencekeeper/internal/rules/issuer"
)

// deferredArrivals keeps, per FencedResource, the arrivals its last committed
// decision left out of the registry queue (issuer.QueueDelay), for the next
// decision. Losing it costs only a read: the next decision confirms them again.
type deferredArrivals struct {
	mu sync.Mutex
	by map[types.NamespacedName]issuer.Arrivals
}

func (a *deferredArrivals) get(key types.NamespacedName) issuer.Arrivals {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.by[key]
}

// set keeps what a committed decision deferred (nothing: forget).
func (a *deferredArrivals) set(key types.NamespacedName, deferred issuer.Arrivals) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(deferred.FirstSeen) == 0 {
		delete(a.by, key)
		return
	}
	if a.by == nil {
		a.by = map[types.NamespacedName]issuer.Arrivals{}
	}
	a.by[key] = deferred
}

func (a *deferredArrivals) forget(key types.NamespacedName) { a.set(key, issuer.Arrivals{}) }
