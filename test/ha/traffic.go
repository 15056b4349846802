package ha

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/fencectl"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// attempt is one protected write by a holder.
type attempt struct {
	at time.Time
	ok bool
}

// traffic is what the workers did, for the checks.
type traffic struct {
	ns string

	mu         sync.Mutex
	writes     []attempt
	acked      map[string]map[string]string // ConfigMap -> key -> value, acknowledged
	fences     map[string][]fenceAt         // resource -> fences in acquisition order
	violations []string
	stale      [2]int // tried, denied by the webhook
	unfenced   [2]int
}

type fenceAt struct {
	fence int64
	at    time.Time
}

func newTraffic(ns string) *traffic {
	return &traffic{ns: ns, acked: map[string]map[string]string{}, fences: map[string][]fenceAt{}}
}

func (tr *traffic) violate(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.violations = append(tr.violations, fmt.Sprintf(format, args...))
}

// worker acquires its resource, writes two fenced segments, tries a stale
// write with its previous grant and an unfenced write, and releases; until ctx ends.
func (tr *traffic) worker(ctx context.Context, id int, cfg *rest.Config) error {
	c, err := lockclient.NewForConfig(ctx, cfg, tr.ns)
	if err != nil {
		return err
	}
	kube, err := client.New(cfg, client.Options{Scheme: locksv1.Scheme})
	if err != nil {
		return err
	}
	res := fmt.Sprintf("res-%d", id)
	prev := ""
	for iter := 0; ctx.Err() == nil; iter++ {
		if name := tr.iteration(ctx, c, kube, res, prev, iter); name != "" {
			prev = name
		}
	}
	return nil
}

// iteration is one claim; it returns the grant's name once it wrote under it.
func (tr *traffic) iteration(ctx context.Context, c *lockclient.Client, kube client.Client, res, prev string, iter int) string {
	ictx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	lock, err := c.Acquire(ictx, res, lockclient.AcquireOptions{RequestID: fmt.Sprintf("%s-%d-%d", res, iter, time.Now().UnixNano())})
	if err != nil {
		_ = ctxtime.Sleep(ctx, 200*time.Millisecond)
		return ""
	}
	defer lock.Orphan()
	tr.mu.Lock()
	tr.fences[res] = append(tr.fences[res], fenceAt{lock.Fence(), time.Now()})
	tr.mu.Unlock()
	op := lock.Operation(fmt.Sprintf("op-%d", iter))
	wrote := false
	for seg := 0; seg < 2 && ctx.Err() == nil; seg++ {
		key, val := fmt.Sprintf("i%d-s%d", iter, seg), fmt.Sprintf("fence-%d", lock.Fence())
		if !tr.commit(ictx, op, res, key, val) {
			break
		}
		wrote = true
	}
	if wrote && prev != "" {
		tr.staleWrite(ictx, kube, res, prev, iter)
		tr.unfencedWrite(ictx, kube, res, iter)
	}
	_ = lock.Release(ictx)
	if !wrote {
		return ""
	}
	return lock.Name()
}

// commit writes one segment, retrying refusals (webhook unreachable) until
// accepted, denied, or the claim's time is up. Only an acknowledged segment
// counts as written; an unknown outcome is neither.
func (tr *traffic) commit(ctx context.Context, op *lockclient.Operation, res, key, val string) bool {
	for ctx.Err() == nil {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: tr.ns, Name: res}}
		_, err := op.Commit(ctx, cm, func() error {
			if cm.Data == nil {
				cm.Data = map[string]string{}
			}
			cm.Data[key] = val
			return nil
		})
		tr.mu.Lock()
		tr.writes = append(tr.writes, attempt{time.Now(), err == nil})
		if err == nil {
			if tr.acked[res] == nil {
				tr.acked[res] = map[string]string{}
			}
			tr.acked[res][key] = val
		}
		tr.mu.Unlock()
		if err == nil {
			return true
		}
		if _, denied := lockclient.AsDenial(err); denied || errors.Is(err, lockclient.ErrMutationUnknown) {
			return false
		}
		_ = ctxtime.Sleep(ctx, 50*time.Millisecond)
	}
	return false
}

// staleWrite writes with the previous, released grant after a newer fence
// wrote the object, as kubectl fence write --unguarded does: the webhook must
// refuse it.
func (tr *traffic) staleWrite(ctx context.Context, kube client.Client, res, prev string, iter int) {
	var lg locksv1.LockGrant
	if err := kube.Get(ctx, types.NamespacedName{Namespace: tr.ns, Name: prev}, &lg); err != nil || lg.Status.Grant == nil {
		return
	}
	cm := &unstructured.Unstructured{}
	cm.SetAPIVersion("v1")
	cm.SetKind("ConfigMap")
	cm.SetNamespace(tr.ns)
	cm.SetName(res)
	_, err := fencectl.WriteUnguarded(ctx, kube, &lg, cm, fmt.Sprintf("stale-%d", iter), "", func() error {
		return unstructured.SetNestedField(cm.Object, "must not be written", "data", "stale-"+fmt.Sprint(iter))
	})
	_, denied := lockclient.AsDenial(err)
	tr.mu.Lock()
	tr.stale[0]++
	if denied {
		tr.stale[1]++
	}
	tr.mu.Unlock()
	if err == nil {
		tr.violate("stale write with %s (fence %d) to %s was accepted", prev, lg.Status.Grant.FenceToken, res)
	}
}

// unfencedWrite is a plain update without any grant: it must be refused.
func (tr *traffic) unfencedWrite(ctx context.Context, kube client.Client, res string, iter int) {
	var cm corev1.ConfigMap
	if err := kube.Get(ctx, types.NamespacedName{Namespace: tr.ns, Name: res}, &cm); err != nil {
		return
	}
	cm.Data["unfenced-"+fmt.Sprint(iter)] = "must not be written"
	err := kube.Update(ctx, &cm)
	tr.mu.Lock()
	tr.unfenced[0]++
	if err != nil && strings.Contains(err.Error(), "denied the request") {
		tr.unfenced[1]++
	}
	tr.mu.Unlock()
	if err == nil {
		tr.violate("unfenced update of %s was accepted", res)
	}
}

// refusal measures the disruption after a kill at k: refused is the span
// from the first refused write at or after k to the next accepted one (0
// if none was refused); gap is the longest time without any accepted write
// in the 30 s after k (also when no holder could write: acquisitions stall
// while no issuer leads).
func (tr *traffic) refusal(k time.Time) (refused, gap time.Duration, failed int) {
	tr.mu.Lock()
	ws := append([]attempt(nil), tr.writes...)
	tr.mu.Unlock()
	sort.Slice(ws, func(i, j int) bool { return ws[i].at.Before(ws[j].at) })
	var lastOK, firstFail time.Time
	end := k.Add(30 * time.Second)
	for _, w := range ws {
		if w.at.After(end) {
			break
		}
		if !w.ok {
			if !w.at.Before(k) {
				failed++
				if firstFail.IsZero() {
					firstFail = w.at
				}
			}
			continue
		}
		if !w.at.Before(k) {
			if !firstFail.IsZero() && refused == 0 {
				refused = w.at.Sub(firstFail)
			}
			if !lastOK.IsZero() && w.at.Sub(lastOK) > gap {
				gap = w.at.Sub(lastOK)
			}
		}
		lastOK = w.at
	}
	return refused, gap, failed
}

// allGrantedAfter: each of the workers' resources got a grant after t.
func (tr *traffic) allGrantedAfter(t time.Time, workers int) bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := 0
	for _, fs := range tr.fences {
		if len(fs) > 0 && fs[len(fs)-1].at.After(t) {
			n++
		}
	}
	return n == workers
}
