package webhooks

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/version"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// TrustBundleSource serves the trust bundle from the fencekeeper-trust-bundle
// ConfigMap, following it: a key the operator adds during a rotation is
// trusted as soon as this replica's cache sees it, and a key it retires is
// no longer trusted, with no restart. Who may change the bundle is decided by
// the API server (the trust-anchor admission policy: only the operator's
// identity changes keys, and revokedBelowEpoch only grows), not here. A
// bundle that does not parse is not used: the last good one stays.
type TrustBundleSource struct {
	Reader client.Reader // the manager's cache: ConfigMaps of the operator namespace
	Key    types.NamespacedName

	mu     sync.Mutex
	rv     string
	bundle *grant.TrustBundle
	stored *grant.TrustBundle // bundle plus the retired keys
}

// Get returns the current bundle: the keys that authenticate grants.
func (s *TrustBundleSource) Get(ctx context.Context) (*grant.TrustBundle, error) {
	b, _, err := s.GetWithRetired(ctx)
	return b, err
}

// GetWithRetired returns the current bundle and, for judging fence state
// already stored on an object, the same bundle with the retired keys added.
func (s *TrustBundleSource) GetWithRetired(ctx context.Context) (*grant.TrustBundle, *grant.TrustBundle, error) {
	var cm corev1.ConfigMap
	if err := s.Reader.Get(ctx, s.Key, &cm); err != nil {
		return nil, nil, fmt.Errorf("trust bundle %s is not available: %w", s.Key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cm.ResourceVersion == s.rv && s.bundle != nil {
		return s.bundle, s.stored, nil
	}
	b, stored, err := parseBundle(&cm)
	if err != nil {
		if s.bundle != nil {
			ctrl.LoggerFrom(ctx).Error(err, "trust bundle is invalid; keeping the last one loaded", "configmap", s.Key)
			return s.bundle, s.stored, nil
		}
		return nil, nil, fmt.Errorf("trust bundle %s: %w", s.Key, err)
	}
	if s.bundle != nil {
		if old, cur := strings.Join(s.bundle.KeyIDs(), ","), strings.Join(b.KeyIDs(), ","); old != cur {
			ctrl.LoggerFrom(ctx).Info("trusted signing keys changed", "from", old, "to", cur)
		}
	}
	s.rv, s.bundle, s.stored = cm.ResourceVersion, b, stored
	return s.bundle, s.stored, nil
}

// parseBundle reads the bundle and its retired keys.
func parseBundle(cm *corev1.ConfigMap) (*grant.TrustBundle, *grant.TrustBundle, error) {
	b, err := grant.ParseTrustBundle(cm.Data)
	if err != nil {
		return nil, nil, err
	}
	stored := &grant.TrustBundle{Keys: maps.Clone(b.Keys), RevokedBelowEpoch: b.RevokedBelowEpoch}
	raw := cm.Annotations[locksv1.AnnotationRetiredKeys]
	if raw == "" {
		return b, stored, nil
	}
	var retired map[string]string
	if err := json.Unmarshal([]byte(raw), &retired); err != nil {
		return nil, nil, fmt.Errorf("annotation %s: %w", locksv1.AnnotationRetiredKeys, err)
	}
	retired[grant.RevokedBelowEpochKey] = "0"
	old, err := grant.ParseTrustBundle(retired)
	if err != nil {
		return nil, nil, fmt.Errorf("annotation %s: %w", locksv1.AnnotationRetiredKeys, err)
	}
	for id, k := range old.Keys {
		if _, ok := stored.Keys[id]; !ok {
			stored.Keys[id] = k
		}
	}
	return b, stored, nil
}

// VerifierReporter publishes what one webhook replica trusts: it renews the
// Lease fencekeeper-verifier-<Replica> in the operator namespace, annotated
// with the key IDs and revokedBelowEpoch of the bundle the replica's
// admission decisions use (the same TrustBundleSource). The key rotation
// waits on these reports: a new key is signed with only once every live
// verifier trusts it, and a rotation is complete only once none trusts the
// retired key any more.
type VerifierReporter struct {
	Client    client.Client // writes Leases
	Reader    client.Reader // uncached reads
	Source    *TrustBundleSource
	Namespace string
	Replica   string
	// Interval between reports; the Lease's duration is three of them.
	Interval time.Duration
}

// NeedLeaderElection is false: every replica verifies, so every replica reports.
func (r *VerifierReporter) NeedLeaderElection() bool { return false }

// Start reports until ctx ends.
func (r *VerifierReporter) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("verifier-reporter").WithValues("replica", r.Replica)
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		if err := r.Report(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "report the loaded trust bundle")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Report writes the replica's Lease once.
func (r *VerifierReporter) Report(ctx context.Context) error {
	b, err := r.Source.Get(ctx)
	if err != nil {
		return err
	}
	name := VerifierLeaseName(r.Replica)
	var lease coordinationv1.Lease
	err = r.Reader.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: name}, &lease)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("read verifier lease %s/%s: %w", r.Namespace, name, err)
	}
	create := apierrors.IsNotFound(err)
	if create {
		lease = coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: name}}
	}
	// On every write: readers list verifier Leases by this label.
	if lease.Labels == nil {
		lease.Labels = map[string]string{}
	}
	lease.Labels["app.kubernetes.io/managed-by"] = "fencekeeper"
	lease.Labels[locksv1.LabelComponent] = locksv1.ComponentVerifier
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[locksv1.AnnotationVerifierKeys] = strings.Join(b.KeyIDs(), ",")
	lease.Annotations[locksv1.AnnotationVerifierRevokedBelow] = strconv.FormatInt(b.RevokedBelowEpoch, 10)
	// The build this replica runs, for kubectl fence version: the Lease is
	// the one object every replica keeps writing, so a stale one shows too.
	build := version.Get()
	lease.Annotations[locksv1.AnnotationVersion] = build.Version
	lease.Annotations[locksv1.AnnotationCommit] = build.Commit
	now := metav1.NewMicroTime(time.Now())
	lease.Spec.HolderIdentity = ptr.To(r.Replica)
	lease.Spec.LeaseDurationSeconds = ptr.To(int32(max(1, (3*r.Interval).Round(time.Second)/time.Second)))
	lease.Spec.RenewTime = &now
	if create {
		lease.Spec.AcquireTime = &now
		return r.Client.Create(ctx, &lease)
	}
	return r.Client.Update(ctx, &lease)
}

// VerifierLeaseName is the Lease a verifier replica reports in.
func VerifierLeaseName(replica string) string {
	name := strings.ToLower(locksv1.VerifierLeasePrefix + replica)
	if len(name) > validation.DNS1123SubdomainMaxLength {
		name = name[:validation.DNS1123SubdomainMaxLength]
	}
	return strings.TrimRight(name, "-.")
}

// ReplicaName names this process among the webhook replicas: POD_NAME (the
// Deployment sets it from the downward API), else the host name.
func ReplicaName() string {
	if n := os.Getenv("POD_NAME"); n != "" {
		return n
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return "unknown"
}
