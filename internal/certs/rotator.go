package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
)

// DefaultSecretName is the Secret the replicas share in the operator namespace.
const DefaultSecretName = locksv1.SelfSignedCertSecret

// The rotator reads and writes its one Secret by name; creating it cannot be
// limited by name in RBAC (the name is not known to the authorizer on create).
// +kubebuilder:rbac:groups="",namespace=fencekeeper-system,resources=secrets,verbs=get;update,resourceNames=fencekeeper-webhook-self-signed-cert
// +kubebuilder:rbac:groups="",namespace=fencekeeper-system,resources=secrets,verbs=create

// Rotator keeps the webhook serving certificate of every replica in one
// Secret: the first replica creates it (create-if-absent), every replica
// serves what it holds and patches the webhook configuration's caBundle with
// its bundle, and whichever replica first sees a renewal due writes it, with
// the Secret's resourceVersion as precondition (losers re-read).
type Rotator struct {
	// Client must be uncached: the Secret and the configuration are read by name.
	Client               client.Client
	Namespace, Name      string
	WebhookConfiguration string // "" leaves caBundles alone
	Hosts                []string
	Policy               Policy
	// Interval between syncs (reloads); Now defaults to time.Now.
	Interval time.Duration
	Now      func() time.Time

	cert   atomic.Pointer[tls.Certificate]
	bundle atomic.Pointer[[]byte]
}

// NeedLeaderElection is false: every replica serves webhooks.
func (r *Rotator) NeedLeaderElection() bool { return false }

// GetCertificate serves the certificate last loaded from the Secret (a
// tls.Config hook: replicas pick up a renewal without restart).
func (r *Rotator) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := r.cert.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("webhook serving certificate not loaded yet from the shared Secret")
}

// CABundle is the bundle last loaded (nil before the first Sync).
func (r *Rotator) CABundle() []byte {
	if b := r.bundle.Load(); b != nil {
		return *b
	}
	return nil
}

// Start syncs every Interval until ctx ends, retrying failures sooner.
func (r *Rotator) Start(ctx context.Context) error {
	log := ctrl.Log.WithName("cert-rotator")
	for {
		wait := r.Interval
		if err := r.Sync(ctx); err != nil {
			log.Error(err, "webhook certificate sync failed", "secret", r.Name)
			wait = min(wait, time.Second)
		}
		if ctxtime.Sleep(ctx, wait) != nil {
			return nil
		}
	}
}

// Sync brings the Secret up to date (at most a few steps), loads its
// certificate and patches the webhook configuration's caBundle.
func (r *Rotator) Sync(ctx context.Context) error {
	sec, err := r.ensure(ctx)
	if err != nil {
		return err
	}
	if err := r.load(sec); err != nil {
		return err
	}
	if r.WebhookConfiguration == "" {
		return nil
	}
	return r.patchCABundle(ctx)
}

func (r *Rotator) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// ensure creates the Secret if absent and applies due actions, re-reading on
// every conflict: a concurrent writer's result is then taken as it is.
func (r *Rotator) ensure(ctx context.Context) (*corev1.Secret, error) {
	key := types.NamespacedName{Namespace: r.Namespace, Name: r.Name}
	for attempt := 0; attempt < 10; attempt++ {
		sec := &corev1.Secret{}
		err := r.Client.Get(ctx, key, sec)
		if apierrors.IsNotFound(err) {
			if err := r.create(ctx); err != nil && !apierrors.IsAlreadyExists(err) {
				return nil, fmt.Errorf("create Secret %s: %w", key, err)
			}
			continue // ours or theirs: read what is there
		}
		if err != nil {
			return nil, fmt.Errorf("read Secret %s: %w", key, err)
		}
		cur := Contents{Data: sec.Data, Annotations: sec.Annotations}
		action := ActionReset
		if st, perr := Parse(cur); perr == nil {
			action = Decide(st, r.Hosts, r.now(), r.Policy)
		}
		if action == ActionNone {
			return sec, nil
		}
		next, err := Apply(cur, action, r.Hosts, r.now(), r.Policy)
		if err != nil {
			return nil, fmt.Errorf("%s of Secret %s: %w", action, key, err)
		}
		sec.Data, sec.Annotations = next.Data, next.Annotations
		// Update carries the resourceVersion read: a concurrent writer wins.
		if err := r.Client.Update(ctx, sec); err != nil && !apierrors.IsConflict(err) {
			return nil, fmt.Errorf("%s of Secret %s: %w", action, key, err)
		} else if err == nil {
			ctrl.Log.WithName("cert-rotator").Info("webhook certificate Secret updated", "secret", key.String(), "action", string(action))
		}
	}
	return nil, fmt.Errorf("Secret %s: still changing after 10 attempts", key)
}

func (r *Rotator) create(ctx context.Context) error {
	c, err := Apply(Contents{}, ActionReset, r.Hosts, r.now(), r.Policy)
	if err != nil {
		return err
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Name, Annotations: c.Annotations,
			Labels: map[string]string{"app.kubernetes.io/name": "fencekeeper", "app.kubernetes.io/component": "webhook-certificate"}},
		Type: corev1.SecretTypeTLS, Data: c.Data,
	}
	return r.Client.Create(ctx, sec)
}

func (r *Rotator) load(sec *corev1.Secret) error {
	pair, err := tls.X509KeyPair(sec.Data[KeyTLSCert], sec.Data[KeyTLSKey])
	if err != nil {
		return fmt.Errorf("Secret %s/%s: serving certificate: %w", sec.Namespace, sec.Name, err)
	}
	r.cert.Store(&pair)
	bundle := append([]byte(nil), sec.Data[KeyCABundle]...)
	r.bundle.Store(&bundle)
	return nil
}

// patchCABundle sets every webhook's caBundle to the loaded bundle (no write
// when it already is; the update's resourceVersion precondition keeps
// concurrent edits of the configuration).
func (r *Rotator) patchCABundle(ctx context.Context) error {
	var cfg admissionregistrationv1.ValidatingWebhookConfiguration
	if err := r.Client.Get(ctx, types.NamespacedName{Name: r.WebhookConfiguration}, &cfg); err != nil {
		return fmt.Errorf("read ValidatingWebhookConfiguration %s: %w", r.WebhookConfiguration, err)
	}
	bundle := r.CABundle()
	orig := cfg.DeepCopy()
	changed := false
	for i := range cfg.Webhooks {
		if !bytes.Equal(cfg.Webhooks[i].ClientConfig.CABundle, bundle) {
			cfg.Webhooks[i].ClientConfig.CABundle, changed = bundle, true
		}
	}
	if !changed {
		return nil
	}
	if err := r.Client.Patch(ctx, &cfg, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("patch caBundle of %s: %w", r.WebhookConfiguration, err)
	}
	ctrl.Log.WithName("cert-rotator").Info("patched webhook caBundle", "configuration", r.WebhookConfiguration)
	return nil
}
