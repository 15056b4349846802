package controllers

import (
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// Keys inside the operator's own objects (their names are in api/v1alpha1).
const (
	signingKeyIDKey   = "keyID"
	signingKeySeedKey = "ed25519.seed"
)

// +kubebuilder:rbac:groups="",namespace=fencekeeper-system,resources=secrets,verbs=get;create;update
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=fencekeeper-system,resources=leases,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",namespace=fencekeeper-system,resources=configmaps,verbs=get;list;watch;create;update

// IssuerIdentity is the signing identity and epoch of this operator instance. It runs
// as a leader-election runnable: on becoming leader it loads (or, on first
// start, creates) the signing key and trust bundle, then increments the issuer
// epoch by compare-and-swap. Reconcilers wait for it before issuing anything.
type IssuerIdentity struct {
	client    client.Client // writes
	reader    client.Reader // uncached reads
	namespace string
	clock     clock.Clock
	log       logr.Logger

	ready chan struct{}

	mu         sync.RWMutex
	resyncs    []chan event.GenericEvent // one per controller that follows ResyncAll
	signer     *grant.Signer
	bundle     *grant.TrustBundle
	epoch      int64
	takeoverAt time.Time
}

// NewIssuerIdentity returns an identity that keeps its key, bundle and epoch in namespace.
func NewIssuerIdentity(c client.Client, reader client.Reader, namespace string, clk clock.Clock, log logr.Logger) *IssuerIdentity {
	return &IssuerIdentity{
		client: c, reader: reader, namespace: namespace, clock: clk, log: log,
		ready: make(chan struct{}),
	}
}

// NeedLeaderElection is true: only the leader issues, and taking the lead is what starts a new epoch.
func (i *IssuerIdentity) NeedLeaderElection() bool { return true }

// Start prepares the issuer and then waits for ctx to end.
func (i *IssuerIdentity) Start(ctx context.Context) error {
	signer, err := i.loadOrCreateKey(ctx)
	if err != nil {
		return err
	}
	bundle, err := i.loadOrCreateBundle(ctx, signer)
	if err != nil {
		return err
	}
	epoch, err := i.nextEpoch(ctx)
	if err != nil {
		return err
	}
	i.mu.Lock()
	i.signer, i.bundle, i.epoch, i.takeoverAt = signer, bundle, epoch, i.clock.Now()
	i.mu.Unlock()
	issuerEpoch.Set(float64(epoch))
	i.log.Info("issuer ready", "epoch", epoch, "keyID", signer.KeyID(), "revokedBelowEpoch", bundle.RevokedBelowEpoch)
	close(i.ready)
	<-ctx.Done()
	return nil
}

// Wait blocks until the issuer is ready or ctx ends.
func (i *IssuerIdentity) Wait(ctx context.Context) error {
	select {
	case <-i.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Ready reports whether Start finished; it backs the readiness probe of the leader.
func (i *IssuerIdentity) Ready() bool {
	select {
	case <-i.ready:
		return true
	default:
		return false
	}
}

type issuerState struct {
	signer       *grant.Signer
	epoch        int64
	takeoverAt   time.Time
	revokedBelow int64
}

func (i *IssuerIdentity) state() issuerState {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return issuerState{i.signer, i.epoch, i.takeoverAt, i.bundle.RevokedBelowEpoch}
}

// Epoch returns the current issuer epoch (0 before Start finished).
func (i *IssuerIdentity) Epoch() int64 {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return i.epoch
}

// switchSigner makes s the signing key and epoch the issuer epoch in one
// step, so that no grant is signed by the new key under the old epoch, nor
// by the old key under the new one (a key rotation, see keyrotation.go).
func (i *IssuerIdentity) switchSigner(s *grant.Signer, epoch int64) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.signer = s
	if epoch > i.epoch {
		i.epoch = epoch
	}
}

// SigningKeyID is the key ID new grants are signed with ("" before Start finished).
func (i *IssuerIdentity) SigningKeyID() string {
	i.mu.RLock()
	defer i.mu.RUnlock()
	if i.signer == nil {
		return ""
	}
	return i.signer.KeyID()
}

// setBundle installs a new trust bundle and reports whether the revocation epoch changed.
func (i *IssuerIdentity) setBundle(b *grant.TrustBundle) bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	changed := i.bundle == nil || i.bundle.RevokedBelowEpoch != b.RevokedBelowEpoch
	i.bundle = b
	return changed
}

// ResyncAll asks the controllers that judge by the issuer's clock to reconcile
// every FencedResource now, e.g. after the revocation epoch changed or, in
// tests, after a clock step.
func (i *IssuerIdentity) ResyncAll() {
	i.mu.RLock()
	defer i.mu.RUnlock()
	for _, ch := range i.resyncs {
		select {
		case ch <- event.GenericEvent{Object: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "resync"}}}:
		default: // one pending resync covers this one too
		}
	}
}

// resyncSource is a watch source for a controller that follows ResyncAll:
// every FencedResource (listed through c) is enqueued.
func (i *IssuerIdentity) resyncSource(c client.Reader) source.TypedSource[reconcile.Request] {
	ch := make(chan event.GenericEvent, 1)
	i.mu.Lock()
	i.resyncs = append(i.resyncs, ch)
	i.mu.Unlock()
	return source.Channel(ch, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var list locksv1.FencedResourceList
		if err := c.List(ctx, &list); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "list FencedResources for a resync")
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(list.Items))
		for _, fr := range list.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&fr)})
		}
		return reqs
	}))
}

func (i *IssuerIdentity) key(name string) types.NamespacedName {
	return types.NamespacedName{Namespace: i.namespace, Name: name}
}

// loadOrCreateKey reads the signing key, creating it on first start. When two
// instances start at once the second create fails and both use the first key.
func (i *IssuerIdentity) loadOrCreateKey(ctx context.Context) (*grant.Signer, error) {
	for attempt := 0; attempt < 3; attempt++ {
		var sec corev1.Secret
		err := i.reader.Get(ctx, i.key(locksv1.SigningKeySecret), &sec)
		if err == nil {
			s, err := grant.NewSigner(string(sec.Data[signingKeyIDKey]), sec.Data[signingKeySeedKey])
			if err != nil {
				return nil, fmt.Errorf("secret %s/%s does not hold a usable signing key (%s, %s): %w",
					i.namespace, locksv1.SigningKeySecret, signingKeyIDKey, signingKeySeedKey, err)
			}
			return s, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("read signing key secret %s/%s: %w", i.namespace, locksv1.SigningKeySecret, err)
		}
		s, err := grant.GenerateSigner(rand.Reader)
		if err != nil {
			return nil, err
		}
		sec = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: i.namespace, Name: locksv1.SigningKeySecret,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "fencekeeper"}},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{signingKeyIDKey: []byte(s.KeyID()), signingKeySeedKey: s.Seed()},
		}
		err = i.client.Create(ctx, &sec)
		if err == nil {
			i.log.Info("created signing key", "secret", locksv1.SigningKeySecret, "keyID", s.KeyID())
			return s, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create signing key secret %s/%s: %w", i.namespace, locksv1.SigningKeySecret, err)
		}
	}
	return nil, fmt.Errorf("signing key secret %s/%s keeps changing; giving up", i.namespace, locksv1.SigningKeySecret)
}

// loadOrCreateBundle reads the trust bundle, creating it with the signing key
// on first start. An existing bundle that does not trust the signing key is an
// error: adding keys is a rotation, which is an audited change made by a human.
func (i *IssuerIdentity) loadOrCreateBundle(ctx context.Context, s *grant.Signer) (*grant.TrustBundle, error) {
	for attempt := 0; attempt < 3; attempt++ {
		var cm corev1.ConfigMap
		err := i.reader.Get(ctx, i.key(locksv1.TrustBundleConfigMap), &cm)
		if err == nil {
			b, err := grant.ParseTrustBundle(cm.Data)
			if err != nil {
				return nil, fmt.Errorf("configmap %s/%s: %w", i.namespace, locksv1.TrustBundleConfigMap, err)
			}
			if pub, ok := b.Keys[s.KeyID()]; !ok || !pub.Equal(s.PublicKey()) {
				return nil, fmt.Errorf("trust bundle %s/%s does not contain signing key %q; add its public key through your key-rotation process",
					i.namespace, locksv1.TrustBundleConfigMap, s.KeyID())
			}
			return b, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("read trust bundle %s/%s: %w", i.namespace, locksv1.TrustBundleConfigMap, err)
		}
		b := grant.NewTrustBundle(0, s)
		cm = corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: i.namespace, Name: locksv1.TrustBundleConfigMap,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "fencekeeper"}},
			Data: b.Data(),
		}
		err = i.client.Create(ctx, &cm)
		if err == nil {
			i.log.Info("created trust bundle", "configmap", locksv1.TrustBundleConfigMap, "keyID", s.KeyID())
			return b, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create trust bundle %s/%s: %w", i.namespace, locksv1.TrustBundleConfigMap, err)
		}
	}
	return nil, fmt.Errorf("trust bundle %s/%s keeps changing; giving up", i.namespace, locksv1.TrustBundleConfigMap)
}

// nextEpoch increments the persisted issuer epoch by compare-and-swap and returns the new value.
func (i *IssuerIdentity) nextEpoch(ctx context.Context) (int64, error) {
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		var cm corev1.ConfigMap
		err := i.reader.Get(ctx, i.key(locksv1.IssuerEpochConfigMap), &cm)
		switch {
		case apierrors.IsNotFound(err):
			cm = corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: i.namespace, Name: locksv1.IssuerEpochConfigMap,
					Labels: map[string]string{"app.kubernetes.io/managed-by": "fencekeeper"}},
				Data: map[string]string{locksv1.IssuerEpochDataKey: "1"},
			}
			if err := i.client.Create(ctx, &cm); err == nil {
				return 1, nil
			} else if !apierrors.IsAlreadyExists(err) {
				return 0, fmt.Errorf("create issuer epoch %s/%s: %w", i.namespace, locksv1.IssuerEpochConfigMap, err)
			}
		case err != nil:
			return 0, fmt.Errorf("read issuer epoch %s/%s: %w", i.namespace, locksv1.IssuerEpochConfigMap, err)
		default:
			cur, err := strconv.ParseInt(cm.Data[locksv1.IssuerEpochDataKey], 10, 64)
			if err != nil || cur < 0 {
				return 0, fmt.Errorf("configmap %s/%s: %s=%q is not a non-negative integer",
					i.namespace, locksv1.IssuerEpochConfigMap, locksv1.IssuerEpochDataKey, cm.Data[locksv1.IssuerEpochDataKey])
			}
			cm.Data[locksv1.IssuerEpochDataKey] = strconv.FormatInt(cur+1, 10)
			if err := i.client.Update(ctx, &cm); err == nil { // resourceVersion precondition
				return cur + 1, nil
			} else if !apierrors.IsConflict(err) {
				return 0, fmt.Errorf("increment issuer epoch %s/%s: %w", i.namespace, locksv1.IssuerEpochConfigMap, err)
			}
		}
	}
}
