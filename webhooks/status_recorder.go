package webhooks

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
)

// maxQuarantine bounds status.quarantine (the CRD enforces the same bound).
const maxQuarantine = 16

// observation is what the acceptance point saw about one FencedResource's target.
type observation struct {
	highestFence int64 // the highest fence the target accepted (or already held)
	regression   string
	quarantine   []locksv1.QuarantineRecord
}

// StatusRecorder writes what the webhook observed into FencedResource status:
// highestObservedFence, the FenceRegression condition and quarantined attempts.
// It runs beside the admission path, never inside it: a decision never waits
// for, or depends on, a status write. Observations for one resource merge
// while they wait, so memory is bounded by the number of resources.
type StatusRecorder struct {
	Client client.Client
	Reader client.Reader

	mu      sync.Mutex
	pending map[types.NamespacedName]*observation
	wake    chan struct{}
}

// NewStatusRecorder returns a recorder; add it to the manager to run it.
func NewStatusRecorder(c client.Client, r client.Reader) *StatusRecorder {
	return &StatusRecorder{Client: c, Reader: r, pending: map[types.NamespacedName]*observation{}, wake: make(chan struct{}, 1)}
}

// NeedLeaderElection is false: every replica records what its webhook saw.
func (s *StatusRecorder) NeedLeaderElection() bool { return false }

func (s *StatusRecorder) observe(key types.NamespacedName, merge func(*observation)) {
	s.mu.Lock()
	o := s.pending[key]
	if o == nil {
		o = &observation{}
		s.pending[key] = o
	}
	merge(o)
	if len(o.quarantine) > maxQuarantine {
		o.quarantine = o.quarantine[len(o.quarantine)-maxQuarantine:]
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Start drains observations until ctx ends.
func (s *StatusRecorder) Start(ctx context.Context) error {
	log := ctrl.Log.WithName("status-recorder")
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		}
		s.mu.Lock()
		batch := s.pending
		s.pending = map[types.NamespacedName]*observation{}
		s.mu.Unlock()
		for key, o := range batch {
			if err := s.record(ctx, key, o); err != nil {
				log.Error(err, "recording observation; will retry", "fencedResource", key)
				s.observe(key, func(p *observation) { // merge back, keep nothing lost
					p.highestFence = max(p.highestFence, o.highestFence)
					if p.regression == "" {
						p.regression = o.regression
					}
					p.quarantine = append(o.quarantine, p.quarantine...)
				})
				if ctxtime.Sleep(ctx, time.Second) != nil {
					return nil
				}
			}
		}
	}
}

func (s *StatusRecorder) record(ctx context.Context, key types.NamespacedName, o *observation) error {
	for attempt := 0; attempt < 10; attempt++ {
		var fr locksv1.FencedResource
		if err := s.Reader.Get(ctx, key, &fr); err != nil {
			return client.IgnoreNotFound(err)
		}
		st := &fr.Status
		changed := false
		if o.highestFence > st.HighestObservedFence {
			st.HighestObservedFence, changed = o.highestFence, true
		}
		if o.regression != "" {
			changed = meta.SetStatusCondition(&st.Conditions, metav1.Condition{
				Type: locksv1.ConditionFenceRegression, Status: metav1.ConditionTrue, Reason: locksv1.ReasonRegressionFound,
				Message: o.regression, ObservedGeneration: fr.Generation,
			}) || changed
		}
		if len(o.quarantine) > 0 {
			st.Quarantine = append(st.Quarantine, o.quarantine...)
			if len(st.Quarantine) > maxQuarantine {
				st.Quarantine = st.Quarantine[len(st.Quarantine)-maxQuarantine:]
			}
			changed = true
		}
		if !changed {
			return nil
		}
		err := s.Client.Status().Update(ctx, &fr) // CAS: never clobbers the issuer's writes
		if !apierrors.IsConflict(err) {
			return err
		}
		if err := ctxtime.Sleep(ctx, time.Duration(attempt+1)*5*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("FencedResource %s kept changing; observation not recorded", key)
}
