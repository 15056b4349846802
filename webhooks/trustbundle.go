package webhooks

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// TrustBundleSource serves the trust bundle from the fencekeeper-trust-bundle
// ConfigMap. The keys are pinned when first loaded: a key added to the
// ConfigMap later is not trusted until the operator restarts (rotation is a
// controlled change, not a ConfigMap edit). revokedBelowEpoch follows the
// ConfigMap.
type TrustBundleSource struct {
	Reader client.Reader // the manager's cache: ConfigMaps of the operator namespace
	Key    types.NamespacedName

	mu     sync.Mutex
	rv     string
	bundle *grant.TrustBundle
	pinned *grant.TrustBundle
}

// Get returns the current bundle.
func (s *TrustBundleSource) Get(ctx context.Context) (*grant.TrustBundle, error) {
	var cm corev1.ConfigMap
	if err := s.Reader.Get(ctx, s.Key, &cm); err != nil {
		return nil, fmt.Errorf("trust bundle %s is not available: %w", s.Key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cm.ResourceVersion == s.rv && s.bundle != nil {
		return s.bundle, nil
	}
	b, err := grant.ParseTrustBundle(cm.Data)
	if err != nil {
		return nil, fmt.Errorf("trust bundle %s: %w", s.Key, err)
	}
	if s.pinned == nil {
		s.pinned = b
	}
	s.rv, s.bundle = cm.ResourceVersion, &grant.TrustBundle{Keys: s.pinned.Keys, RevokedBelowEpoch: b.RevokedBelowEpoch}
	return s.bundle, nil
}
