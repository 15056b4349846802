package webhooks

import (
	"context"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
)

// The name is the one config/default gives the configuration (namePrefix fencekeeper-).
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,verbs=get;patch,resourceNames=fencekeeper-validating-webhook-configuration

// CABundlePatcher points a ValidatingWebhookConfiguration at a self-generated
// CA (local control planes without cert-manager). It retries until the
// configuration exists, then patches every webhook's caBundle once.
type CABundlePatcher struct {
	// Client must be uncached: RBAC grants get and patch of the one configuration only.
	Client   client.Client
	Name     string
	CABundle []byte
}

// NeedLeaderElection is false: the webhook must work before and without leadership.
func (p *CABundlePatcher) NeedLeaderElection() bool { return false }

// Start patches, retrying every second until it succeeds or ctx ends.
func (p *CABundlePatcher) Start(ctx context.Context) error {
	log := ctrl.Log.WithName("cabundle")
	for {
		err := p.patch(ctx)
		if err == nil {
			log.Info("patched webhook caBundle", "configuration", p.Name)
			return nil
		}
		log.V(1).Info("webhook configuration not patched yet", "configuration", p.Name, "error", err.Error())
		if ctxtime.Sleep(ctx, time.Second) != nil {
			return nil
		}
	}
}

func (p *CABundlePatcher) patch(ctx context.Context) error {
	var cfg admissionregistrationv1.ValidatingWebhookConfiguration
	if err := p.Client.Get(ctx, types.NamespacedName{Name: p.Name}, &cfg); err != nil {
		return err
	}
	orig := cfg.DeepCopy()
	for i := range cfg.Webhooks {
		cfg.Webhooks[i].ClientConfig.CABundle = p.CABundle
	}
	return p.Client.Patch(ctx, &cfg, client.MergeFrom(orig))
}
